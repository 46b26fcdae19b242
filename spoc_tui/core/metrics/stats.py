"""Histogram quantiles, windowed bucket differences and reset-aware counter maths.

All functions are pure. Series values are ``dict[Labels, float]`` as produced by
:mod:`spoc_tui.core.metrics.promparse`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spoc_tui.core.metrics.promparse import Bounded, Labels

INF = math.inf


@dataclass(frozen=True, slots=True)
class Histogram:
    """A cumulative histogram: ``counts[i]`` observations were <= ``bounds[i]``.

    ``bounds`` is strictly increasing and ends with +Inf when the histogram is complete.
    """

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    total: float | None
    """The ``_count`` value (equals the +Inf bucket when complete)."""
    sum: float | None

    @property
    def complete(self) -> bool:
        """True when the +Inf bucket is present and counts never decrease."""
        if not self.bounds or self.bounds[-1] != INF:
            return False
        return all(b >= a for a, b in zip(self.counts, self.counts[1:]))

    @property
    def count(self) -> float | None:
        if self.bounds and self.bounds[-1] == INF:
            return self.counts[-1]
        return self.total

    def mean(self) -> float | None:
        n = self.count
        if n is None or self.sum is None or n <= 0:
            return None
        return self.sum / n

    def quantile(self, q: float) -> float | None:
        """PromQL ``histogram_quantile`` semantics; None when unknown or empty."""
        if not self.complete or not 0 <= q <= 1:
            return None
        return bucket_quantile(q, self.bounds, self.counts)

    def bounded_quantile(self, q: float) -> tuple[float | None, bool]:
        """The tighter of the interpolated quantile and the bound the mean puts on it.

        For non-negative values (latencies) Markov's inequality bounds every quantile:
        ``x_q <= mean / (1 - q)``. Interpolating inside a bucket assumes its observations are
        spread evenly; when they sit near its lower edge (vLLM's queue time: mean 0.03 ms in a
        0-300 ms first bucket) the interpolation overstates the quantile by orders of magnitude
        and the bound is the truer figure. Returns (value, True when the value is the bound).
        """
        interp = self.quantile(q)
        mean = self.mean()
        if interp is None or mean is None or q >= 1 or mean < 0 or (self.bounds and self.bounds[0] < 0):
            return interp, False
        bound = mean / (1 - q)
        return (bound, True) if bound < interp else (interp, False)


def bucket_quantile(q: float, bounds: tuple[float, ...], counts: tuple[float, ...]) -> float | None:
    """Quantile by linear interpolation inside the bucket (as Prometheus does).

    The first bucket's lower edge is 0 (when its upper bound is positive); a rank that falls
    into the +Inf bucket returns the largest finite bound.
    """
    total = counts[-1]
    if total <= 0 or len(bounds) < 2:
        return None
    rank = q * total
    for i, c in enumerate(counts):  # noqa: B007  (i is the bucket found, read after the loop)
        if c >= rank:
            break
    if bounds[i] == INF:
        return bounds[-2]
    upper = bounds[i]
    if i == 0:
        lower = 0.0 if upper > 0 else upper
        prev = 0.0
    else:
        lower = bounds[i - 1]
        prev = counts[i - 1]
    in_bucket = c - prev
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - prev) / in_bucket


def parse_le(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return None if math.isnan(v) else v


def _strip(labels: Labels, drop: str) -> Labels:
    return tuple(p for p in labels if p[0] != drop)


_BUCKETS: Bounded[Labels, tuple[Labels, float | None]] = Bounded()
"""A bucket series' labels -> its histogram's labels (``le`` removed) and its bound: the same
series every scrape."""


def _bucket_of(labels: Labels) -> tuple[Labels, float | None]:
    le = None
    for k, v in labels:
        if k == "le":
            le = parse_le(v)
            break
    found = (_strip(labels, "le"), le)
    _BUCKETS.keep(labels, found)
    return found


def histogram_groups(
    buckets: Mapping[Labels, float],
    sums: Mapping[Labels, float],
    counts: Mapping[Labels, float],
) -> dict[Labels, Histogram]:
    """Build one histogram per label set (``le`` removed) from raw series."""
    by_key: dict[Labels, dict[float, float]] = {}
    split = _BUCKETS.get
    for labels, value in buckets.items():
        found = split(labels)
        if found is None:
            found = _bucket_of(labels)
        key, le = found
        if le is None:
            continue
        by_key.setdefault(key, {})[le] = value
    keys = set(by_key) | set(counts)
    out: dict[Labels, Histogram] = {}
    for key in keys:
        pts = sorted(by_key.get(key, {}).items())
        out[key] = Histogram(
            bounds=tuple(b for b, _ in pts),
            counts=tuple(c for _, c in pts),
            total=counts.get(key),
            sum=sums.get(key),
        )
    return out


def merge_histograms(hists: Iterable[Histogram]) -> Histogram | None:
    """Add histograms (engines, replicas) before any quantile is taken.

    Where bucket bounds differ, only the bounds every histogram has are kept: cumulative
    counts at shared bounds add exactly, so the merge is exact at a coarser resolution.
    A histogram without buckets makes the merged buckets unknown (count and sum still add).
    """
    hs = list(hists)
    if not hs:
        return None
    if len(hs) == 1 and all(a < b for a, b in zip(hs[0].bounds, hs[0].bounds[1:])):
        return hs[0]  # one engine's: already as a merge would give it
    common: set[float] | None = None
    for h in hs:
        common = set(h.bounds) if common is None else common & set(h.bounds)
    bounds = tuple(sorted(common or ()))
    at = [dict(zip(h.bounds, h.counts)) for h in hs]
    counts = [sum(a[b] for a in at) for b in bounds]
    totals = [h.total for h in hs]
    sums = [h.sum for h in hs]
    return Histogram(
        bounds=bounds,
        counts=tuple(counts),
        total=None if any(t is None for t in totals) else sum(t for t in totals if t is not None),
        sum=None if any(s is None for s in sums) else sum(s for s in sums if s is not None),
    )


def increase(value_now: float, value_then: float | None) -> float:
    """Counter increase, reset-aware: a counter that went down restarted from zero."""
    if value_then is None or value_now < value_then:
        return value_now
    return value_now - value_then


def series_increase(now: Mapping[Labels, float], then: Mapping[Labels, float] | None) -> dict[Labels, float]:
    """Per-series reset-aware increase; series new since ``then`` count from zero."""
    then = then or {}
    return {k: increase(v, then.get(k)) for k, v in now.items()}


def histogram_increase(now: Histogram, then: Histogram | None) -> Histogram:
    """Bucket differences between two scrapes of one series (reset-aware)."""
    if then is None or then.bounds != now.bounds:
        return now
    reset = any(b < a for a, b in zip(then.counts, now.counts))
    if not reset and now.total is not None and then.total is not None and now.total < then.total:
        reset = True
    if reset:
        return now
    return Histogram(
        bounds=now.bounds,
        counts=tuple(b - a for a, b in zip(then.counts, now.counts)),
        total=None if now.total is None or then.total is None else now.total - then.total,
        sum=None if now.sum is None or then.sum is None else max(0.0, now.sum - then.sum),
    )


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """One latency distribution as shown to the user (seconds)."""

    window: str
    """``"lifetime"`` or ``"<N>s"``."""
    count: float | None
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    bounded: tuple[str, ...] = ()
    """The percentiles (``"p50"``...) given as upper bounds from the mean (see
    :meth:`Histogram.bounded_quantile`), not interpolated."""

    def is_bound(self, name: str) -> bool:
        return name in self.bounded

    def few(self, name: str) -> bool:
        """True when the window holds too few observations for this percentile to mean much:
        fewer than 10 beyond it (p50: 20, p90: 100, p99: 1,000)."""
        q = PERCENTILES.get(name)
        return q is not None and (self.count is None or self.count * (1 - q) < 10)

    def as_dict(self) -> dict[str, object]:
        return {
            "window": self.window,
            "count": self.count,
            "mean": self.mean,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "bounded": list(self.bounded),
        }


PERCENTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def summarize(h: Histogram | None, window: str) -> LatencySummary:
    if h is None:
        return LatencySummary(window, None, None, None, None, None)
    values = {name: h.bounded_quantile(q) for name, q in PERCENTILES.items()}
    return LatencySummary(
        window=window,
        count=h.count,
        mean=h.mean(),
        p50=values["p50"][0],
        p90=values["p90"][0],
        p99=values["p99"][0],
        bounded=tuple(name for name, (_, bound) in values.items() if bound),
    )


def median(values: Iterable[float]) -> float | None:
    vs = sorted(values)
    if not vs:
        return None
    mid = len(vs) // 2
    return vs[mid] if len(vs) % 2 else (vs[mid - 1] + vs[mid]) / 2


def rate(now: float | None, then: float | None, dt: float) -> float | None:
    """Per-second rate of a counter between two scrapes; None when unknown."""
    if now is None or then is None or dt <= 0:
        return None
    return increase(now, then) / dt
