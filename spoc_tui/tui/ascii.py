"""ASCII for terminals whose locale is not UTF-8 (``LANG=C``, a serial console, an old ``screen``).

htop and top fall back to ASCII there; so do we. Python itself runs in UTF-8 mode under the C
locale (PEP 538/540), so the check reads the locale the terminal was given (``LC_ALL``, else
``LC_CTYPE``, else ``LANG``), as ``nl_langinfo(CODESET)`` would under it; ``SPOC_ASCII=1`` or
``0`` decides outright. In ASCII mode every character the app draws passes through one table on
its way out (the terminal driver's writes, the F8 and test screenshots), one character for one
(the layout was measured in cells): box drawing becomes ``+-|``, blocks and braille ``#``-style
marks, arrows ``^v<>``, bullets ``o`` and ``^``, ``≤`` ``<``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from spoc_tui.tui.textual_mode import QuietDriver

_HORIZONTAL = "─━┄┅┈┉╌╍═╴╶╸╺╼╾"
_VERTICAL = "│┃┆┇┊┋╎╏║╵╷╹╻╽╿"
_BLOCKS = {"▁": "_", "▂": "_", "▃": ".", "▄": "o", "▅": "o", "▆": "O", "▇": "#", "█": "#", "▀": '"', "▌": "|"}
_OTHER = {
    "●": "o",
    "○": "o",
    "◆": "*",
    "◇": "o",
    "▲": "^",
    "▼": "v",
    "►": ">",
    "◄": "<",
    "▶": ">",
    "◀": "<",
    "↑": "^",
    "↓": "v",
    "→": ">",
    "←": "<",
    "·": ".",
    "…": "~",
    "×": "x",
    "✓": "v",
    "✗": "x",
    "≤": "<",
    "≥": ">",
    "±": "~",
    "—": "-",
    "–": "-",
    "°": "o",
    "\u00a0": " ",
}


def _table() -> dict[int, str]:
    t: dict[int, str] = {}
    for cp in range(0x2500, 0x2580):  # box drawing: corners, tees and crossings are "+"
        t[cp] = "+"
    for ch in _HORIZONTAL:
        t[ord(ch)] = "-"
    for ch in _VERTICAL:
        t[ord(ch)] = "|"
    for cp in range(0x2580, 0x25A0):  # block elements
        t[cp] = "#"
    for ch, rep in _BLOCKS.items():
        t[ord(ch)] = rep
    t[0x2800] = " "  # an empty braille cell
    for cp in range(0x2801, 0x2900):  # braille dots: a mark
        t[cp] = "."
    for ch, rep in _OTHER.items():
        t[ord(ch)] = rep
    return t


TABLE = _table()
"""One ASCII character for each: a cell stays a cell (the layout was measured in cells)."""
XML_TABLE = {**TABLE, **{cp: "&lt;" for cp, rep in TABLE.items() if rep == "<"}}
"""The same for SVG text, where a bare ``<`` would end the document's text."""


def to_ascii(text: str, xml: bool = False) -> str:
    """``text`` with every glyph the app draws in ASCII, one character each (anything else
    non-ASCII: ``?``); ``xml``: inside an SVG, ``<`` escaped."""
    out = text.translate(XML_TABLE if xml else TABLE)
    if out.isascii():
        return out
    return "".join(c if c.isascii() else "?" for c in out)


def wants_ascii(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the terminal's locale is not UTF-8 (or ``SPOC_ASCII`` says so)."""
    env = os.environ if environ is None else environ
    forced = env.get("SPOC_ASCII")
    if forced in ("0", "1"):
        return forced == "1"
    locale = env.get("LC_ALL") or env.get("LC_CTYPE") or env.get("LANG") or ""
    if not locale:
        return False  # nothing said: most terminals today are UTF-8
    codeset = locale.split(".", 1)[1].split("@", 1)[0] if "." in locale else ""
    return codeset.lower().replace("-", "") not in ("utf8",)


class AsciiDriver(QuietDriver):
    """The terminal driver, writing everything through :func:`to_ascii` (escape sequences are ASCII)."""

    def write(self, data: str) -> None:
        super().write(to_ascii(data))


class AsciiScreenshots:
    """An App mixin: its screenshots (F8, tests) in ASCII when the app draws in ASCII."""

    ascii_mode = False

    def export_screenshot(self, *args: Any, **kwargs: Any) -> str:
        svg: str = super().export_screenshot(*args, **kwargs)  # type: ignore[misc]
        return to_ascii(svg, xml=True) if self.ascii_mode else svg
