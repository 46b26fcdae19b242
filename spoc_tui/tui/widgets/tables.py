"""A light table for live figures: one cached line per row, only changed rows redrawn.

Textual's DataTable re-renders every cell whenever any cell changes (its row cache is keyed
on a global update count); at one refresh a second that was most of the monitor's CPU. This
table keeps a rendered :class:`Strip` per row and refreshes just the lines whose content
changed.
"""

from __future__ import annotations

from typing import ClassVar, NamedTuple, TypeVar

from rich.cells import cell_len
from rich.control import strip_control_codes
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.strip import Strip

from spoc_tui.tui.textual_mode import LeanRefresh, LeanStrip


class Styled(NamedTuple):
    """A cell of one style: what nearly every live figure is. Light where a Rich ``Text`` is not
    (a GPU table's eighty cells a second were eighty Texts built, then compared by their plain
    text, style and spans); read like one (``str()``, ``.plain``, ``.style``, ``.spans``)."""

    text: str
    style: str = ""

    def __str__(self) -> str:
        return self.text

    @property
    def plain(self) -> str:
        return self.text

    @property
    def spans(self) -> tuple[()]:
        return ()


Cell = str | Styled | Text
PAD = 2
"""Blank columns between cells."""


_STYLES: dict[str, Style] = {}


def style_of(style: str | Style) -> Style:
    """A style from its name (``"bold red"``, a colour), each string parsed once (cells, chart
    lines)."""
    if isinstance(style, Style):
        return style
    parsed = _STYLES.get(style)
    if parsed is None:
        parsed = _STYLES[style] = Style.parse(style)
    return parsed


_Name = TypeVar("_Name", str, Text)


def _keep_ends(name: _Name, width: int) -> _Name:
    """A row's name cut to ``width`` keeping both ends: 127.0.0.1:…:56513, not 127.0.0.1:565…
    (replicas differ at the end)."""
    head = (width - 1) // 2
    return name[:head] + "…" + name[len(name) - (width - 1 - head) :]


def _sig(cell: Cell) -> object:
    if isinstance(cell, Text):
        return (cell.plain, str(cell.style), tuple(cell.spans))
    return cell  # a string, or a Styled: compared as it is


