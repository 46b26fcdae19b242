"""Text from a server made safe for a terminal (issue 17, item 7).

Label values (model names, hostnames), model ids and error bodies come from the network; printed
raw, an escape sequence in one can set the terminal's title, clear the screen or write the
clipboard (OSC 52). Every control character (C0 but tab, DEL, C1) and every bidirectional
override is shown as a visible escape (``\\x1b``) instead; the text stays readable and nothing
reaches the terminal as a command. Applied where server text enters (the exposition parser, the
model list, error bodies) and again where the CLI prints an error.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    if c == 0x0A:
        return "\\n"  # as the exposition format writes it
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(text: str) -> str:
    """``text`` with every control character and bidi override escaped (visible, inert)."""
    return _UNSAFE.sub(_escape, text) if _UNSAFE.search(text) else text


def for_terminal(message: str) -> str:
    """An error message as printed: each line made safe, secrets masked."""
    from spoc_tui.core.redact import redact_text

    return "\n".join(safe(redact_text(line)) for line in message.split("\n"))
