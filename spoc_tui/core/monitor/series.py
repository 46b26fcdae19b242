"""Time series for the monitor's charts: what was seen, per key, for up to an hour.

Pure: times are given by the caller. Gaps (a source down, a figure the server does not export)
are stored as None and drawn as gaps, never joined across.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence

KEEP_S = 3600.0
NAN = float("nan")
WINDOWS_S = (60.0, 300.0, 900.0, 3600.0)
"""The spans the charts cycle through (``w``)."""


class History:
    """One key's history in two arrays of doubles (time, value; NaN is a gap): a point added is
    two floats appended, no Python object kept per point, so an hour of 31 series
    at 1 s costs the garbage collector nothing to walk (tuples in deques were 100k tracked objects,
    and a full collection over them cost ~100 ms every ~15 s). Times are the caller's and rise."""

    __slots__ = ("lo", "t", "v")

    TRIM = 1024
    """Expired points are cut from the front in batches of at least this many (a memmove)."""

    def __init__(self) -> None:
        self.t = array("d")
        self.v = array("d")
        self.lo = 0
        """The first point still kept."""

    def add(self, t: float, value: float | None, keep_s: float) -> None:
        if len(self.t) and t < self.t[-1]:  # the clock went back (a wall-clock step): start again
            del self.t[:]
            del self.v[:]
            self.lo = 0
        self.t.append(t)
        self.v.append(NAN if value is None or not math.isfinite(value) else value)
        lo = bisect_left(self.t, t - keep_s, self.lo)
        if lo >= self.TRIM:
            del self.t[:lo]
            del self.v[:lo]
            lo = 0
        self.lo = lo

    def __len__(self) -> int:
        return len(self.t) - self.lo


class Window:
    """The points of one history from ``since`` on: what a chart line reads (its latest value,
    its columns) without copying the points out."""

    __slots__ = ("history", "since")

    def __init__(self, history: History | None, since: float) -> None:
        self.history = history
        self.since = since

    def _start(self) -> int:
        h = self.history
        return 0 if h is None else bisect_left(h.t, self.since, h.lo)

    def last(self) -> float | None:
        """The latest value that is not a gap."""
        h = self.history
        if h is None:
            return None
        v = h.v
        for i in range(len(v) - 1, self._start() - 1, -1):
            x = v[i]
            if x == x:
                return x
        return None

    def columns(self, t0: float, t1: float, n: int) -> list[float | None]:
        """As :func:`columns`, read from the arrays in place."""
        h = self.history
        if n <= 0 or t1 <= t0 or h is None:
            return [] if n <= 0 or t1 <= t0 else [None] * n
        ts, vs = h.t, h.v
        i0 = bisect_left(ts, max(t0, self.since), h.lo)
        i1 = bisect_right(ts, t1, i0)
        return _bucket(zip(ts[i0:i1], vs[i0:i1]), t0, t1, n)

    def points(self) -> list[tuple[float, float | None]]:
        h = self.history
        if h is None:
            return []
        i = self._start()
        return [(t, None if v != v else v) for t, v in zip(h.t[i:], h.v[i:])]


Points = Sequence[tuple[float, float | None]] | Window
"""What a chart line is drawn from: a window of a :class:`SeriesStore`, or plain points."""


def last_value(points: Points) -> float | None:
    if isinstance(points, Window):
        return points.last()
    return next((v for _, v in reversed(points) if v is not None), None)


class SeriesStore:
    def __init__(self, keep_s: float = KEEP_S) -> None:
        self.keep_s = keep_s
        self._data: dict[str, History] = {}

    def add(self, key: str, t: float, value: float | None) -> None:
        h = self._data.get(key)
        if h is None:
            h = self._data[key] = History()
        h.add(t, value, self.keep_s)

    def window(self, key: str, since: float) -> Window:
        return Window(self._data.get(key), since)

    def keys(self, prefix: str = "") -> list[str]:
        return [k for k in self._data if k.startswith(prefix)]

    def latest(self, key: str) -> float | None:
        h = self._data.get(key)
        if h is None or not len(h):
            return None
        v = h.v[-1]
        return None if v != v else v


def columns(points: Points, t0: float, t1: float, n: int) -> list[float | None]:
    """The points as ``n`` columns spanning ``[t0, t1]``: each column the mean of the values that
    fall in it (None where there are none, so a gap stays a gap)."""
    if isinstance(points, Window):
        return points.columns(t0, t1, n)
    if n <= 0 or t1 <= t0:
        return []
    return _bucket(((t, NAN if v is None else v) for t, v in points), t0, t1, n)


def _bucket(points: Iterable[tuple[float, float]], t0: float, t1: float, n: int) -> list[float | None]:
    sums = [0.0] * n
    counts = [0] * n
    width = (t1 - t0) / n
    for t, v in points:
        if v != v or t < t0 or t > t1:
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
