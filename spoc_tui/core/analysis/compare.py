"""Two ramps compared (before/after a flag change or an upgrade): the knee's difference with its
interval, each common level's figures side by side with the difference's interval, and a plain
verdict: better, worse, or within noise.

Intervals of a difference come from the two 95 % intervals as independent normal ones
(half-width / 1.96 each, added in quadrature): an approximation that is honest about its inputs,
not a test of its own. A side an interval cannot bound leaves the difference open on that side.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from spoc_tui.core.confidence import Interval
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import StepSummary
from spoc_tui.core.results import RampDoc
from spoc_tui.core.textsafe import lines_safe

Outcome = Literal["better", "worse", "within noise", "not comparable"]
Z = 1.959964


@dataclass(frozen=True, slots=True)
class Difference:
    """``b - a`` with its 95 % interval."""

    name: str
    a: float | None
    b: float | None
    diff: float | None
    ci95: Interval
    higher_is_better: bool

    @property
    def verdict(self) -> Outcome:
        lo, hi = self.ci95
        if self.diff is None:
            return "not comparable"
        up = lo is not None and lo > 0
        down = hi is not None and hi < 0
        if not (up or down):
            return "within noise"
        return "better" if up == self.higher_is_better else "worse"

    def as_dict(self) -> dict[str, object]:
        return {
            "a": self.a,
            "b": self.b,
            "diff": self.diff,
            "ci95": list(self.ci95),
            "verdict": self.verdict,
        }


def difference(name: str, a: float | None, ia: Interval, b: float | None, ib: Interval, higher: bool) -> Difference:
    """``b - a`` with an interval from the two figures' 95 % intervals (independent, normal)."""
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        # a NaN or an infinity from a hand-edited file compares with nothing: not "within noise"
        return Difference(name, a, b, None, (None, None), higher)
    ia = _finite(ia)
    ib = _finite(ib)
    d = b - a

    def half(v: float, ci: Interval, side: int) -> float | None:
        end = ci[1] if side > 0 else ci[0]
        return None if end is None else abs(end - v)

    # the difference's upper end takes b's upper and a's lower half-widths, and the other way round
    up_b, lo_a = half(b, ib, 1), half(a, ia, -1)
    lo_b, up_a = half(b, ib, -1), half(a, ia, 1)
    hi = None if up_b is None or lo_a is None else d + math.hypot(up_b, lo_a)
    lo = None if lo_b is None or up_a is None else d - math.hypot(lo_b, up_a)
    return Difference(name, a, b, d, (lo, hi), higher)


def _finite(ci: Interval) -> Interval:
    lo, hi = ci
    return (lo if lo is not None and math.isfinite(lo) else None, hi if hi is not None and math.isfinite(hi) else None)


@dataclass(frozen=True, slots=True)
class Comparison:
    a: RampDoc
    b: RampDoc
    knee: Difference
    levels: tuple[tuple[float, tuple[Difference, ...]], ...]
    """Each level both ramps ran: the SLA figures, output tokens/s and the error rate."""
    notes: tuple[str, ...] = ()

    @property
    def verdict(self) -> Outcome:
        """The knee's verdict (how many users within the SLA) when both have one, else the
        figures': better or worse only when none disagrees."""
        if self.knee.verdict != "not comparable":
            return self.knee.verdict
        seen = {d.verdict for _, ds in self.levels for d in ds} - {"not comparable", "within noise"}
        if len(seen) == 1:
            return next(iter(seen))
        return "within noise" if self.levels else "not comparable"

    def as_dict(self) -> dict[str, object]:
        return {
            "a": self.a.path,
            "b": self.b.path,
            "verdict": self.verdict,
            "knee": self.knee.as_dict(),
            "levels": [{"level": lv, **{d.name: d.as_dict() for d in ds}} for lv, ds in self.levels],
            "notes": list(self.notes),
        }


