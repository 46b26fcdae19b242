"""Token lengths as vLLM's histograms give them: a distribution inside each bucket whose mean is
the histogram's own (its ``_sum`` over its ``_count``), to draw from (the headroom's synthetic
traffic, :mod:`spoc_tui.twin.headroom`) and to integrate over (the prompt tokens past a GPU's ridge,
:mod:`spoc_tui.twin.passive`): one shape for both, so that the fit reads the traffic the replay
sends."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from spoc_tui.core.metrics.stats import Histogram


@dataclass(frozen=True, slots=True)
class Lengths:
    """Lengths drawn from a cumulative histogram whose mean is the histogram's own (``_sum`` over
    ``_count``): a bucket by its count, then a point inside it, log-uniform tilted by the slope of
    the density across its neighbours (falling in a tail bucket, the more steeply the faster the
    counts fall) plus one offset common to every bucket, the offset that makes the mean exact.

    Drawn uniform inside vLLM's 1-2-5 buckets, the real CPU server's 200-token prompts came out
    14 % long and its 64-token answers 7 % (a 200-500 bucket's mean is 350, its prompts' about 260):
    the replay asked the twin for a tenth more work than the server did, and put the knee that much
    low. With one slope for every bucket the mean was right but a tail bucket's lengths spread to
    its top (the simulated L40S's computed prompt tokens: p99 3,653 against 2,542). The +Inf
    bucket: up to 1.5 times its lower edge."""

    edges: tuple[tuple[float, float], ...]
    cum: tuple[float, ...]
    """Each bucket's share of the draws, cumulated."""
    shape: tuple[float, ...]
    """Each bucket's own slope over its log-span, from its neighbours' densities."""
    tilt: float
    """The offset added to every bucket's slope (0: the shape alone)."""

    @classmethod
    def of(cls, h: Histogram) -> Lengths | None:
        edges, weights = [], []
        lo = 0.0
        for bound, (a, b) in zip(h.bounds, zip((0.0, *h.counts[:-1]), h.counts, strict=True), strict=True):
            hi = bound if math.isfinite(bound) else max(lo * 1.5, lo + 1)
            if b - a > 0:
                edges.append((max(1.0, min(lo, hi)), max(1.0, hi)))
                weights.append(b - a)
            lo = bound
        total = sum(weights)
        if total <= 0:
            return None
        shares = [w / total for w in weights]
        out = cls(tuple(edges), tuple(itertools.accumulate(shares)), _slopes(edges, shares), 0.0)
        target = h.mean()
        if target is None:
            return out

        def mean_at(t: float) -> float:
            return replace(out, tilt=t).mean()

        low, high = -60.0, 60.0
        if mean_at(low) >= target:
            return replace(out, tilt=low)
        if mean_at(high) <= target:
            return replace(out, tilt=high)
        tilt = 0.0
        for _ in range(60):
            tilt = (low + high) / 2
            low, high = (tilt, high) if mean_at(tilt) < target else (low, tilt)
        return replace(out, tilt=tilt)

    def mean(self) -> float:
        prev = 0.0
        out = 0.0
        for c, (a, b), s in zip(self.cum, self.edges, self.shape, strict=True):
            out += (c - prev) * _tilted_mean(a, b, s + self.tilt)
            prev = c
        return out

    def excess(self, room: float) -> float:
        """The tokens a length has past ``room`` on average, ``E[max(0, x - room)]`` (0 where
        none reaches it): the prompt tokens a step computes past a GPU's ridge."""
        prev = 0.0
        out = 0.0
        for c, (a, b), s in zip(self.cum, self.edges, self.shape, strict=True):
            out += (c - prev) * _tilted_excess(a, b, s + self.tilt, room)
            prev = c
        return out

    def at_many(self, qs: Sequence[float]) -> list[int]:
        """:meth:`at` of each quantile, the same lengths: compiled where the replays are
        (:mod:`spoc_tui.twin.replaykernel`; a replay's rows draw three each)."""
        from spoc_tui.twin.fastreplay import kernel

        k = kernel()
        if k is None or len(qs) < 64:
            return [self.at(q) for q in qs]
        import numpy as np  # a replay's, not the CLI's

        lo, hi = zip(*self.edges, strict=True)
        got: list[int] = k.lengths_at(
            np.asarray(qs, np.float64), np.asarray(self.cum, np.float64), np.asarray(lo, np.float64),
            np.asarray(hi, np.float64), np.asarray(self.shape, np.float64), float(self.tilt),
        ).tolist()  # fmt: skip
        return got

    def draw(self, rng: random.Random) -> int:
        return self.at(rng.random())

    def at(self, q: float) -> int:
        """The length at quantile ``q`` (0-1): its bucket by the counts, its place inside by the
        tilted log-uniform. One ``q`` for two histograms draws a pair in step (a long prompt with
        a long computed part)."""
        k = min(bisect.bisect_left(self.cum, q * self.cum[-1]), len(self.edges) - 1)
        below = self.cum[k - 1] if k else 0.0
        v = min(1.0, max(0.0, (q * self.cum[-1] - below) / max(self.cum[k] - below, 1e-12)))
        a, b = self.edges[k]
        t = self.shape[k] + self.tilt
        u = v if abs(t) < 1e-9 else math.log1p(v * math.expm1(t)) / t
        return max(1, round(a * math.pow(b / a, u)))


MAX_SLOPE = 8.0
"""The steepest a bucket's own slope over its log-span is taken (its density e^8 times as high at
one edge as at the other)."""


def _slopes(edges: Sequence[tuple[float, float]], shares: Sequence[float]) -> tuple[float, ...]:
    """Each bucket's slope over its log-span: the log-density's slope between its neighbours'
    centres (a bucket at either end: between itself and its one neighbour), times its log-width."""
    width = [math.log(b / a) if b > a else 0.0 for a, b in edges]
    centre = [math.log(a) + w / 2 for (a, _), w in zip(edges, width, strict=True)]
    dens = [math.log(s / w) if w > 0 and s > 0 else None for s, w in zip(shares, width, strict=True)]
    out = []
    for k, w in enumerate(width):
        i, j = max(0, k - 1), min(len(edges) - 1, k + 1)
        di, dj = dens[i], dens[j]
        if w <= 0 or i == j or di is None or dj is None or centre[j] <= centre[i]:
            out.append(0.0)
            continue
        out.append(max(-MAX_SLOPE, min(MAX_SLOPE, (dj - di) / (centre[j] - centre[i]) * w)))
    return tuple(out)


def _tilted_mean(a: float, b: float, t: float) -> float:
    """The mean of ``a * (b/a)**u`` for u on [0, 1] with density proportional to ``exp(t u)``."""
    if b <= a:
        return a
    r = math.log(b / a)
    # E[exp(r u)] = t / (e^t - 1) * (e^(t+r) - 1) / (t + r), each ratio at its limit near 0
    first = 1.0 if abs(t) < 1e-9 else t / math.expm1(t)
    second = 1.0 if abs(t + r) < 1e-9 else math.expm1(t + r) / (t + r)
    return a * first * second


def _tilted_excess(a: float, b: float, t: float, room: float) -> float:
    """``E[max(0, x - room)]`` for ``x = a * (b/a)**u``, u on [0, 1] with density proportional to
    ``exp(t u)`` (the shape :func:`_tilted_mean` averages)."""
    if b <= room:
        return 0.0
    if b <= a:
        return a - room
    r = math.log(b / a)
    u0 = min(1.0, max(0.0, math.log(room / a) / r)) if room > a else 0.0

    def above(s: float) -> float:  # the integral of exp(s u) over [u0, 1]
        if abs(s) < 1e-9:
            return 1.0 - u0
        return math.exp(s * u0) * math.expm1(s * (1.0 - u0)) / s

    whole = 1.0 if abs(t) < 1e-9 else math.expm1(t) / t
    return max(0.0, (a * above(t + r) - room * above(t)) / whole)
