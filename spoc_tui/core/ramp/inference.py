"""The knee inferred across steps: each SLA figure fitted against the load level over every step
so far, where the fit crosses its limit, and how sure that is.

Latency percentiles and the error rate rise with load. For each limit, each level's figure (its
point estimate, even from a step too short to bound its own p99) becomes a margin,
``log(figure / limit)`` for a latency and ``figure - limit`` for the error rate (negative:
within the limit), weighted by the requests it rests on (the
independent units: an ITL percentile from 800 gaps of 3 requests weighs 3), and a weighted
isotonic (non-decreasing) regression is fitted through the margins. Where the fit crosses zero,
interpolated linearly between the last level within and the first beyond, is that limit's
knee; the knee is the lowest of them, and its limit the binding one.

The 95 % interval resamples each step's own requests with replacement (whole requests, so a
request's gaps stay together) and repeats the fit and the crossing: it carries the sampling of
every step and the fit. A **cliff** is a jump between the two levels around the crossing larger
than the fitted trend below it explains (three times the trend's step and the jump's own
bootstrap noise); the knee is then somewhere inside that bracket and the interval is the
bracket. When no level broke a limit (or every level did), the answer is a one-sided
**bound**: more than the highest level, or fewer than the lowest.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Literal

import numpy as np

from spoc_tui.core.confidence import LEVEL, Interval, PooledPercentile, binom_cdf, min_samples_for_upper_bound
from spoc_tui.core.ramp.sla import PERCENTILE_Q, LevelUnit, Limit, level_text
from spoc_tui.core.ramp.steps import Json, RequestSample, json_float, json_int, json_interval

REPLICATES = 200
"""Bootstrap replicates of the whole inference (seeded: the same steps give the same interval)."""
CLIFF_FACTOR = 3.0
"""A jump at the crossing this many times what the trend and the noise explain is a cliff."""

Boundary = Literal["smooth", "cliff", "bound"]


@dataclass(frozen=True, slots=True)
class Curve:
    """One limit's fitted figure against the load level (the isotonic fit the knee comes from,
    in the figure's own unit) with its 95 % band from the same resampling: what the Load screen
    draws behind each step's column. In memory only (ramp.json keeps the steps it comes from)."""

    limit: str
    """The limit's key, ``ttft_p99``."""
    levels: tuple[float, ...]
    fitted: tuple[float, ...]
    band: tuple[tuple[float, float], ...]

    def at(self, level: float) -> tuple[float, float, float] | None:
        """(fitted, band low, band high) at a level the fit rests on, else None."""
        for x, f, (lo, hi) in zip(self.levels, self.fitted, self.band, strict=True):
            if x == level:
                return f, lo, hi
        return None


