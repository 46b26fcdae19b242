"""Charts as standalone SVG (no script, no font or file from anywhere): what ``spoc report`` puts
in its HTML page and beside it as files for a ticket or a slide.

Pure functions: numbers in, SVG text out. Every text is escaped; colours are the page's own.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from spoc_tui.core.textsafe import lines_safe

W, H = 720, 360
LEFT, RIGHT, TOP, BOTTOM = 72, 24, 36, 52
PALETTE = ("#2b7bb9", "#d9822b", "#3a9a5b", "#a23e8a", "#8a6d1f", "#555555")


def escape(text: str) -> str:
    """SVG text: control characters and bidi overrides made visible, then XML-escaped."""
    return html.escape(lines_safe(text))


@dataclass(frozen=True, slots=True)
class Point:
    x: float
    y: float | None
    lo: float | None = None
    """The 95 % interval's low end (None: not bounded)."""
    hi: float | None = None


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    points: Sequence[Point]
    color: str = PALETTE[0]
    joined: bool = True


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    x_label: str
    y_label: str
    series: Sequence[Series]
    hlines: Sequence[tuple[str, float]] = ()
    """Horizontal lines (an SLA limit): label, value."""
    band: tuple[float | None, float | None] | None = None
    """A vertical band across x (the knee's 95 % interval); a None side runs to the edge."""
    vline: tuple[str, float] | None = None
    """A vertical line (the knee's estimate)."""
    log_x: bool = False
    y_fmt: str = "s"
    """``s``: seconds (shown as ms/s), ``n``: a plain number."""
    notes: Sequence[str] = field(default_factory=tuple)


def _fmt(v: float, kind: str) -> str:
    if kind == "s":
        return f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:.2f} s"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
    start = math.ceil(lo / step) * step
    out: list[float] = []
    v = start
    while v <= hi + 1e-12 and len(out) < 12:
        out.append(round(v, 12))
        v += step
    return out


def render(c: Chart) -> str:
    """The chart as one SVG document."""
    xs = [p.x for s in c.series for p in s.points]
    ys: list[float] = [v for s in c.series for p in s.points for v in (p.y, p.lo, p.hi) if v is not None]
    ys += [v for _, v in c.hlines]
    if c.band is not None:
        xs += [v for v in c.band if v is not None]
    if c.vline is not None:
        xs.append(c.vline[1])
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="20" font-size="14" font-weight="bold">{escape(c.title)}</text>',
    ]
    if not xs or not ys:
        out.append(f'<text x="{W / 2}" y="{H / 2}" text-anchor="middle" fill="#777">no figures</text></svg>')
        return "".join(out)
    log_x = c.log_x and min(xs) > 0
    x0, x1 = min(xs), max(xs)
    if log_x:
        x0, x1 = math.log(x0), math.log(x1)
    if x1 - x0 < 1e-12:
        x0, x1 = x0 - 1, x1 + 1
    pad = (x1 - x0) * 0.05
    x0, x1 = x0 - pad, x1 + pad
    y0, y1 = 0.0, max(ys) * 1.1 or 1.0
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def sx(v: float) -> float:
        u = math.log(v) if log_x else v
        return LEFT + (u - x0) / (x1 - x0) * pw

    def sy(v: float) -> float:
        return TOP + ph - (min(v, y1) - y0) / (y1 - y0) * ph

    if c.band is not None:
        a = sx(c.band[0]) if c.band[0] is not None else LEFT
        b = sx(c.band[1]) if c.band[1] is not None else LEFT + pw
        width = max(1.0, b - a)
        out.append(f'<rect x="{a:.1f}" y="{TOP}" width="{width:.1f}" height="{ph}" fill="#f2d7a6" opacity="0.6"/>')
    # axes and ticks
    out.append(f'<line x1="{LEFT}" y1="{TOP + ph}" x2="{LEFT + pw}" y2="{TOP + ph}" stroke="#333"/>')
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + ph}" stroke="#333"/>')
    for t in _ticks(y0, y1):
        y = sy(t)
        out.append(f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(_fmt(t, c.y_fmt))}</text>')
    x_ticks = sorted({p.x for s in c.series for p in s.points})
    if len(x_ticks) > 14:
        x_ticks = x_ticks[:: math.ceil(len(x_ticks) / 14)]
    for t in x_ticks:
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" y1="{TOP + ph}" x2="{x:.1f}" y2="{TOP + ph + 4}" stroke="#333"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + ph + 17}" text-anchor="middle">{escape(f"{t:g}")}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 10}" text-anchor="middle">{escape(c.x_label)}</text>')
    out.append(
        f'<text x="16" y="{TOP + ph / 2}" text-anchor="middle" transform="rotate(-90 16 {TOP + ph / 2})">'
        f"{escape(c.y_label)}</text>"
    )
    for label, v in c.hlines:
        y = sy(v)
        out.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + pw}" y2="{y:.1f}" stroke="#c0392b" stroke-dasharray="6 4"/>'
        )
        out.append(f'<text x="{LEFT + pw - 4}" y="{y - 5:.1f}" text-anchor="end" fill="#c0392b">{escape(label)}</text>')
    if c.vline is not None:
        x = sx(c.vline[1])
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + ph}" stroke="#b9770e" stroke-width="2"/>')
        out.append(f'<text x="{x + 4:.1f}" y="{TOP + 12}" fill="#b9770e">{escape(c.vline[0])}</text>')
    for s in c.series:
        pts = [(sx(p.x), sy(p.y)) for p in s.points if p.y is not None]
        if s.joined and len(pts) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in sorted(pts))
            out.append(f'<polyline points="{path}" fill="none" stroke="{s.color}" stroke-width="1.5"/>')
        for p in s.points:
            if p.y is None:
                continue
            x, y = sx(p.x), sy(p.y)
            if p.lo is not None or p.hi is not None:
                top = sy(p.hi) if p.hi is not None else TOP
                bot = sy(p.lo) if p.lo is not None else TOP + ph
                dash = "" if p.hi is not None else ' stroke-dasharray="2 2"'  # unbounded above
                out.append(f'<line x1="{x:.1f}" y1="{top:.1f}" x2="{x:.1f}" y2="{bot:.1f}" stroke="{s.color}"{dash}/>')
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{s.color}"/>')
    # legend
    lx = LEFT + 8
    for i, s in enumerate(c.series):
        ly = TOP + 14 + 15 * i
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{s.color}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly}">{escape(s.label)}</text>')
    out.append("</svg>")
    return "".join(out)
