"""Secrets out of everything we show or write (issue 17, item 8): one place for all outputs.

- URLs: the userinfo (``http://user:pass@host``) becomes ``***@``.
- Command lines: the value of a key-like flag (``--api-key X``, ``--api-key=X``, ``--hf-token``,
  ``--password``: a word of its name that is a key, token, secret or password) becomes ``***``;
  ``--max-num-batched-tokens`` and ``--tokenizer`` are kept.
- Free text (error messages, log lines): URLs with userinfo, ``Bearer`` tokens and
  ``sk-``-style keys are masked.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
_SECRET_WORD = re.compile(
    r"^(?:\w*key|\w*token|secrets?|secret\w*|\w*password|passwd|credentials?|auth|authorization)$", re.IGNORECASE
)
"""A word of a flag's name that makes its value a secret: ``--api-key``, ``--hf-token``,
``--secret-key``, ``--db-password``. Plurals and longer words are not (``--max-num-batched-tokens``,
``--tokenizer``, ``--tokenizer-mode``: a count and a name, which a recorded command must keep)."""


def _secret_flag(flag: str) -> bool:
    if not flag.startswith("-"):
        return False
    words = re.split(r"[-_]+", flag.lstrip("-"))
    return any(_SECRET_WORD.match(w) for w in words if w)


_USERINFO = re.compile(r"(?<=[a-zA-Z0-9+.-])://[^/\s@]+@")
"""``scheme://user:pass@`` from the scheme's last character on. Anchored on one character behind,
the search is linear on any text and the replacement a constant: a pattern that began with the
scheme itself (``[a-zA-Z][a-zA-Z0-9+.-]*://``) backtracked from every position, 23 s on 100k
letters. A scheme of digits alone (``9://u@h``, no URL) is masked too: more masked, never less."""
_BEARER = re.compile(r"(?i)(bearer\s+)(?:bearer\s+)?[^\s,;\"']+")
"""A Bearer token, and the token after a second ``Bearer`` (a key given with its scheme was sent as
``Bearer Bearer KEY``: issue 74), with a bounded pattern (linear on any text)."""
_SK = re.compile(r"\bsk-[A-Za-z0-9_-]{6,}")


def redact_url(url: str) -> str:
    """The URL without its password/userinfo (unparseable text is masked as free text)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return redact_text(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, f"{MASK}@{host}", parts.path, parts.query, parts.fragment))


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with the values of key-like flags masked (both ``--f V`` and ``--f=V``)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if _secret_flag(flag):
            if eq:
                out.append(f"{flag}={MASK}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_text(arg))
    return out


class RedactingFormatter(logging.Formatter):
    """A log formatter that masks secrets in the whole record, tracebacks included."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))


def redact_text(text: str) -> str:
    """Free text with URL userinfo, Bearer tokens and sk- keys masked, in time linear in its length."""
    if "://" in text:
        text = _USERINFO.sub("://" + MASK + "@", text)
    text = _BEARER.sub(lambda m: m.group(1) + MASK, text)
    return _SK.sub(MASK, text)


def key_error(key: str) -> str | None:
    """What makes ``key`` no bearer token a header can carry, in words that show none of it: a
    token is printable ASCII without spaces (RFC 6750's characters and more); whitespace inside
    it (a second line, a comment, a ``Bearer`` prefix) or a control character would be sent as
    raw header lines or end up in an error message (issue 74). None when it is one."""
    if any(c in "\r\n" for c in key):
        return "holds more than one line: give the key alone, on one line"
    if any(c in " \t" for c in key):
        return "holds a space inside it: give the key alone (no 'Bearer', no comment)"
    if any(not 0x21 <= ord(c) <= 0x7E for c in key):
        return "holds a control character or one outside ASCII: a key is printable ASCII"
    return None