@dataclass(frozen=True, slots=True)
class KneeEstimate:
    """The knee inferred across steps, with its 95 % interval."""

    estimate: float | None
    """The level where the binding limit's fit crosses it (None for a bound below the lowest level)."""
    ci95: Interval
    """[lo, hi]; a side None where the steps cannot bound it (a bound: beyond the levels run)."""
    binding_limit: str | None
    """The limit that crosses first (``ttft_p99``), None when no limit was crossed."""
    boundary: Boundary
    """``smooth`` (the fit crosses between levels), ``cliff`` (a jump the trend does not explain:
    the interval is the bracket) or ``bound`` (one side only: every level met, or none did)."""
    unit: LevelUnit = "users"
    levels: int = 0
    """Levels the fit rests on."""
    replicates: int = 0
    curves: tuple[Curve, ...] = field(default=(), compare=False)
    """Each limit's fit with its band (not written to ramp.json)."""

    def curve(self, limit: str) -> Curve | None:
        return next((c for c in self.curves if c.limit == limit), None)

    @property
    def text(self) -> str:
        """``13.4 users (95 %: 12.1-14.6), binding ttft_p99`` or ``more than 32 users (...)``."""
        lo, hi = self.ci95
        if self.boundary == "bound":
            if self.estimate is None:
                if hi is None:
                    return f"not bounded yet: the lowest level broke {self.binding_limit}, but too few requests say so"
                return f"fewer than {level_text(hi, self.unit)}: even the lowest level broke {self.binding_limit}"
            if lo is None:
                return "not bounded yet: no level broke the SLA, but too few requests say so"
            return f"more than {level_text(lo, self.unit)}: no level broke the SLA"

        def num(v: float | None) -> str:
            return "?" if v is None else f"{v:.3g}"

        est = f"x{num(self.estimate)}" if self.unit == "x" else f"{num(self.estimate)} {self.unit}"
        kind = ", a cliff: the knee lies in this bracket" if self.boundary == "cliff" else ""
        text = f"{est} (95 %: {num(lo)}-{num(hi)}{kind}), binding {self.binding_limit}"
        if lo is None or hi is None:
            text += (
                "; an open end: the steps near the knee are too short (or too noisy) to bound it there, "
                "and longer steps close it (--budget, --max-step-seconds)"
            )
        return text

    @property
    def short(self) -> str:
        """``21.5 (19.9-23.1)``, ``>32`` or ``<1``: the knee in a badge's room."""
        lo, hi = self.ci95
        if self.boundary == "bound":
            if self.estimate is None:
                return f"<{hi:g}" if hi is not None else "?"
            return f">{lo:g}" if lo is not None else "?"

        def num(v: float | None) -> str:
            return "?" if v is None else f"{v:.3g}"

        return f"{num(self.estimate)} ({num(lo)}-{num(hi)})"

    def as_dict(self) -> dict[str, object]:
        return {
            "estimate": self.estimate,
            "ci95": list(self.ci95),
            "binding_limit": self.binding_limit,
            "boundary": self.boundary,
            "levels": self.levels,
            "replicates": self.replicates,
        }

    @classmethod
    def from_dict(cls, d: Json, unit: LevelUnit) -> KneeEstimate | None:
        boundary = d.get("boundary")
        if boundary not in ("smooth", "cliff", "bound"):
            return None
        b = d.get("binding_limit")
        return cls(
            json_float(d, "estimate"),
            json_interval(d.get("ci95")),
            str(b) if b else None,
            boundary,  # checked above
            unit,
            json_int(d, "levels") or 0,
            json_int(d, "replicates") or 0,
        )


class _Column:
    """One limit's values over one level's requests, laid out once so that each bootstrap
    replicate only gathers (the replicates were 2/3 of a predicted ramp's time)."""

    __slots__ = ("_owner", "_ranked", "kind", "lengths", "starts", "stat", "valid", "values")

    def __init__(self, samples: Sequence[RequestSample], lim: Limit) -> None:
        self.stat = lim.stat
        if lim.metric == "error_rate":
            self.kind = "rate"
            self.values = np.array([0.0 if s.ok else 1.0 for s in samples])
            self._owner: np.ndarray | None = None
        elif lim.metric == "itl":
            self.kind = "pooled"
            gaps = [s.itl if s.ok else () for s in samples]
            self.lengths = np.array([len(g) for g in gaps], dtype=np.int64)
            self.starts = np.concatenate(([0], np.cumsum(self.lengths)[:-1])).astype(np.int64)
            self.values = np.fromiter(chain.from_iterable(gaps), dtype=float, count=int(self.lengths.sum()))
            self._owner = np.repeat(np.arange(len(gaps)), self.lengths) if self.stat != "mean" else None
        else:
            self.kind = "scalar"
            vals = [getattr(s, lim.metric) if s.ok else None for s in samples]
            self.values = np.array([np.nan if v is None else float(v) for v in vals], dtype=float)
            self.valid = ~np.isnan(self.values)
            # a percentile of the picked requests' values read from them sorted once (each a run of one)
            ranked = self.stat != "mean" and bool(self.valid.any())
            self._owner = np.flatnonzero(self.valid) if ranked else None
        self._ranked: PooledPercentile | None = None

    def _present(self) -> np.ndarray:
        """Every request's values that it has (a pooled column's gaps, a scalar's non-missing), in order."""
        return self.values if self.kind == "pooled" else self.values[self.valid]

    @property
    def ranked(self) -> PooledPercentile | None:
        """The values sorted once for the resamples' percentiles (None: a mean, or no value),
        sorted when a resample first needs them (a draw's knee, never resampled, does not)."""
        if self._ranked is None and self._owner is not None:
            self._ranked = PooledPercentile(self._present(), self._owner)
        return self._ranked

    def figure(self, idx: np.ndarray, whole: bool = False) -> float | None:
        """The figure over the requests ``idx`` (a request picked twice counts twice); ``whole``:
        ``idx`` is every request once, in order (the values as they are: the same float as from
        them sorted, :class:`PooledPercentile`)."""
        if whole and self.kind != "rate":
            values = self._present()
            if not len(values):
                return None
            if self.stat == "mean":
                return float(values.mean())
            return float(np.percentile(values, PERCENTILE_Q[self.stat] * 100))
        if self.kind == "rate":
            return float(self.values[idx].mean()) if len(idx) else None
        if self.kind == "pooled":
            lens = self.lengths[idx]
            total = int(lens.sum())
            if not total:
                return None
            if self.ranked is not None:
                counts = np.bincount(idx, minlength=len(self.lengths))
                return self.ranked.percentile(counts, total, PERCENTILE_Q[self.stat] * 100)
            # the gathered gaps: each picked request's run of gaps, in order
            offs = np.repeat(self.starts[idx] - np.concatenate(([0], np.cumsum(lens)[:-1])), lens)
            values = self.values[np.arange(total) + offs]
        else:
            if self.ranked is not None:
                total = int(self.valid[idx].sum())
                if not total:
                    return None
                counts = np.bincount(idx, minlength=len(self.values))
                return self.ranked.percentile(counts, total, PERCENTILE_Q[self.stat] * 100)
            values = self.values[idx]
            values = values[~np.isnan(values)]
            if not len(values):
                return None
        if self.stat == "mean":
            return float(values.mean())
        return float(np.percentile(values, PERCENTILE_Q[self.stat] * 100))


