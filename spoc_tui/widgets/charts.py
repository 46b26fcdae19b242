"""Text charts drawn line by line (no plotting library; works over SSH at 80x24)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

from spoc_tui.core import fmt

BLOCKS = " ▁▂▃▄▅▆▇█"


@dataclass(frozen=True, slots=True)
class Bar:
    label: str
    value: float | None


class LimitBarChart(Widget):
    """Columns per step (one per user count) against a limit line.

    Columns over the limit are red; the limit is a dashed line at its height. The scale is
    the larger of the tallest column and 1.5 x the limit, so the line is always in view.
    """

    DEFAULT_CSS = """
    LimitBarChart { height: 9; width: 1fr; }
    """

    def __init__(self, title: str, unit_seconds: bool = True, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.title = title
        self.unit_seconds = unit_seconds
        self.bars: list[Bar] = []
        self.limit: float | None = None

    def show(self, bars: Sequence[Bar], limit: float | None) -> None:
        self.bars = list(bars)
        self.limit = limit
        self.refresh()

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 9

    def _fmt(self, v: float | None) -> str:
        return fmt.seconds(v) if self.unit_seconds else fmt.num(v)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        height = max(4, self.size.height)
        plot_h = height - 2  # title row and label row
        base = self.rich_style
        if y == 0:
            lim = f"  limit {self._fmt(self.limit)}" if self.limit is not None else ""
            return Strip([Segment(f" {self.title}{lim}", base + Style(bold=True))]).adjust_cell_length(width, base)
        values = [b.value for b in self.bars if b.value is not None]
        top = max([*values, (self.limit or 0) * 1.5, 1e-9])
        col_w = max(3, min(8, (width - 8) // max(1, len(self.bars))))
        if y == height - 1:
            segs = [Segment(" " * 7, base)]
            for b in self.bars:
                segs.append(Segment(b.label[: col_w - 1].center(col_w), base + Style(dim=True)))
            return Strip(segs).adjust_cell_length(width, base)
        row = plot_h - y  # 0 = bottom plot row
        row_lo = top * row / plot_h
        row_hi = top * (row + 1) / plot_h
        on_limit = self.limit is not None and row_lo <= self.limit < row_hi
        axis = self._fmt(row_hi) if y == 1 else ""
        segs = [Segment(f"{axis:>6} ", base + Style(dim=True))]
        for b in self.bars:
            v = b.value
            if v is None:
                cell = " " * col_w
                style = base
            else:
                frac = (v - row_lo) / (row_hi - row_lo)
                ch = BLOCKS[8] if frac >= 1 else (BLOCKS[max(0, min(8, int(frac * 8)))] if frac > 0 else " ")
                over = self.limit is not None and v > self.limit
                style = base + Style(color="red" if over else "green")
                inner = ch * (col_w - 1)
                if on_limit and ch == " ":
                    inner = "╌" * (col_w - 1)
                    style = base + Style(color="yellow")
                cell = inner + ("╌" if on_limit else " ")
            segs.append(Segment(cell, style))
        if on_limit:
            segs.append(Segment("╌" * 3 + " SLA", base + Style(color="yellow")))
        return Strip(segs).adjust_cell_length(width, base)