class DiffTable(LeanRefresh):
    """Rows keyed stably (GPU UUID, source, metric); fed whole snapshots through :meth:`sync`."""

    DEFAULT_CSS = """
    DiffTable { height: auto; width: 1fr; }
    """

    COLUMNS: ClassVar[list[tuple[str, str, int]]] = []
    """Each column's key, header and width (0: hidden until :meth:`set_widths`)."""

    def __init__(
        self,
        columns: list[tuple[str, str, int]] | None = None,
        *,
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
        disabled: bool = False,
    ) -> None:
        """``columns``: these instead of the class's :attr:`COLUMNS`."""
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        self._columns = list(self.COLUMNS if columns is None else columns)
        self._rows: dict[str, list[Cell]] = {}
        self._sigs: dict[str, tuple[object, ...]] = {}
        self._strips: dict[str, Strip] = {}
        self._order: list[str] = []
        self._header: Strip | None = None

    def notify_style_update(self) -> None:
        """Styles changed (a theme, a class): the kept rows hold the old ones."""
        super().notify_style_update()
        self._strips.clear()
        self._header = None

    def set_widths(self, widths: dict[str, int]) -> None:
        """Resize columns by key (0 hides one); redraws everything when a width changes."""
        cols = [(k, label, widths.get(k, w)) for k, label, w in self._columns]
        if cols != self._columns:
            self._columns = cols
            self._strips.clear()
            self._header = None
            self.refresh(layout=True)

    # -- data ------------------------------------------------------------------------------
    def sync(self, rows: dict[str, list[Cell]]) -> None:
        """Show exactly ``rows`` (key -> cells), redrawing only rows that changed."""
        order = list(rows)
        changed: list[str] = []
        for key, cells in rows.items():
            sig = tuple(_sig(c) for c in cells)
            if self._sigs.get(key) != sig:
                self._sigs[key] = sig
                self._strips.pop(key, None)
                changed.append(key)
        self._rows = {k: list(v) for k, v in rows.items()}
        for gone in set(self._sigs) - set(rows):
            del self._sigs[gone]
            self._strips.pop(gone, None)
        if order != self._order:
            self._order = order
            self.refresh(layout=True)
            return
        if changed:  # one refresh for every changed row (each was a repaint request of its own)
            width = self.size.width
            self.refresh(*(Region(0, order.index(key) + 1, width, 1) for key in changed))

    def get_row(self, key: str) -> list[Cell]:
        """The cells of one row (raises KeyError for an unknown key)."""
        return self._rows[key]

    @property
    def row_count(self) -> int:
        return len(self._order)

    # -- rendering -------------------------------------------------------------------------
    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 1 + len(self._order)

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return sum(w + PAD for _, _, w in self._columns if w)

    def on_resize(self) -> None:
        self._strips.clear()
        self._header = None

    def _line(self, cells: list[Cell], base: Style) -> Strip:
        """One row as segments: a plain cell (a string, or a Text of one style, nearly every
        cell) is cut, padded and styled directly; a Text with spans of its own, or wide
        characters to cut, goes through Rich. Rich's Text layout for every cell cost ~0.3 ms a
        row, most of the monitor's repaint when eight GPU rows change each second."""
        segments = [Segment("\u00a0", base)]  # a no-break space: SVG screenshots would drop a leading blank
        gap = Segment(" " * PAD, base)
        for i, ((_, _, width), cell) in enumerate(zip(self._columns, cells)):
            if not width:
                continue
            first = i == 0
            style: str | Style
            if isinstance(cell, Styled):
                plain, style = cell
                rich = None
            elif isinstance(cell, Text):
                plain, style = cell.plain, cell.style
                rich = cell if cell.spans or "\n" in plain else None
            else:
                plain, style, rich = str(cell), "", None
            if rich is None and not plain.isprintable():
                plain = strip_control_codes(plain)  # as a Text would (a GPU's name is the exporter's)
            n = len(plain) if plain.isascii() else cell_len(plain)
            if rich is None and n > width and not plain.isascii():
                rich = Text(plain, style=style)
            if rich is not None:
                segments.extend(self._rich_cell(rich, width, base, first))
            else:
                if n > width:
                    plain = _keep_ends(plain, width) if first and width >= 5 else plain[: width - 1] + "…"
                    n = width
                segments.append(Segment(plain + " " * (width - n), base + style_of(style) if style else base))
            segments.append(gap)
        # every cell is exactly its column's width: the length is known, not measured
        length = 1 + sum(width + PAD for _, _, width in self._columns[: len(cells)] if width)
        room = self.paint_size().width
        if length < room:  # the blank to the table's right in the same strip (not a second one)
            segments.append(Segment(" " * (room - length), base))
            length = room
        return LeanStrip(segments, length).adjust_cell_length(room, base)

    def _rich_cell(self, cell: Text, width: int, base: Style, first: bool) -> list[Segment]:
        """A cell with spans of its own (or wide characters to cut), laid out by Rich."""
        t = cell.copy()
        t.no_wrap, t.overflow, t.end = True, "crop", ""
        if first and t.cell_len > width and width >= 5:
            t = _keep_ends(t, width)
        t.truncate(width, overflow="ellipsis", pad=True)
        return [Segment(s.text, base + s.style if s.style else base) for s in t.render(self.app.console, "")]

    def render_line(self, y: int) -> Strip:
        # the widget's style only for a line to draw: worked out again after every refresh, it
        # cost more than handing back a kept row
        if y == 0:
            if self._header is None:
                header: list[Cell] = [Text(label, style="bold") for _, label, _ in self._columns]
                self._header = self._line(header, self.own_style() + Style(bgcolor="grey15"))
            return self._header
        if y - 1 >= len(self._order):
            return Strip.blank(self.paint_size().width, self.own_style())
        key = self._order[y - 1]
        strip = self._strips.get(key)
        if strip is None:
            strip = self._strips[key] = self._line(self._rows[key], self.own_style())
        return strip
