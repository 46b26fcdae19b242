"""A Pareto front of measured configurations, each known only to within an interval.

A trial measures a configuration once: each objective is a point estimate with its 95 %
interval (the step's own, from the confidence maths). A configuration run more than once pools its
runs. The front is then read three ways:

- **confirmed**: on the front of the point estimates, and no other configuration could dominate
  it anywhere within the intervals (no other configuration's optimistic corner is at least as
  good as this one's pessimistic corner in every objective);
- **provisional**: on the front of the point estimates, but some other configuration's interval
  reaches past it, so which of them is better is not settled;
- **candidate**: off the point-estimate front, but not surely dominated (no front member's
  pessimistic corner is at least as good as its optimistic corner): it could still be on the front.

Anything else is **dominated**. Re-runs go to the unsettled configurations (see :func:`pick_rerun`),
and measure the run-to-run noise: every configuration's interval is at least as wide as the noise
the re-runs found (:func:`run_to_run_cv`, :func:`widen`), also where it ran once.
Two objectives, directions ``"max"`` or ``"min"`` (as :mod:`spoc_tui.core.tuning.pareto`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from spoc_tui.core.tuning.pareto import pareto_indices

Z95 = 1.959963984540054
FrontStatus = Literal["confirmed", "provisional", "candidate", "dominated"]
MAX_RUNS = 4
"""A configuration is run at most this many times in all (one trial and three re-runs)."""


@dataclass(frozen=True)
class Run:
    """One measurement of a configuration: a value and a 95 % interval per objective (a side of
    the interval may be None where the sample could not bound it)."""

    values: tuple[float, ...]
    ci95: tuple[tuple[float | None, float | None], ...]


@dataclass
class Estimate:
    """A configuration's pooled runs."""

    key: Hashable
    values: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    runs: int
    spread: tuple[float, ...] = ()
    """Coefficient of variation between runs, per objective (empty with one run)."""
    status: FrontStatus = "dominated"
    over: list[Hashable] = field(default_factory=list)
    """Configurations whose intervals reach past this one (why it is provisional)."""


def _half(run: Run, i: int) -> float:
    """A run's half-width for objective ``i`` (a missing side mirrors the other; none: unbounded)."""
    v = run.values[i]
    lo, hi = run.ci95[i] if i < len(run.ci95) else (None, None)
    sides = [abs(v - x) for x in (lo, hi) if x is not None and math.isfinite(x)]
    return max(sides) if sides else math.inf


def pool(key: Hashable, runs: Sequence[Run]) -> Estimate:
    """Pool a configuration's runs: the mean of each objective, and a 95 % interval from the
    larger of two variance estimates of one run: within runs (each run's own interval, as a
    standard error) and between runs (the runs' sample variance, which also holds what a single
    run cannot see: warm-up state, the workload's draw). The mean's interval is then
    z x sqrt(variance / runs). One run keeps its own interval."""
    if not runs:
        raise ValueError("no runs to pool")
    k = len(runs)
    m = len(runs[0].values)
    if k == 1:
        r = runs[0]
        lo, hi = [], []
        for i in range(m):
            a, b = r.ci95[i] if i < len(r.ci95) else (None, None)
            low = float(a) if a is not None else r.values[i] - _half(r, i)
            lo.append(max(0.0, low) if r.values[i] >= 0 else low)
            hi.append(float(b) if b is not None else r.values[i] + _half(r, i))
        return Estimate(key, tuple(r.values), tuple(lo), tuple(hi), 1)
    means, los, his, spread = [], [], [], []
    for i in range(m):
        xs = [r.values[i] for r in runs]
        mean = statistics.fmean(xs)
        within = statistics.fmean((_half(r, i) / Z95) ** 2 for r in runs)
        between = statistics.variance(xs)
        half = Z95 * math.sqrt(max(within, between) / k)
        means.append(mean)
        # throughputs and latencies cannot be negative: an interval wider than its mean is cut at 0
        los.append(max(0.0, mean - half) if min(xs) >= 0 else mean - half)
        his.append(mean + half)
        spread.append(math.sqrt(between) / abs(mean) if mean else math.inf)
    return Estimate(key, tuple(means), tuple(los), tuple(his), k, tuple(spread))


_CHI2_Q10 = {1: 0.015791, 2: 0.210721, 3: 0.584374, 4: 1.063623, 5: 1.610308}


