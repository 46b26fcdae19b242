"""Time series for the monitor's charts: what was seen, per key, for up to an hour.

Pure: times are given by the caller. Gaps (a source down, a figure the server does not export)
are stored as None and drawn as gaps, never joined across.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

KEEP_S = 3600.0
WINDOWS_S = (60.0, 300.0, 900.0, 3600.0)
"""The spans the charts cycle through (``w``)."""


class SeriesStore:
    def __init__(self, keep_s: float = KEEP_S) -> None:
        self.keep_s = keep_s
        self._data: dict[str, deque[tuple[float, float | None]]] = {}

    def add(self, key: str, t: float, value: float | None) -> None:
        d = self._data.get(key)
        if d is None:
            d = self._data[key] = deque()
        if value is not None and not math.isfinite(value):
            value = None
        d.append((t, value))
        while d and d[0][0] < t - self.keep_s:
            d.popleft()

    def points(self, key: str, since: float) -> list[tuple[float, float | None]]:
        d = self._data.get(key)
        if not d:
            return []
        return [p for p in d if p[0] >= since]

    def keys(self, prefix: str = "") -> list[str]:
        return [k for k in self._data if k.startswith(prefix)]

    def latest(self, key: str) -> float | None:
        d = self._data.get(key)
        return d[-1][1] if d else None


def columns(points: Sequence[tuple[float, float | None]], t0: float, t1: float, n: int) -> list[float | None]:
    """The points as ``n`` columns spanning ``[t0, t1]``: each column the mean of the values that
    fall in it (None where there are none, so a gap stays a gap)."""
    if n <= 0 or t1 <= t0:
        return []
    sums = [0.0] * n
    counts = [0] * n
    width = (t1 - t0) / n
    for t, v in points:
        if v is None or t < t0 or t > t1:
            continue
        i = min(n - 1, int((t - t0) / width))
        sums[i] += v
        counts[i] += 1
    return [s / c if c else None for s, c in zip(sums, counts)]


def nice_range(lo: float, hi: float, zero: bool = True) -> tuple[float, float]:
    """A y range that holds ``[lo, hi]`` with a round top (1, 2, 2.5, 5 x 10^k); from 0 when
    ``zero`` (counts, rates, latencies), so a flicker between 9.0 and 9.9 ms reads as the small
    change it is rather than as a square wave."""
    if zero:
        lo = min(0.0, lo)
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    span = hi - lo
    mag = 10 ** math.floor(math.log10(span))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        top = math.ceil(hi / (step * mag)) * step * mag
        if top >= hi and (top - lo) <= span * 1.6 + 1e-12:
            break
    bottom = lo if zero else math.floor(lo / mag) * mag
    return bottom, top
