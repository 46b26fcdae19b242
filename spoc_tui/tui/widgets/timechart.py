"""Time-series charts with axes and units, drawn in braille (2 x 4 dots per cell) over SSH.

:func:`plot` is pure (columns of values in, rows of characters out) and tested without a
terminal; :class:`TimeChart` lays out the title and legend, the y axis with its unit, the x axis
with the span, and a dashed limit line (an SLA, a power limit) that is always in range.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip

from spoc_tui.core.monitor.series import Points, columns, last_value, nice_range
from spoc_tui.tui.textual_mode import LeanRefresh, LeanStrip
from spoc_tui.tui.widgets.tables import style_of

_DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
"""Braille dot bits by (row 0..3 within the cell, column 0..1)."""

PALETTE = ("green", "cyan", "magenta", "yellow", "blue", "red", "bright_green", "bright_cyan")
MARKERS = "*+ox#%@="
"""Without colour (``NO_COLOR``) or in ASCII, each line is drawn with its own mark, named in the legend."""


@dataclass(frozen=True, slots=True)
class Line:
    label: str
    points: Points
    color: str = "green"


def plot(
    series: Sequence[Sequence[float | None]], y0: float, y1: float, width: int, height: int
) -> list[list[tuple[str, int | None]]]:
    """Each series (``2 * width`` columns of values, None for gaps) as a braille line in a
    ``width`` x ``height`` cell grid scaled to ``[y0, y1]``; each cell says which series drew in
    it last (None: empty). Consecutive columns are joined vertically so a step reads as a line."""
    dots_h = height * 4
    bits = [[0] * width for _ in range(height)]
    owner: list[list[int | None]] = [[None] * width for _ in range(height)]
    span = (y1 - y0) or 1.0

    def ydot(v: float) -> int:
        f = (v - y0) / span
        return max(0, min(dots_h - 1, round(f * (dots_h - 1))))

    for si, vals in enumerate(series):
        prev: int | None = None
        for x, v in enumerate(vals[: width * 2]):
            if v is None:
                prev = None
                continue
            d = ydot(v)
            lo, hi = (d, d) if prev is None else (min(d, prev), max(d, prev))
            cx, sub = divmod(x, 2)
            for dy in range(lo, hi + 1):
                row_from_top = dots_h - 1 - dy
                cy, r = divmod(row_from_top, 4)
                bits[cy][cx] |= _DOTS[r][sub]
                owner[cy][cx] = si
            prev = d
    return [[(chr(0x2800 + b) if b else " ", owner[y][x]) for x, b in enumerate(row)] for y, row in enumerate(bits)]


def span_text(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:g} h"
    if s >= 60:
        return f"{s / 60:g} min"
    return f"{s:g} s"


class TimeChart(LeanRefresh):
    """One chart: a title with its legend, the y axis in the chart's unit, the x axis from
    ``-span`` to ``now``; lines share one scale from 0 (or a fixed ``y_max``, like 100 %)."""

    DEFAULT_CSS = """
    TimeChart { height: 1fr; min-height: 5; width: 1fr; padding: 0 1 0 0; }
    """

    GUTTER = 7

    def __init__(
        self,
        title: str,
        fmt_value: Callable[[float], str],
        *,
        y_max: float | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.title = title
        self.fmt_value = fmt_value
        self.y_max = y_max
        self.lines: list[Line] = []
        self.limit: tuple[str, float] | None = None
        self.span_s = 300.0
        self.now = 0.0
        self.note = ""
        self._cache: tuple[object, list[Strip]] | None = None
        self._plot_key: object = None
        self._title_key: tuple[str, ...] = ()
        """The figures the title shows (the latest value of each line)."""
        self._title_strip: Strip | None = None
        """The title row as painted (None: to lay out again when next painted; a chart out of
        view never is)."""
        self._title_width = 0

    def notify_style_update(self) -> None:
        """Styles changed (a theme, a class): the cached plot holds the old ones, drop it."""
        super().notify_style_update()
        self._cache = None
        self._title_strip = None

    def show(
        self,
        lines: Sequence[Line],
        now: float,
        span_s: float,
        limit: tuple[str, float] | None = None,
        note: str = "",
    ) -> None:
        self.lines, self.span_s, self.limit, self.note = list(lines), span_s, limit, note
        # the plot moves one dot column at a time (span / dots across): between two such steps only
        # the title row's latest values change, so only that row is redrawn (eight charts redrawn
        # whole every second were a third of the monitor's CPU)
        size = self.size
        width = size.width
        dt = span_s / max(2, 2 * (width - self.GUTTER - 1)) if width else 0.0
        self.now = math.ceil(now / dt) * dt if dt > 0 else now  # every point so far is in view
        key = (size, self.now, span_s, limit, note, tuple((ln.label, ln.color) for ln in self.lines))
        shown = self._shown(width)
        if self._cache is not None and key == self._plot_key and self._cache[0] == (width, size.height):
            if shown != self._title_key:  # new figures: the title row is laid out when painted
                self._title_key = shown
                self._title_strip = None
                self.refresh(Region(0, 0, width, 1))
            return
        self._title_key = shown
        self._title_strip = None
        self._plot_key = key
        self._cache = None
        self.refresh()

    def _shown(self, width: int) -> tuple[str, ...]:
        """The title's figures: the latest value of each line, as far as the title fits in
        ``width`` (a GPU chart's title names eight GPUs; a narrow chart shows two or three)."""
        fmt = self.fmt_value
        out = []
        used = len(self.title)
        for ln in self.lines:
            if used >= width:
                break
            last = last_value(ln.points)
            figure = fmt(last) if last is not None else "n/a"
            out.append(figure)
            used += 5 + len(ln.label) + len(figure)
        return tuple(out)

    @property
    def _plain(self) -> bool:
        """Lines told apart by marks, not colour: without colour (``NO_COLOR``) or in ASCII."""
        return bool(getattr(self.app, "ascii_mode", False) or self.app.no_color) and len(self.lines) > 1

    def _title(self, width: int) -> Strip:
        """The title row: the chart's name, each line's label (in its colour, or with its mark
        without colour) with its latest value, and the limit."""
        base = self.own_style()
        plain = self._plain
        segs = [Segment(self.title, base + Style(bold=True))]
        for i, (ln, figure) in enumerate(zip(self.lines, self._title_key)):
            mark = MARKERS[i % len(MARKERS)] if plain else "━"
            segs.append(
                Segment(f"  {mark} {ln.label} {figure}" if len(self.lines) > 1 else f"  {figure}", style_of(ln.color))
            )
        if self.limit is not None and len(self._title_key) == len(self.lines):
            segs.append(Segment(f"  ╌ {self.limit[0]} {self.fmt_value(self.limit[1])}", Style(color="red")))
        return LeanStrip(segs).crop(0, width).adjust_cell_length(width, base)

    def _range(self, cols: list[list[float | None]]) -> tuple[float, float]:
        vals = [v for c in cols for v in c if v is not None]
        if self.limit is not None:
            vals.append(self.limit[1] * 1.1)
        if self.y_max is not None:
            return 0.0, max([self.y_max, *vals])
        return nice_range(min(vals, default=0.0), max(vals, default=1.0))

    def _strips(self, width: int, height: int) -> list[Strip]:
        base = self.own_style()
        dim = base + Style(dim=True)
        plain = self._plain
        strips: list[Strip] = [Strip.blank(width, base)]  # the title row is drawn on its own (render_line)
        plot_h = height - 2
        plot_w = max(1, width - self.GUTTER - 1)
        if plot_h < 1:
            return strips[:height]
        t1, t0 = self.now, self.now - self.span_s
        cols = [columns(ln.points, t0, t1, plot_w * 2) for ln in self.lines]
        lo, hi = self._range(cols)
        grid = plot(cols, lo, hi, plot_w, plot_h)
        line_styles = [style_of(ln.color) for ln in self.lines]
        limit_style = Style(color="red", dim=True)
        limit_row = None
        if self.limit is not None and hi > lo:
            limit_row = plot_h - 1 - round((self.limit[1] - lo) / (hi - lo) * (plot_h - 1))
        for y in range(plot_h):
            label = ""
            if y == 0:
                label = self.fmt_value(hi)
            elif y == plot_h - 1:
                label = self.fmt_value(lo)
            elif y == plot_h // 2 and plot_h >= 5:
                label = self.fmt_value((hi + lo) / 2)
            row = [Segment(f"{label[: self.GUTTER - 1]:>{self.GUTTER - 1}} ", dim), Segment("┤" if label else "│", dim)]
            # runs of cells drawn alike as one segment each (a segment and a style per cell were
            # most of a redraw)
            run: list[str] = []
            run_style: Style | None = None
            for ch, who in grid[y]:
                if who is None:
                    style, mark = (limit_style, "╌") if y == limit_row else (base, " ")
                else:
                    style, mark = line_styles[who], MARKERS[who % len(MARKERS)] if plain else ch
                if style is not run_style and run:
                    row.append(Segment("".join(run), run_style))
                    run = []
                run_style = style
                run.append(mark)
            if run:
                row.append(Segment("".join(run), run_style))
            strips.append(LeanStrip(row).adjust_cell_length(width, base))
        if not any(v is not None for c in cols for v in c):
            msg = self.note or "no data yet"
            mid = 1 + plot_h // 2
            strips[mid] = (
                Strip([Segment(" " * (self.GUTTER + 2), base), Segment(msg, dim)])
                .crop(0, width)
                .adjust_cell_length(width, base)
            )
        left, right = f"-{span_text(self.span_s)}", "now"
        room = max(0, plot_w - len(left) - len(right))
        axis = " " * self.GUTTER + "└" + left + " " * room + right
        strips.append(Strip([Segment(axis, dim)]).crop(0, width).adjust_cell_length(width, base))
        return strips

    def render_line(self, y: int) -> Strip:
        width, height = key = self.paint_size()
        if y == 0:
            # the title row alone does not draw the plot: a chart below the fold shows only its
            # title, and its plot is drawn when scrolled to
            if self._title_strip is None or self._title_width != width:
                self._title_strip = self._title(width)
                self._title_width = width
            return self._title_strip
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self._strips(width, height))
        strips = self._cache[1]
        return strips[y] if y < len(strips) else Strip.blank(width, self.own_style())
