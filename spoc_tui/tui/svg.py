"""Screenshots (F8, ``make screenshots``) that render right offline.

Textual's SVG asks for Fira Code from a CDN and names no usable fallback, so a renderer without
network or that font (rsvg-convert, cairosvg, an image viewer on a bastion host) draws the
terminal in a proportional font and the columns drift. Here the web-font rules are dropped and
the text asks for the generic ``monospace`` alone: some renderers (cairosvg) read only the first
name of a font list, so a list that starts with a font they lack falls back to a proportional one.
"""

from __future__ import annotations

import re
from pathlib import Path

MONO = "monospace"
_FONT_FACE = re.compile(r"@font-face\s*\{[^}]*\}\s*", re.S)
_MATRIX_FONT = re.compile(r"font-family:\s*Fira Code,\s*monospace;")


def offline_svg(svg: str) -> str:
    """The same screenshot, without web fonts, in the system's monospace font."""
    svg = _FONT_FACE.sub("", svg)
    return _MATRIX_FONT.sub(f"font-family: {MONO};", svg)


def fix_file(path: str | Path) -> None:
    p = Path(path)
    p.write_text(offline_svg(p.read_text(encoding="utf-8")), encoding="utf-8")