def _weight(samples: Sequence[RequestSample], lim: Limit) -> int:
    """The independent units a figure rests on: requests (with a value, for a latency)."""
    if lim.metric == "error_rate":
        return len(samples)
    if lim.metric == "itl":
        return sum(1 for s in samples if s.ok and s.itl)
    return sum(1 for s in samples if s.ok and getattr(s, lim.metric) is not None)


def isotonic(y: Sequence[float], w: Sequence[float]) -> list[float]:
    """Weighted least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for yi, wi in zip(y, w, strict=True):
        blocks.append([yi, max(wi, 1e-12), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, c2 = blocks.pop()
            m1, w1, c1 = blocks.pop()
            blocks.append([(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    out: list[float] = []
    for m, _, c in blocks:
        out += [m] * int(c)
    return out


MIN_RATIO = 1e-3
"""A latency figure under a thousandth of its limit counts as that (its logarithm stays finite)."""


def _margin(v: float, lim: Limit) -> float:
    """How far past its limit a figure is: the log of figure / limit for a latency (latencies grow
    about exponentially with load until the queue takes over, so the crossing interpolates well
    between levels), the difference for the error rate (which starts at 0)."""
    if lim.metric == "error_rate":
        return v - lim.value
    return math.log(max(v / lim.value, MIN_RATIO))


def _crossing(xs: Sequence[float], fit: Sequence[float]) -> tuple[float, int]:
    """(where the fit crosses 0, the index of the first level beyond it); +inf when it never does,
    -inf when it starts beyond."""
    for i, f in enumerate(fit):
        if f > 0:
            if i == 0:
                return -math.inf, 0
            f0 = fit[i - 1]
            t = -f0 / (f - f0) if f > f0 else 0.0
            return xs[i - 1] + t * (xs[i] - xs[i - 1]), i
    return math.inf, len(xs)


Fits = dict[str, tuple[list[float], list[float]]]
"""Each limit's key -> (its levels, the isotonic fit of its margins there); limits without a figure left out."""


Points = dict[str, tuple[list[float], list[float], list[float]]]
"""Per limit: the levels with a figure, their margins over the limit, their weights."""


def _fit(per_limit: Points) -> Fits:
    return {key: (xs, isotonic(ms, ws)) for key, (xs, ms, ws) in per_limit.items() if xs}