def _knee_point(doc: RampDoc) -> tuple[float | None, Interval]:
    inf = doc.knee.inferred
    if inf is not None and inf.estimate is not None and inf.boundary != "bound":
        return inf.estimate, inf.ci95
    k = doc.knee
    if k.meets_level is not None and k.breaks_level is not None:
        return (k.meets_level + k.breaks_level) / 2, (k.meets_level, k.breaks_level)
    return None, (None, None)


def _figures(a: StepSummary, b: StepSummary, sla: tuple[str, ...]) -> tuple[Difference, ...]:
    out = []
    seen: set[str] = set()
    for clause in sla:
        try:
            (lim,) = parse_sla(clause)
        except ValueError:
            continue
        if lim.key in seen:
            continue
        seen.add(lim.key)
        out.append(difference(lim.key, a.value(lim), a.interval(lim), b.value(lim), b.interval(lim), False))
    out.append(
        difference(
            "output_tokens_per_s",
            a.output_tokens_per_s,
            a.ci95.output_tokens_per_s,
            b.output_tokens_per_s,
            b.ci95.output_tokens_per_s,
            True,
        )
    )
    return tuple(out)


def compare(a: RampDoc, b: RampDoc) -> Comparison:
    """``b`` against ``a``: the knee, then every level both ran."""
    notes = []
    if a.knee.unit != b.knee.unit:
        # users and trace speeds (or rates) are different axes: level 1 of one is not level 1 of the other
        notes.append(f"A stepped {a.knee.unit}, B {b.knee.unit}: their levels and knees do not compare")
        return Comparison(a, b, difference("knee", None, (None, None), None, (None, None), True), (), tuple(notes))
    if a.sla != b.sla:
        notes.append(
            f"the SLAs differ (A: {', '.join(a.sla)}; B: {', '.join(b.sla)}): the knees answer different questions"
        )
    if a.model != b.model:
        notes.append(f"the models differ (A: {a.model}, B: {b.model})")
    ka, ia = _knee_point(a)
    kb, ib = _knee_point(b)
    knee = difference("knee", ka, ia, kb, ib, True)
    if knee.diff is None:
        notes.append("one of them has no knee (no level broke the SLA, or none met it): compare the figures per level")
    by_a = {s.level: s for s in a.steps}
    by_b = {s.level: s for s in b.steps}
    sla = a.sla if a.sla == b.sla else tuple(dict.fromkeys((*a.sla, *b.sla)))
    levels = tuple((lv, _figures(by_a[lv], by_b[lv], sla)) for lv in sorted(set(by_a) & set(by_b)))
    if not levels:
        notes.append("no level was run by both ramps")
    return Comparison(a, b, knee, levels, tuple(notes))


def _num(v: float | None, name: str) -> str:
    if v is None:
        return "?"
    if name == "output_tokens_per_s" or name == "knee":
        return f"{v:,.1f}"
    if name == "error_rate":
        return f"{v * 100:.2f}%"
    return f"{v * 1000:.1f}ms" if abs(v) < 1 else f"{v:.2f}s"


def comparison_text(c: Comparison) -> str:
    """The comparison in lines: the verdict, the knee, then each common level."""
    unit = c.a.knee.unit

    def line(d: Difference) -> str:
        lo, hi = d.ci95
        return (
            f"{d.name}: A {_num(d.a, d.name)}, B {_num(d.b, d.name)}, B-A {_num(d.diff, d.name)} "
            f"[{_num(lo, d.name)}, {_num(hi, d.name)}]: {d.verdict}"
        )

    def label(r: RampDoc) -> str:
        return f"{r.path} (predicted by the twin)" if r.predicted else r.path

    out = [f"B against A: {c.verdict}", f"  A: {label(c.a)}", f"  B: {label(c.b)}", f"knee ({unit}): " + line(c.knee)]
    for lv, ds in c.levels:
        out.append(f"at {lv:g} {unit}:")
        out += [f"  {line(d)}" for d in ds]
    out += [f"note: {n}" for n in c.notes]
    # paths and model names come from files: control characters shown inert, a huge name cut
    return lines_safe("\n".join(out))
