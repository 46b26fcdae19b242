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


def _escape_of(c: int) -> str:
    if c == 0x0A:
        return "\\n"  # as the exposition format writes it
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


_TABLE = {
    c: _escape_of(c)
    for c in [*range(0x09), *range(0x0A, 0x20), *range(0x7F, 0xA0), 0x200E, 0x200F, *range(0x202A, 0x202F)]
    + list(range(0x2066, 0x206A))
}
"""Each unsafe character's visible escape, for ``str.translate`` (linear, in C: a Python call per
character took 0.5 s on 1 MB of escapes)."""

MAX_SHOWN = 2_000
"""The most characters of one field or message shown (a 10 MB model name is cut, and says so)."""


def clip(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` cut at ``limit`` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters)"


def safe(text: str) -> str:
    """``text`` with every control character and bidi override escaped (visible, inert)."""
    return text.translate(_TABLE) if _UNSAFE.search(text) else text


def for_terminal(message: str) -> str:
    """An error message as printed: secrets masked, cut at :data:`MAX_SHOWN` per line and 50 lines,
    each line made safe."""
    from spoc_tui.core.redact import redact_text

    lines = redact_text(message).split("\n", 50)
    if len(lines) > 50:
        lines[50:] = [f"… ({lines[50].count(chr(10)) + 1:,} more lines)"]
    return lines_safe("\n".join(lines))


def lines_safe(text: str, limit: int = MAX_SHOWN) -> str:
    """Multi-line text (a page's paragraph, a ``pre`` block): each line cut at ``limit`` and made
    safe, the line breaks kept."""
    return "\n".join(safe(clip(line, limit)) for line in text.split("\n"))