def _knee_of(fits: Fits) -> tuple[float, str | None]:
    best, binding = math.inf, None
    for key, (xs, fit) in fits.items():
        k, _ = _crossing(xs, fit)
        if k < best:
            best, binding = k, key
    return best, binding


def _pool(
    levels: Sequence[tuple[float, Sequence[RequestSample]]],
) -> tuple[
    dict[float, list[RequestSample]], dict[float, list[tuple[int, int]]], dict[float, list[Sequence[RequestSample]]]
]:
    """Each level's requests pooled over the steps that measured it, its windows' spans (offset
    into its pooled requests, count) per step, and the windows themselves."""
    pooled: dict[float, list[RequestSample]] = {}
    spans: dict[float, list[tuple[int, int]]] = {}
    windows: dict[float, list[Sequence[RequestSample]]] = {}
    for level, samples in levels:
        if samples:
            x = float(level)
            spans.setdefault(x, []).append((len(pooled.get(x, ())), len(samples)))
            pooled.setdefault(x, []).extend(samples)
            windows.setdefault(x, []).append(samples)
    return pooled, spans, windows


class Columns:
    """A run's levels laid out once across its inferences (the driver infers the knee after each
    step, over every step so far: each inference laid every level out again, an ITL column's sort
    the most of it). Kept by the windows a level pools, which it holds, so that a key names those
    very lists; a window is a step's requests, never changed once measured."""

    def __init__(self) -> None:
        self._kept: dict[tuple[int, ...], tuple[tuple[Sequence[RequestSample], ...], dict[str, tuple[_Column, float]]]]
        self._kept = {}

    def of(
        self, windows: Sequence[Sequence[RequestSample]], pooled: list[RequestSample], lim: Limit
    ) -> tuple[_Column, float]:
        """The column of ``lim`` over ``pooled`` (the requests of ``windows``), and its weight."""
        key = tuple(map(id, windows))
        kept = self._kept.get(key)
        if kept is None:
            kept = self._kept[key] = (tuple(windows), {})
        got = kept[1].get(lim.key)
        if got is None:
            got = kept[1][lim.key] = (_Column(pooled, lim), float(_weight(pooled, lim)))
        return got