def run_to_run_cv(groups: Sequence[Sequence[Run]]) -> tuple[float, ...] | None:
    """The run-to-run coefficient of variation per objective, pooled over every configuration run
    more than once (sum of squared relative deviations from each configuration's mean, over the
    runs' degrees of freedom), at its one-sided 90 % upper confidence bound (a handful of re-runs
    estimate it loosely: with 3 degrees of freedom the bound is 2.3x the estimate), or None when no
    configuration ran twice. This is what one run's own interval cannot see (measured on the real
    vLLM CPU build: a run's tokens/s interval claimed a 1-2 % standard error while five runs of
    one configuration spread by 10 %)."""
    num: list[float] = []
    dof = 0
    for runs in groups:
        if len(runs) < 2:
            continue
        m = len(runs[0].values)
        if not num:
            num = [0.0] * m
        for i in range(m):
            xs = [r.values[i] for r in runs]
            mean = statistics.fmean(xs)
            if mean == 0:
                continue
            num[i] += sum((x - mean) ** 2 for x in xs) / mean**2
        dof += len(runs) - 1
    if not dof:
        return None
    # chi-square's 10 % quantile with dof degrees of freedom: exact to 5, then Wilson-Hilferty (< 1 %)
    a = 2.0 / (9.0 * dof)
    q10 = _CHI2_Q10.get(dof) or dof * (1.0 - a - 1.2815515655446004 * math.sqrt(a)) ** 3
    return tuple(math.sqrt(n / q10) for n in num)


def widen(e: Estimate, cv: Sequence[float]) -> Estimate:
    """``e`` with each interval at least the run-to-run noise ``cv`` allows for its runs:
    half-width >= z x cv x |mean| / sqrt(runs) (in place; returned). Values stay as they are."""
    lo, hi = list(e.lo), list(e.hi)
    for i, c in enumerate(cv):
        v = e.values[i]
        half = Z95 * c * abs(v) / math.sqrt(e.runs)
        lo[i] = min(lo[i], max(0.0, v - half) if v >= 0 else v - half)
        hi[i] = max(hi[i], v + half)
    e.lo, e.hi = tuple(lo), tuple(hi)
    return e


def _best_worst(e: Estimate, directions: Sequence[str]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(optimistic, pessimistic) corners of ``e``'s interval box, as minimisation coordinates."""
    opt, pes = [], []
    for i, d in enumerate(directions):
        if d == "max":
            opt.append(-e.hi[i])
            pes.append(-e.lo[i])
        else:
            opt.append(e.lo[i])
            pes.append(e.hi[i])
    return tuple(opt), tuple(pes)


def _weakly_better(a: Sequence[float], b: Sequence[float]) -> bool:
    """``a`` at least as good as ``b`` in every (minimised) coordinate, better in one."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def classify(estimates: Sequence[Estimate], directions: Sequence[str]) -> list[Estimate]:
    """Mark each estimate confirmed, provisional, candidate or dominated (in place; returned)."""
    if not estimates:
        return []
    corners = [_best_worst(e, directions) for e in estimates]
    on_front = set(pareto_indices([e.values for e in estimates], directions))
    for i, e in enumerate(estimates):
        e.over = []
        if i in on_front:
            _, pes = corners[i]
            e.over = [estimates[j].key for j in range(len(estimates)) if j != i and _weakly_better(corners[j][0], pes)]
            e.status = "provisional" if e.over else "confirmed"
        else:
            opt, _ = corners[i]
            surely = any(_weakly_better(corners[j][1], opt) for j in on_front)
            e.status = "dominated" if surely else "candidate"
    return list(estimates)


def dominated_by_front(
    values_lo: Sequence[float], values_hi: Sequence[float], front: Sequence[Estimate], directions: Sequence[str]
) -> Estimate | None:
    """A front member whose pessimistic corner is at least as good as the optimistic corner of the
    interval box ``[values_lo, values_hi]`` (a trial partway through its step), or None. Only
    confirmed members count: a trial is not stopped on the strength of an unsettled one."""
    probe = Estimate("probe", tuple(values_lo), tuple(values_lo), tuple(values_hi), 1)
    opt, _ = _best_worst(probe, directions)
    for f in front:
        if f.status != "confirmed":
            continue
        _, pes = _best_worst(f, directions)
        if _weakly_better(pes, opt):
            return f
    return None


def pick_rerun(estimates: Sequence[Estimate], directions: Sequence[str], max_runs: int = MAX_RUNS) -> Estimate | None:
    """The configuration to measure again, or None when the front is settled.

    Policy: among provisional front members and candidates that have run fewer than ``max_runs``
    times, the one with the fewest runs; ties go to the widest interval relative to its value
    (summed over objectives), so the least certain of the least measured goes first. Provisional
    members come before candidates with as many runs."""
    pool_ = [e for e in estimates if e.status in ("provisional", "candidate") and e.runs < max_runs]
    if not pool_:
        return None

    def rel_width(e: Estimate) -> float:
        return sum((e.hi[i] - e.lo[i]) / max(abs(e.values[i]), 1e-12) for i in range(len(directions)))

    return min(pool_, key=lambda e: (e.runs, e.status != "provisional", -rel_width(e)))
