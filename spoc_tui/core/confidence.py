"""How sure a step's figures are: 95 % intervals that hold for the data as it is.

Two methods, each where it is valid:

- **Per-request percentiles** (TTFT, TPOT, E2E: one value per request, requests independent):
  the distribution-free order-statistic interval. The number of samples below the true
  quantile ``x_q`` is Binomial(n, q), so the ranks ``l`` and ``u`` with
  ``P(B <= l - 1) <= 2.5 %`` and ``P(B >= u) <= 2.5 %`` give ``X(l) <= x_q <= X(u)`` with at
  least 95 % confidence, whatever the distribution. With too few samples a side does not exist
  (the p99 of fewer than 368 samples has no upper bound at 95 %, the p90 of fewer than 36): that side is ``None``, and a
  verdict that needs it is inconclusive.
- **Everything that pools or counts** (ITL gaps, correlated within a request; request rate,
  output tokens/s, goodput; means): a block bootstrap over *time*. The step's window is cut
  into blocks (``steps.BLOCKS``, by when each request finished); each replicate gives every
  block a weight ~ Poisson(1) and recomputes the figure from the weighted requests, so a
  request's gaps stay together and so do requests that ran in the same batch at the same
  moment (resampling requests one by one made ITL intervals far too narrow: 39-70 % coverage
  on the simulator). Totals over the fixed window are rescaled to the number of blocks
  (the fixed-size bootstrap). The interval is the 2.5-97.5 % range of :data:`REPLICATES`
  replicates (seeded: the same step gives the same interval).
- Per-request percentiles take the hull of the two (order statistics say when a side cannot be
  bounded; the block bootstrap widens where requests of one moment move together).
- The error rate: Clopper-Pearson (exact for independent requests).

``benchmarks/knee_search.py`` measures how often these intervals hold the truth.

Everything here is pure (NumPy only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

LEVEL = 0.95
REPLICATES = 400

Values = Sequence[float] | np.ndarray
"""Values to resample: a list, or an array laid out once (a step's pooled gaps)."""
Owners = Sequence[int] | np.ndarray
"""Each value's request (its index)."""
Interval = tuple[float | None, float | None]
"""(low, high); ``None`` where the sample is too small to bound that side."""


def binom_cdf(n: int, p: float) -> np.ndarray:
    """``P(Binomial(n, p) <= k)`` for k = 0..n, in log space (no overflow for large n)."""
    k = np.arange(n + 1)
    if p <= 0:
        return np.ones(n + 1)
    if p >= 1:
        return np.where(k >= n, 1.0, 0.0)
    log_fact = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, n + 1)))))
    log_pmf = log_fact[n] - log_fact[k] - log_fact[n - k] + k * math.log(p) + (n - k) * math.log1p(-p)
    cdf: np.ndarray = np.minimum(np.cumsum(np.exp(log_pmf)), 1.0)
    return cdf


def order_stat_ranks(n: int, q: float, level: float = LEVEL) -> tuple[int | None, int | None]:
    """1-based ranks (l, u) of the order statistics bounding the q-quantile of n samples, each
    side missing (None) when n is too small for it."""
    if n <= 0:
        return None, None
    alpha = (1 - level) / 2
    cdf = binom_cdf(n, q)
    # lower: the largest l with P(B <= l - 1) <= alpha (then P(X(l) > x_q) <= alpha)
    below = np.flatnonzero(cdf <= alpha)
    lo = int(below[-1]) + 1 if below.size else None
    # upper: the smallest u with P(B <= u - 1) >= 1 - alpha (then P(X(u) < x_q) <= alpha)
    above = np.flatnonzero(cdf >= 1 - alpha)
    u = int(above[0]) + 1 if above.size else None
    return lo, u if u is not None and u <= n else None