def infer_knee(
    levels: Sequence[tuple[float, Sequence[RequestSample]]],
    limits: Sequence[Limit],
    unit: LevelUnit = "users",
    replicates: int = REPLICATES,
    seed: int = 0,
    columns: Columns | None = None,
) -> KneeEstimate | None:
    """The knee across ``levels`` (each level and the requests its step measured), or None
    before any level has a figure; ``columns``: the levels laid out by an inference before (the
    same figures, once each).

    A level measured more than once is pooled for its figure, and resampled in two stages: each
    replicate draws that level's windows with replacement, then requests within each drawn
    window. The requests of one window met the same queue, so they vary together; when two
    windows of one level disagree (the server sped up or slowed down between them, or a queue
    that built in one was gone in the other), that disagreement carries into the interval instead
    of being averaged away as if every request were independent."""
    pooled, spans, windows = _pool(levels)
    xs_all = sorted(x for x, s in pooled.items() if s)
    if not xs_all or not limits:
        return None

    kept = columns if columns is not None else Columns()
    laid = {(x, lim.key): kept.of(windows[x], pooled[x], lim) for x in xs_all for lim in limits}

    def points(pick: dict[float, np.ndarray], whole: bool = False) -> Points:
        out: Points = {}
        for lim in limits:
            xs, ms, ws = [], [], []
            for x in xs_all:
                column, weight = laid[x, lim.key]
                v = column.figure(pick[x], whole)
                if v is not None:
                    xs.append(x)
                    ms.append(_margin(v, lim))
                    ws.append(weight)
            out[lim.key] = (xs, ms, ws)
        return out

    whole = {x: np.arange(len(pooled[x])) for x in xs_all}
    base = points(whole, whole=True)
    if not any(xs for xs, _, _ in base.values()):
        return None
    base_fits = _fit(base)
    knee, binding = _knee_of(base_fits)
    rng = np.random.default_rng(seed + 7_919 * len(xs_all) + sum(len(s) for s in pooled.values()))
    boots: list[float] = []
    jumps: list[float] = []
    resampled: dict[str, dict[float, list[float]]] = {lim.key: {} for lim in limits}
    bracket = _bracket(base, binding)
    for _ in range(replicates):
        pick = {x: _resample(rng, spans[x]) for x in xs_all}
        pts = points(pick)
        fits = _fit(pts)
        boots.append(_knee_of(fits)[0])
        for key, (xs, fit) in fits.items():
            for x, f in zip(xs, fit, strict=True):
                resampled[key].setdefault(x, []).append(f)
        if bracket is not None and binding is not None:
            xs, ms, _ = pts[binding]
            lo_x, hi_x = bracket
            if lo_x in xs and hi_x in xs:
                jumps.append(ms[xs.index(hi_x)] - ms[xs.index(lo_x)])
    n_levels = len(xs_all)
    curves = _curves(base_fits, resampled, limits)
    arr = np.asarray(boots, dtype=float)
    # no interpolation between replicates: some are infinite (no crossing in that replicate)
    lo_b = float(np.percentile(arr, 2.5, method="lower")) if replicates else knee
    hi_b = float(np.percentile(arr, 97.5, method="higher")) if replicates else knee
    # resampling cannot see past the largest value a step measured: where a step is too short to
    # bound its percentile from above, the interval also holds what the counts past each limit
    # allow (the lowest such end over the limits: any of them may be the one that binds)
    short = [lim for lim in limits if _too_few_for_the_tail(pooled, xs_all, lim)]
    env = [_envelope(pooled, xs_all, lim) for lim in short]
    env_lo = min((e[0] for e in env), default=math.inf)
    env_hi = min((e[1] for e in env), default=-math.inf)
    if math.isinf(knee):
        # a bound is only as sure as the resampling says: a replicate that crosses inside the
        # levels run moves the bound's end there (one noisy step at 1 user is no "fewer than 1")
        if knee > 0:  # every level within every limit
            low = min(xs_all[-1], lo_b, env_lo)
            above = _whole((None if math.isinf(low) else low, None), unit)
            return KneeEstimate(xs_all[-1], above, None, "bound", unit, n_levels, replicates, curves)
        high = max(xs_all[0], hi_b, env_hi)
        below = _whole((None, None if math.isinf(high) else high), unit)
        return KneeEstimate(None, below, binding, "bound", unit, n_levels, replicates, curves)
    lo, hi = min(lo_b, env_lo), max(hi_b, env_hi)
    ci: Interval = (None if math.isinf(lo) else max(lo, 0.0), None if math.isinf(hi) else hi)
    if bracket is not None:
        # between the two levels around the crossing the curve was not measured: where it crosses
        # in there is the interpolation's guess, not something the steps know (interpolating
        # between 96 and 128 users gave an interval of 116-119; the benchmark's coverage fell to
        # 54 %). The interval holds the whole bracket, and the resampling's where the steps
        # around it are too noisy to trust it; the search narrows it by probing inside.
        a, b = bracket
        ci = (None if ci[0] is None else min(a, ci[0]), None if ci[1] is None else max(b, ci[1]))
    if bracket is not None and binding is not None and _is_cliff(base[binding], bracket, jumps):
        return KneeEstimate(bracket[0], _whole(ci, unit), binding, "cliff", unit, n_levels, replicates, curves)
    return KneeEstimate(knee, _whole(ci, unit), binding, "smooth", unit, n_levels, replicates, curves)


def _resample(rng: np.random.Generator, windows: Sequence[tuple[int, int]]) -> np.ndarray:
    """One replicate's requests of a level: its one window's resampled (as many, with
    replacement), or its windows drawn with replacement and each drawn window's requests resampled
    within it (two stages: see :func:`infer_knee`)."""
    if len(windows) == 1:
        n = windows[0][1]
        return rng.integers(0, n, n)
    drawn = rng.integers(0, len(windows), len(windows))
    return np.concatenate([windows[i][0] + rng.integers(0, windows[i][1], windows[i][1]) for i in drawn])


def _figure(margin: float, lim: Limit) -> float:
    """The inverse of :func:`_margin`: a fitted margin in the figure's own unit."""
    return margin + lim.value if lim.metric == "error_rate" else lim.value * math.exp(margin)


