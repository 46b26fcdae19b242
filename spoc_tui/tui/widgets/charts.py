"""Text charts drawn line by line (no plotting library; works over SSH at 80x24)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

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
    predicted: float | None = None
    """The twin's prediction at this level, drawn as a mark beside the column."""
    fitted: float | None = None
    """The knee inference's fit at this level (``━`` across the column)."""
    band: tuple[float, float] | None = None
    """The fit's 95 % band (``┊`` beside the column)."""
    in_knee: bool = False
    """The level lies inside the knee's 95 % interval (its label is marked)."""


class LimitBarChart(Widget):
    """Columns per step (one per user count) against a limit line.

    Columns over the limit are red; the limit is a dashed line at its height. The scale is
    the larger of the tallest column and 1.5 x the limit, so the line is always in view. With
    the knee inferred, the fit crosses each column (``━``) with its band beside it (``┊``),
    and the levels inside the knee's interval have bracketed labels.
    """

    DEFAULT_CSS = """
    LimitBarChart { height: 9; width: 1fr; }
    """

    def __init__(
        self, title: str, unit_seconds: bool = True, *, id: str | None = None, classes: str | None = None
    ) -> None:
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
            segs = [Segment(f" {self.title}{lim}", base + Style(bold=True))]
            if any(b.fitted is not None for b in self.bars):
                segs.append(Segment("  ━┊ fit", base + Style(color="magenta")))  # the fit and its 95 % band
            if any(b.in_knee for b in self.bars):
                segs.append(Segment("  [] knee", base + Style(color="yellow", bold=True)))
            if any(b.predicted is not None for b in self.bars):
                segs.append(Segment("  ◆ twin", base + Style(color="cyan")))
            return Strip(segs).adjust_cell_length(width, base)
        values = [v for b in self.bars for v in (b.value, b.predicted, b.fitted) if v is not None]
        top = max([*values, (self.limit or 0) * 1.5, 1e-9])
        col_w = max(3, min(8, (width - 8) // max(1, len(self.bars))))
        if y == height - 1:
            segs = [Segment(" " * 7, base)]
            for b in self.bars:
                label = b.label[: col_w - 1]
                if b.in_knee:  # inside the knee's interval: bracketed, narrowing as the search probes
                    label = f"[{label}]" if len(label) + 2 <= col_w else label
                    segs.append(Segment(label.center(col_w), base + Style(color="yellow", bold=True)))
                else:
                    segs.append(Segment(label.center(col_w), base + Style(dim=True)))
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

            def here(x: float | None) -> bool:
                top_row = row == plot_h - 1 and x is not None and x >= row_hi  # the tallest mark
                return x is not None and (row_lo <= x < row_hi or (x <= 0 and row == 0) or top_row)

            body: list[Segment] = [Segment(cell[:-1], style)]
            if here(b.fitted) and v is not None:
                # the fit across the column, at its height
                body = [Segment("━" * (col_w - 1), base + Style(color="magenta", bold=True))]
            p = b.predicted
            if here(p):
                # the twin's prediction: a mark in the column's gap, at its height
                segs += [*body, Segment("◆", base + Style(color="cyan", bold=True))]
                continue
            band = b.band
            if band is not None and v is not None and band[0] < row_hi and band[1] >= row_lo and cell[-1] == " ":
                segs += [*body, Segment("┊", base + Style(color="magenta"))]
                continue
            segs += [*body, Segment(cell[-1], style)]
        if on_limit:
            segs.append(Segment("╌" * 3 + " SLA", base + Style(color="yellow")))
        return Strip(segs).adjust_cell_length(width, base)


PointKind = Literal["pareto", "provisional", "feasible", "breaks"]
"""On the Pareto front (confirmed: no other interval reaches it); on it but not settled;
meets the SLA but dominated; misses the SLA."""


@dataclass(frozen=True, slots=True)
class PlotPoint:
    x: float
    y: float
    kind: PointKind
    label: str = ""
    x_ci: tuple[float, float] | None = None
    """The 95 % interval of x, drawn as a whisker (front members)."""
    y_ci: tuple[float, float] | None = None


_MARK = {
    "pareto": ("◆", Style(color="yellow", bold=True)),
    "provisional": ("◇", Style(color="yellow")),
    "feasible": ("●", Style(color="green")),
    "breaks": ("×", Style(color="red")),
}


class ParetoPlot(Widget):
    """Trials in objective space: x the first objective, y the second; the front joined up.

    Drawn as a character grid: confirmed Pareto-optimal configurations ◆, provisional ones ◇
    (another configuration's interval reaches past them), other trials within the SLA ●, trials
    that miss it ×; front members carry whiskers for their 95 % intervals (─ and │); a later
    point drawn on the same cell never hides a Pareto one.
    """

    DEFAULT_CSS = """
    ParetoPlot { height: 14; width: 2fr; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.points: list[PlotPoint] = []
        self.x_label = "x"
        self.y_label = "y"
        self.x_fmt: Callable[[float], str] = fmt.num
        self.y_fmt: Callable[[float], str] = fmt.seconds
        self.note = ""

    def show(
        self,
        points: Sequence[PlotPoint],
        x_label: str,
        y_label: str,
        x_fmt: Callable[[float], str] = fmt.num,
        y_fmt: Callable[[float], str] = fmt.seconds,
        note: str = "",
    ) -> None:
        self.points = list(points)
        self.x_label, self.y_label, self.x_fmt, self.y_fmt, self.note = x_label, y_label, x_fmt, y_fmt, note
        self.refresh()

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return 14

    def _grid(self, width: int, height: int) -> list[list[tuple[str, Style]]]:
        plot_w, plot_h = max(4, width - 9), max(3, height - 3)
        grid: list[list[tuple[str, Style]]] = [[(" ", Style()) for _ in range(plot_w)] for _ in range(plot_h)]
        if not self.points:
            return grid
        # the axes span the trials within the SLA (and their intervals): one that failed or missed it
        # by far (a 79 s TTFT) would squash the front into a corner; it is drawn at the edge instead
        scale = [p for p in self.points if p.kind != "breaks"] or self.points
        xs = [p.x for p in scale] + [v for p in scale if p.x_ci for v in p.x_ci if v == v]
        ys = [p.y for p in scale] + [v for p in scale if p.y_ci for v in p.y_ci if v == v]
        x0, x1 = min(xs), max(xs)
        y0, y1 = min(ys), max(ys)
        if x1 - x0 < 1e-12:
            x0, x1 = x0 * 0.9 - 1e-9, x1 * 1.1 + 1e-9
        if y1 - y0 < 1e-12:
            y0, y1 = y0 * 0.9 - 1e-9, y1 * 1.1 + 1e-9
        self._range = (x0, x1, y0, y1)

        def cell(p: tuple[float, float]) -> tuple[int, int]:
            cx = round((p[0] - x0) / (x1 - x0) * (plot_w - 1))
            cy = plot_h - 1 - round((p[1] - y0) / (y1 - y0) * (plot_h - 1))
            return max(0, min(plot_w - 1, cx)), max(0, min(plot_h - 1, cy))

        whisker = Style(color="yellow", dim=True)
        for p in self.points:
            cx, cy = cell((p.x, p.y))
            if p.x_ci is not None:
                (lx, _), (hx, _) = cell((p.x_ci[0], p.y)), cell((p.x_ci[1], p.y))
                for x in range(max(0, min(lx, hx)), min(plot_w - 1, max(lx, hx)) + 1):
                    grid[cy][x] = ("─", whisker)
            if p.y_ci is not None:
                (_, ly), (_, hy) = cell((p.x, p.y_ci[0])), cell((p.x, p.y_ci[1]))
                for yy in range(max(0, min(ly, hy)), min(plot_h - 1, max(ly, hy)) + 1):
                    grid[yy][cx] = ("┼" if grid[yy][cx][0] == "─" else "│", whisker)
        front = sorted((p for p in self.points if p.kind in ("pareto", "provisional")), key=lambda p: p.x)
        line = Style(color="yellow", dim=True)
        for a, b in zip(front, front[1:], strict=False):
            (ax, ay), (bx, by) = cell((a.x, a.y)), cell((b.x, b.y))
            steps = max(abs(bx - ax), abs(by - ay), 1)
            for i in range(1, steps):
                cx = round(ax + (bx - ax) * i / steps)
                cy = round(ay + (by - ay) * i / steps)
                if grid[cy][cx][0] == " ":
                    grid[cy][cx] = ("·", line)
        order = {"breaks": 0, "feasible": 1, "provisional": 2, "pareto": 3}
        for p in sorted(self.points, key=lambda p: order.get(p.kind, 0)):
            cx, cy = cell((p.x, p.y))
            grid[cy][cx] = _MARK.get(p.kind, _MARK["feasible"])
        return grid

    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, max(6, self.size.height)
        base = self.rich_style
        dim = base + Style(dim=True)
        if y == 0:
            text = f" {self.y_label} (better ↓) against {self.x_label} (better →)"
            return Strip([Segment(text, base + Style(bold=True))]).adjust_cell_length(width, base)
        grid = self._grid(width, height)
        plot_h = len(grid)
        if not self.points:
            msg = self.note or "no trial with figures yet"
            return Strip([Segment(f"  {msg}" if y == 2 else "", dim)]).adjust_cell_length(width, base)
        x0, x1, y0, y1 = self._range
        if 1 <= y <= plot_h:
            row = y - 1
            label = ""
            if row == 0:
                label = self.y_fmt(y1)
            elif row == plot_h - 1:
                label = self.y_fmt(y0)
            segs = [Segment(f"{label:>7} │", dim)]
            segs += [Segment(ch, base + st) for ch, st in grid[row]]
            return Strip(segs).adjust_cell_length(width, base)
        if y == plot_h + 1:
            return Strip([Segment(" " * 8 + "└" + "─" * (width - 9), dim)]).adjust_cell_length(width, base)
        if y == plot_h + 2:
            lo, hi = self.x_fmt(x0), self.x_fmt(x1)
            room = width - 9 - len(lo) - len(hi)
            legend = "  ◆ Pareto confirmed  ◇ provisional  ─│ 95 % intervals  ● within SLA  × misses SLA"
            if room <= len(legend) + 2:
                legend = "  ◆ Pareto  ◇ provisional  ● within SLA  × misses"
            mid = legend if room > len(legend) + 2 else ""
            return Strip(
                [Segment(" " * 9 + lo, dim), Segment(mid.center(max(0, room)), dim), Segment(hi, dim)]
            ).adjust_cell_length(width, base)
        return Strip([Segment(f" {self.note}", dim)] if y == plot_h + 3 and self.note else []).adjust_cell_length(
            width, base
        )