def proportion_interval(k: int, n: int, level: float = LEVEL) -> Interval:
    """Clopper-Pearson (exact) interval of a proportion: k of n (the error rate). 0 errors in 40
    requests bound the error rate to 0-8.8 %, not to 0."""
    if n <= 0:
        return None, None
    alpha = (1 - level) / 2

    def solve(target: Callable[[float], bool]) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            if target(mid):
                hi = mid
            else:
                lo = mid
        return hi

    # lower: the p where P(B >= k) = alpha; upper: the p where P(B <= k) = alpha
    low = 0.0 if k == 0 else solve(lambda p: 1 - float(binom_cdf(n, p)[k - 1]) >= alpha)
    high = 1.0 if k == n else solve(lambda p: float(binom_cdf(n, p)[k]) <= alpha)
    return low, high


def quantile_interval(values: Sequence[float], q: float, level: float = LEVEL) -> Interval:
    """Distribution-free interval for the q-quantile of independent samples."""
    n = len(values)
    lo_rank, hi_rank = order_stat_ranks(n, q, level)
    xs = np.sort(np.asarray(values, dtype=float))
    return (
        float(xs[lo_rank - 1]) if lo_rank is not None else None,
        float(xs[hi_rank - 1]) if hi_rank is not None else None,
    )


@dataclass(frozen=True)
class Resampler:
    """Poisson-bootstrap weights for the requests of one step: ``weights[b, i]`` is request i's
    weight in replicate b."""

    weights: np.ndarray
    scale: np.ndarray
    _units: int = 0
    """Per replicate: units / the replicate's total unit weight, which turns Poisson weights into
    the fixed-size (multinomial) bootstrap that a total over a fixed window needs."""
    block_of: np.ndarray | None = None
    """With :meth:`for_blocks`: each request's block (``weights[:, i]`` is
    ``block_weights[:, block_of[i]]``)."""
    block_weights: np.ndarray | None = None

    @classmethod
    def for_requests(cls, n: int, seed: int, replicates: int = REPLICATES) -> Resampler:
        """Every request resampled on its own (independent requests)."""
        rng = np.random.default_rng(seed)
        w = rng.poisson(1.0, size=(replicates, n)).astype(float)
        return cls(w, _scale(w), n)

    @classmethod
    def for_blocks(cls, block_of: Sequence[int], seed: int, replicates: int = REPLICATES) -> Resampler:
        """Requests resampled in blocks (``block_of[i]``: request i's block): a block's requests
        share their weight, so whatever they share (the batch they ran in, the queue they met)
        counts once, as it does between one run and the next."""
        blocks = np.asarray(block_of, dtype=int)
        n_blocks = int(blocks.max()) + 1 if blocks.size else 0
        rng = np.random.default_rng(seed)
        w = rng.poisson(1.0, size=(replicates, n_blocks)).astype(float)
        used = int(np.unique(blocks).size) if blocks.size else 0
        if not blocks.size:
            return cls(np.zeros((replicates, 0)), _scale(w), used)
        return cls(w[:, blocks], _scale(w), used, blocks, w)

    def widening(self) -> float:
        """The factor a percentile interval is stretched by (about its median) for resampling few
        units: ``sqrt(m / (m - 1)) * t(m - 1) / z``, the bootstrap's variance bias and the
        Student correction for m units (1.29 for 8 users, 1.10 for 20 blocks). Without it the
        intervals held the truth in 88-92 % of simulated steps, not 95 %."""
        m = self._units
        if m < 3:
            return 1.0
        return math.sqrt(m / (m - 1)) * t_quantile(m - 1) / Z95

    def interval(self, estimates: np.ndarray, level: float = LEVEL) -> Interval:
        finite = estimates[np.isfinite(estimates)]
        if finite.size < 0.9 * estimates.size or finite.size == 0:
            return None, None
        a = (1 - level) / 2
        lo, mid, hi = np.quantile(finite, [a, 0.5, 1 - a])
        k = self.widening()
        low, high = float(mid - k * (mid - lo)), float(mid + k * (hi - mid))
        if finite.min() >= 0:  # a latency, a rate, a count: the widening never makes it negative
            low = max(0.0, low)
        return low, high

    def total(self, per_request: Sequence[float], scale: float = 1.0) -> Interval:
        """Interval of ``scale * sum(per_request)`` (counts and token totals over a fixed window)."""
        x = np.asarray(per_request, dtype=float)
        return self.interval(self.weights @ x * self.scale * scale)

    def ratio(self, numer: Sequence[float], denom: Sequence[float]) -> Interval:
        """Interval of ``sum(numer) / sum(denom)`` (a mean, an error rate)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.interval((self.weights @ np.asarray(numer, float)) / (self.weights @ np.asarray(denom, float)))

    def pooled_quantiles(self, values: Values, owner: Owners, qs: Sequence[float]) -> list[Interval]:
        """Intervals of the q-quantiles of values pooled over requests (``owner[j]`` is the index
        of the request value j belongs to): a request's values are resampled together.

        Each replicate's weighted quantile is the first sorted value whose cumulative weight
        reaches q x the replicate's total. The weights are whole numbers (Poisson), so the
        cumulative weights are worked out exactly, and only over a window of the sorted values
        around the quantile (what the replicates' quantiles can reach), from each replicate's
        weight below it: the same values as the cumulative sums over every value (which took a
        predicted ramp's summaries most of their time). The window's sums are whole numbers,
        summed as 32-bit integers (half the time of floats, the same values)."""
        if len(values) == 0:
            return [(None, None) for _ in qs]
        vals = np.asarray(values, dtype=float)
        order = np.argsort(vals)  # not stable: ties have one value, whichever is found first
        xs = vals[order]
        own = np.asarray(owner, dtype=np.intp)[order]
        w = self.weights
        n, n_req = xs.size, w.shape[1]
        totals = w @ np.bincount(own, minlength=n_req).astype(float)
        est = np.full((len(qs), w.shape[0]), np.nan)
        live = totals > 0
        if self.block_of is not None and self.block_weights is not None and self.block_weights.shape[1] <= MOST_BLOCKS:
            found = _first_reaching(self.block_of[own], self.block_weights, [q * totals for q in qs])
            for qi, idx in enumerate(found):
                est[qi, live] = xs[np.minimum(idx, n - 1)[live]]
            return [self.interval(e) for e in est]
        whole = w.astype(np.int32)
        for qi, q in enumerate(qs):
            target = q * totals
            half = max(128, n // 64)
            while True:
                lo, hi = max(0, int(q * n) - half), min(n, int(q * n) + half)
                base = w @ np.bincount(own[:lo], minlength=n_req).astype(float)
                cum = np.cumsum(whole[:, own[lo:hi]], axis=1, dtype=np.int32)
                reached = cum[:, -1] + base >= target if hi > lo else np.zeros(len(target), bool)
                if (lo == 0 or np.all((base < target) | ~live)) and (hi == n or np.all(reached | ~live)):
                    break
                half *= 4
            # base is a whole number and target q x one, far from it where not one: the same test
            idx = np.minimum(lo + (cum < (target - base)[:, None]).sum(axis=1), n - 1)
            est[qi, live] = xs[idx[live]]
        return [self.interval(e) for e in est]

    def woodruff(self, values: Values, owner: Owners, qs: Sequence[float]) -> list[Interval]:
        """Woodruff intervals of pooled q-quantiles: the standard error of the empirical CDF at
        the estimate, ``F(x_q)``, comes from the resampling (so it carries the correlation of
        a request's values and of one moment's requests), and the interval is the values at
        ``q -/+ 1.96 se`` of the pooled sample. Percentile-bootstrap intervals of a tail quantile
        are too narrow (the replicates cannot reach past the sample's own extremes: 85-89 %
        coverage of ITL p99 on the simulator); inverting the CDF's interval is not. A side
        beyond the sample (``q + 1.96 se`` at or past the top) cannot be bounded: None."""
        if len(values) == 0:
            return [(None, None) for _ in qs]
        xs = np.asarray(values, dtype=float)
        own = np.asarray(owner, dtype=int)
        n_req = self.weights.shape[1]
        per_req = np.bincount(own, minlength=n_req).astype(float)  # values per request
        tot = self.weights @ per_req
        keep = tot > 0
        sorted_xs = np.sort(xs)
        n = xs.size
        z = Z95 * self.widening()
        out: list[Interval] = []
        for q in qs:
            xq = float(np.percentile(xs, q * 100))
            below = np.bincount(own, weights=(xs <= xq).astype(float), minlength=n_req)
            p_b = (self.weights[keep] @ below) / tot[keep]
            se = float(np.std(p_b)) if p_b.size > 1 else 0.0
            lo_p, hi_p = q - z * se, q + z * se
            lo = float(sorted_xs[max(0, math.floor(lo_p * n) - 1)]) if lo_p * n >= 1 else None
            hi = float(sorted_xs[min(n - 1, math.ceil(hi_p * n))]) if hi_p * n < n - 1 else None
            out.append((lo, hi))
        return out

    def pooled_mean(self, values: Values, owner: Owners, n_requests: int) -> Interval:
        sums = np.zeros(n_requests)
        counts = np.zeros(n_requests)
        np.add.at(sums, np.asarray(owner, dtype=int), np.asarray(values, dtype=float))
        np.add.at(counts, np.asarray(owner, dtype=int), 1.0)
        return self.ratio(sums.tolist(), counts.tolist())


MOST_BLOCKS = 256
"""A pooled percentile's replicates are searched block by block (:func:`_first_reaching`) up to
this many blocks; past it (a request its own unit) over a window of the sorted values."""


def _first_reaching(block: np.ndarray, weights: np.ndarray, targets: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Per target and replicate r, the first position i of the sorted values whose cumulative
    weight (each value weighing its block's ``weights[r, block[i]]``) reaches ``target[r]``;
    ``len(block)`` where none does. The values are cut into cells of :data:`CELL` positions; the
    weight at each cell's end is its blocks' counts so far times their weights (one matrix
    product for every replicate), which finds each replicate's cell, and only inside that cell are
    the weights summed value by value. Whole numbers (Poisson weights, counts), so the positions
    are the sums over every value's to the last one, where those sums took most of a replayed
    step's summary."""
    n, k = block.size, weights.shape[1]
    reps = weights.shape[0]
    cells = -(-n // CELL)
    counts = np.bincount((np.arange(n) // CELL) * k + block, minlength=cells * k).reshape(cells, k)
    at_end = np.cumsum(counts, axis=0).astype(float) @ weights.T  # cells x replicates
    whole = weights.astype(np.int64)
    rows = np.arange(reps)
    offsets = np.arange(CELL)
    out = []
    for target in targets:
        cell = (at_end < target[None, :]).sum(axis=0)  # the first cell reaching it (cells: none)
        found = cell < cells
        c = np.minimum(cell, cells - 1)
        base = np.where(c > 0, at_end[np.maximum(c - 1, 0), rows], 0.0)
        pos = c[:, None] * CELL + offsets[None, :]
        inside = pos < n
        w = np.where(inside, whole[rows[:, None], block[np.minimum(pos, n - 1)]], 0)
        before = (np.cumsum(w, axis=1) + base[:, None] < target[:, None]).sum(axis=1)
        out.append(np.where(found, c * CELL + before, n))
    return out


CELL = 256
"""Positions of the sorted values per cell in :func:`_first_reaching`."""


Z95 = 1.959963984540054


T_EXACT = {1: 12.706204736174705, 2: 4.302652729749464}
"""Student's 97.5 % quantile where the expansion falls short (it read 9.7 and 4.17 at 1 and 2
degrees of freedom: a step of three users' interval 3 % too narrow)."""


def t_quantile(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom: exact at 1 and 2, else
    the Cornish-Fisher expansion (within 1 % of the exact value from 3 degrees of freedom up)."""
    if df in T_EXACT:
        return T_EXACT[df]
    z, v = Z95, float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def _scale(unit_weights: np.ndarray) -> np.ndarray:
    total = unit_weights.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out: np.ndarray = np.where(total > 0, unit_weights.shape[1] / total, np.nan)
    return out


def hull(a: Interval, b: Interval) -> Interval:
    """The smallest interval holding both; a side missing from ``a`` (the sample cannot bound it)
    stays missing."""
    lo = None if a[0] is None else (a[0] if b[0] is None else min(a[0], b[0]))
    hi = None if a[1] is None else (a[1] if b[1] is None else max(a[1], b[1]))
    return lo, hi


Decision = Literal["meets", "breaks", "inconclusive"]
"""A figure held against its limit: its interval lies within it, wholly beyond it, or neither."""


def decide(value: float | None, interval: Interval, limit: float) -> Decision:
    """A limit is met when the whole interval lies at or below it, broken when the whole interval
    lies above it; otherwise (or without a value, or with a side missing) it is not decided."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "inconclusive"
    lo, hi = interval
    if hi is not None and hi <= limit:
        return "meets"
    if lo is not None and lo > limit:
        return "breaks"
    return "inconclusive"


def min_samples_for_upper_bound(q: float, level: float = LEVEL) -> int:
    """How many independent samples it takes before the q-quantile has an upper bound at all."""
    alpha = (1 - level) / 2
    return math.ceil(math.log(alpha) / math.log(q))


class PooledPercentile:
    """``np.percentile`` (its default, linear method) of a multiset of runs of values, each run
    taken as often as a resample picks it, without gathering the values: the runs' values are
    sorted once, and a percentile needs only the two order statistics beside it, read from the
    top down for a high one (a p99 looks at its top few per cent). The same value to the last bit
    as gathering the picked runs' values and calling ``np.percentile`` on them (the bootstrap of
    a pooled ITL p99 did that 200 times a level, most of a headroom's time)."""

    def __init__(self, values: np.ndarray, owner: np.ndarray) -> None:
        """``values[i]`` belongs to run ``owner[i]``."""
        order = np.argsort(values, kind="stable")
        self.sorted = values[order]
        self.owner = owner[order]

    def percentile(self, counts: np.ndarray, total: int, pct: float) -> float:
        """The ``pct`` percentile of the values of run ``r`` taken ``counts[r]`` times each;
        ``total``: how many values that is (at least one)."""
        q = float(np.true_divide(np.asanyarray(pct), 100))
        virtual = (total - 1) * q  # numpy's virtual index for its linear method
        if virtual >= total - 1:
            lo = hi = total - 1
        elif virtual < 0:
            lo = hi = 0
        else:
            lo = math.floor(virtual)
            hi = lo + 1
        a, b = self._ranked(counts, total, lo, hi)
        if lo == hi:
            return a
        t = virtual - lo
        diff = b - a
        return float(b - diff * (1 - t)) if t >= 0.5 else float(a + diff * t)

    def _ranked(self, counts: np.ndarray, total: int, lo: int, hi: int) -> tuple[float, float]:
        """The ``lo``-th and ``hi``-th smallest of the multiset (0-based), read from the top."""
        n = len(self.sorted)
        depth = total - lo  # values at or above the lo-th, counted from the top
        m = min(n, max(64, int(n * depth / total * 1.5) + 16))
        while True:
            weights = np.cumsum(counts[self.owner[n - m :][::-1]])
            if weights[-1] >= depth or m == n:
                break
            m = min(n, m * 4)
        top = self.sorted[n - m :][::-1]
        j = np.searchsorted(weights, [total - 1 - lo, total - 1 - hi], side="right")
        return float(top[j[0]]), float(top[j[1]])