def _curves(base: Fits, resampled: dict[str, dict[float, list[float]]], limits: Sequence[Limit]) -> tuple[Curve, ...]:
    """Each limit's isotonic fit over the measured steps, with the 2.5-97.5 % band of the
    resampled fits at each level."""
    out: list[Curve] = []
    for lim in limits:
        if lim.key not in base:
            continue
        xs, fitted = base[lim.key]
        band: list[tuple[float, float]] = []
        for x, f in zip(xs, fitted, strict=True):
            reps = resampled[lim.key].get(x) or [f]
            lo, hi = float(np.percentile(reps, 2.5)), float(np.percentile(reps, 97.5))
            band.append((_figure(min(lo, f), lim), _figure(max(hi, f), lim)))
        out.append(Curve(lim.key, tuple(xs), tuple(_figure(f, lim) for f in fitted), tuple(band)))
    return tuple(out)


def _whole(ci: Interval, unit: LevelUnit) -> Interval:
    """A user-count interval widened to whole users: there is no 23.5 users, and between two
    adjacent counts the interpolation says nothing the steps measured (an interval of 23.3-23.6
    claimed more than they know). Rates stay as they are."""
    if unit != "users":
        return ci
    lo, hi = ci
    return (None if lo is None else float(math.floor(lo)), None if hi is None else float(math.ceil(hi)))


def _per_request_values(samples: Sequence[RequestSample], lim: Limit) -> list[float]:
    return [v for s in samples if s.ok and (v := getattr(s, lim.metric)) is not None]


def _too_few_for_the_tail(pooled: dict[float, list[RequestSample]], xs: Sequence[float], lim: Limit) -> bool:
    """A per-request percentile (TTFT, TPOT, E2E) that some level measured too few requests to
    bound from above."""
    q = PERCENTILE_Q.get(lim.stat)
    if q is None or lim.metric not in ("ttft", "tpot", "e2e"):
        return False
    need = min_samples_for_upper_bound(q)
    return any(len(_per_request_values(pooled[x], lim)) < need for x in xs)


def _envelope(pooled: dict[float, list[RequestSample]], xs: Sequence[float], lim: Limit) -> tuple[float, float]:
    """(the highest level surely within the limit, the lowest surely past it), -inf / +inf where
    none is, from how many of each level's requests the limit's figure let past it: a p99 within
    400 ms lets at most 1 % of requests take longer.

    Latency rises with load, so a level's share past the limit is at most that of any level
    above it and at least that of any below. A level is surely within when, pooled with the
    levels above it up to some level, the share past the limit is surely under what the
    percentile allows (its exact binomial bound, one side of the 95 % interval); surely past it
    when, pooled with the levels below it, the share is surely over. A p99 step too short to bound
    its own percentile (48 requests at 32 users, the slowest 0.28 s against a true p99 of 1.4 s)
    thus claims nothing until the steps around it together have the requests; taking its slowest
    request for its p99's upper end had the interval hold the truth in 7 of 20 searches of the
    coding profile."""
    allowed = 1.0 - PERCENTILE_Q[lim.stat]
    alpha = (1.0 - LEVEL) / 2
    counts: list[tuple[int, int]] = []
    for x in xs:
        values = _per_request_values(pooled[x], lim)
        counts.append((len(values), sum(1 for v in values if v > lim.value)))

    def surely_under(n: int, k: int) -> bool:  # the share's upper bound is under what is allowed
        return n > 0 and float(binom_cdf(n, allowed)[k]) < alpha

    def surely_over(n: int, k: int) -> bool:  # the share's lower bound is over what is allowed
        return n > 0 and k > 0 and 1.0 - float(binom_cdf(n, allowed)[k - 1]) < alpha

    def first_shown(
        order: Sequence[int], pooled_with: Callable[[int], range], shown: Callable[[int, int], bool]
    ) -> int:
        """The first level in ``order`` that, pooled with ``pooled_with(j)`` in turn, shows it."""
        for j in order:
            n = k = 0
            for m in pooled_with(j):
                n, k = n + counts[m][0], k + counts[m][1]
                if shown(n, k):
                    return j
        return -1

    last = len(xs) - 1
    j = first_shown(range(last, -1, -1), lambda j: range(j, last + 1), surely_under)  # the highest within
    within = xs[j] if j >= 0 else -math.inf
    j = first_shown(range(last + 1), lambda j: range(j, -1, -1), surely_over)  # the lowest past
    past = xs[j] if j >= 0 else math.inf
    return within, past


