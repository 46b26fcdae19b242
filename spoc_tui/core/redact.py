"""Secrets out of everything we show or write (issue 17, item 8): one place for all outputs.

- URLs: the userinfo (``http://user:pass@host``) becomes ``***@``.
- Command lines: the value of a key-like flag (``--api-key X``, ``--api-key=X``, ``--hf-token``,
  ``--password``, anything with key, token, secret or password in its name) becomes ``***``.
- Free text (error messages, log lines): URLs with userinfo, ``Bearer`` tokens and
  ``sk-``-style keys are masked.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
_SECRET_FLAG = re.compile(r"^--?[\w-]*(key|token|secret|password|passwd|credential)[\w-]*$", re.IGNORECASE)
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]+@")
_BEARER = re.compile(r"(?i)(bearer\s+)[^\s,;\"']+")
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
        if _SECRET_FLAG.match(flag):
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
    """Free text with URL userinfo, Bearer tokens and sk- keys masked."""
    text = _URL_USERINFO.sub(lambda m: m.group("scheme") + MASK + "@", text)
    text = _BEARER.sub(lambda m: m.group(1) + MASK, text)
    return _SK.sub(MASK, text)