def _bracket(per_limit: Points, binding: str | None) -> tuple[float, float] | None:
    """The two levels around the binding limit's crossing."""
    if binding is None:
        return None
    xs, ms, ws = per_limit[binding]
    k, i = _crossing(xs, isotonic(ms, ws))
    if math.isinf(k) or i == 0 or i >= len(xs):
        return None
    return xs[i - 1], xs[i]


def _is_cliff(
    points: tuple[list[float], list[float], list[float]], bracket: tuple[float, float], jumps: Sequence[float]
) -> bool:
    """The raw margin jumps across the bracket by more than the fitted trend below it and the
    jump's own bootstrap noise explain (at least two levels below the jump give the trend)."""
    xs, ms, ws = points
    fit = isotonic(ms, ws)
    i = xs.index(bracket[1])
    if i < 2:
        return False
    slope = max(0.0, (fit[i - 1] - fit[i - 2]) / (xs[i - 1] - xs[i - 2]))
    expected = slope * (xs[i] - xs[i - 1])
    noise = float(np.std(jumps)) if len(jumps) > 1 else 0.0
    jump = ms[i] - ms[i - 1]
    return jump > CLIFF_FACTOR * max(expected, noise, 0.05)


def level_margin(samples: Sequence[RequestSample], lim: Limit) -> float | None:
    """How far past ``lim`` one level's requests are, as :func:`infer_knee` reads a level (its
    figure over every request, :func:`_margin`), or None where they give no figure."""
    if not samples:
        return None
    v = _Column(samples, lim).figure(np.arange(len(samples)), whole=True)
    return None if v is None else _margin(v, lim)


Trend = dict[str, tuple[list[float], list[float]]]
"""Per limit's key: the levels with a figure, and the isotonic fit of their margins there."""


def level_trend(levels: Sequence[tuple[float, Sequence[RequestSample]]], limits: Sequence[Limit]) -> Trend:
    """Each limit's margins across ``levels`` (each step's level and its requests, as
    :func:`infer_knee` takes them: a level measured twice pooled), fitted as :func:`infer_knee`
    fits them: isotonic, read as a line between levels (:func:`shifted_knee`)."""
    pooled, _, _ = _pool(levels)
    out: Trend = {}
    for lim in limits:
        xs, ms, ws = [], [], []
        for lv in sorted(pooled):
            v = level_margin(pooled[lv], lim)
            if v is not None:
                xs.append(lv)
                ms.append(v)
                ws.append(float(_weight(pooled[lv], lim)))
        out[lim.key] = (xs, isotonic(ms, ws) if xs else [])
    return out


def shifted_knee(
    trend: Trend, at: tuple[float, Sequence[RequestSample]], limits: Sequence[Limit]
) -> tuple[float, str] | None:
    """Where a run crosses its limits, read from one level of its own (``at``) and another run's
    ``trend`` (:func:`level_trend`): each limit's fitted margins moved up or down to pass through
    the run's own margin at ``at`` cross 0 there. (The knee, the limit that binds first), or None
    where that cannot be read here: ``at`` outside the levels with a limit broken there, a crossing
    below the lowest of them, or none up to the highest (the run's own levels about it then
    tell)."""
    x, s = at
    best: tuple[float, str] | None = None
    for lim in limits:
        xs, fit = trend.get(lim.key, ([], []))
        m = level_margin(s, lim)
        if m is None or len(xs) < 2 or not xs[0] <= x <= xs[-1]:
            if m is not None and m > 0:
                return None  # past this limit with no trend to place its crossing by
            continue
        delta = m - float(np.interp(x, xs, fit))
        cross, _ = _crossing(xs, [f + delta for f in fit])
        if cross == -math.inf:
            return None  # below every level: the run's own levels tell
        if best is None or cross < best[0]:
            best = (cross, lim.key)
    return None if best is None or math.isinf(best[0]) else best
