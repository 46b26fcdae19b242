"""When requests come: how even the arrivals a server saw were, read from its counters, and
arrival times drawn to match, for the headroom's replay (:mod:`spoc_tui.twin.headroom`).

vLLM counts what ended (``request_success_total``), not what arrived. What arrived between two
scrapes is what ended plus the change in what is inside (running and waiting): a scrape's own
counter and gauges give it, with no clock inside the server.

How even they came is read over bins of 5, 10, 15 and 20 s, from the counts' second differences
(a Hadamard factor: 1 for a Poisson stream whatever its rate, and a rate that swells over minutes
hardly moves it, where neighbouring bins' first differences read 1.3-2.9 at 15-20 s on a swelling
closed loop). Users who wait for their answer before their next turn send them more evenly than
Poisson, and the more so the longer the bin (a bounded population): on the simulated A100, a closed
loop of 8 to 48 users thinking 2-8 s read about 0.8 at 5 s and 0.4 at 20 s, the median over the
four scales 0.34-0.65 over ten seeds, where open traffic read 0.71-1.54 over twenty. One scale
alone misreads: the benchmark's closed loop changes its users every 10 s, so every other 5 s bin
holds the new users' first turns, and one seed read 1.53 at 5 s, 0.36-0.66 at the others.

The headroom's replay draws a swelling traffic's arrivals window by window, Poisson within each
(as before) unless the factor's median is surely under 1 (:data:`EVEN_SIGMAS`); then as a
renewal process whose intervals' squared coefficient of variation is that median. Why: replayed as
Poisson, the closed loop's traffic read its knee 2-12 % low (benchmarks/README.md, the error
budget).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

SCALES_S = (5.0, 10.0, 15.0, 20.0)
"""The bins the arrivals' evenness is read over (a monitor scraping every second sums them)."""
MIN_TRIPLES = 12
"""A scale with fewer runs of three neighbouring bins than this is not read."""
MIN_SCALES = 2
"""Fewer scales read than this: the arrivals' evenness is not read (Poisson)."""
MIN_MEAN = 2.0
"""Fewer arrivals a bin than this on average: that scale is not read (the counts say little)."""
EVEN_SIGMAS = 2.0
"""The arrivals are replayed evener than Poisson only where their factor's median over the scales
is under 1 by more than this many of its sampling errors (:attr:`Evenness.sampling`; over ten
minutes, under 0.69). On the simulator (benchmarks/headroom.py's traffic, seeds 1-10), open
traffic read 0.71-1.54 over 23 runs, its Poisson replay then kept to the digit; the closed loop
0.34-0.65 over 10."""
CV2_RANGE = (0.1, 10.0)
"""The squared coefficient of variation a replay's intervals may take."""


@dataclass(frozen=True, slots=True)
class Evenness:
    """How even the arrivals came: the Hadamard factor of their counts at each scale read, and
    their median (1 for a Poisson stream; under 1 more even)."""

    factor: float
    """The median over the scales read."""
    scales: tuple[tuple[float, float, int], ...]
    """Each scale read: (bin seconds, factor, runs of three bins it rests on)."""

    @property
    def sampling(self) -> float:
        """The factor's relative sampling error, from the finest scale's runs (about sqrt(4 /
        runs): each run's squared second difference over six times the mean is about a
        chi-square of one degree, and neighbouring runs share two bins)."""
        return math.sqrt(4.0 / self.scales[0][2])

    @property
    def spread(self) -> float:
        """How unsure the factor is, in log terms: the scales' own disagreement (which scale a
        replay at speed s should honour is not known), and at least its sampling error."""
        logs = [math.log(max(f, 1e-6)) for _, f, _ in self.scales]
        return max(self.sampling, statistics.pstdev(logs) if len(logs) > 1 else 0.0)

    @property
    def even(self) -> bool:
        """Evener than Poisson beyond the counts' own chance (:data:`EVEN_SIGMAS`)."""
        return self.factor <= 0 or math.log(self.factor) < -EVEN_SIGMAS * self.sampling

    @property
    def bursty(self) -> bool:
        """Burstier than Poisson beyond the counts' own chance (:data:`EVEN_SIGMAS`). Said only of
        a steady traffic: a swell's curvature over a 20 s bin reads as a little burstiness."""
        return self.factor > 0 and math.log(self.factor) > EVEN_SIGMAS * self.sampling

    def cv2(self, draw: random.Random | None = None, steady: bool = False) -> float:
        """The squared coefficient of variation of a replay's intervals: the factor (drawn about
        it by its :attr:`spread` for a draw of the headroom) where :attr:`even` (or, of a
        ``steady`` traffic, :attr:`bursty`), else 1 (Poisson)."""
        if not (self.even or (steady and self.bursty)):
            return 1.0
        f = self.factor if draw is None else self.factor * math.exp(draw.gauss(0.0, self.spread))
        return clamp_cv2(f)

    def text(self) -> str:
        """``0.45 over 5-20 s bins (0.81, 0.52, 0.41, 0.38)``."""
        each = ", ".join(f"{f:.2f}" for _, f, _ in self.scales)
        return f"{self.factor:.2f} over {self.scales[0][0]:.0f}-{self.scales[-1][0]:.0f} s bins ({each})"


class FlowLog:
    """Each scrape's requests finished so far and inside now, back over ``span_s``."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self.marks: deque[tuple[float, float, float]] = deque()

    def add(self, t: float, finished: float | None, inside: float | None) -> None:
        if finished is None or inside is None:
            return
        self.marks.append((t, finished, inside))
        while len(self.marks) > 2 and t - self.marks[1][0] >= self.span_s:
            self.marks.popleft()

    def evenness(self) -> Evenness | None:
        """How even the arrivals over the log came (:class:`Evenness`), or None where fewer than
        :data:`MIN_SCALES` scales could be read (too short or too thin a log)."""
        read = []
        for s in SCALES_S:
            f, runs = hadamard_factor(bins_of(self.marks, s))
            if f is not None:
                read.append((s, f, runs))
        if len(read) < MIN_SCALES:
            return None
        return Evenness(statistics.median(f for _, f, _ in read), tuple(read))


def bins_of(marks: Iterable[tuple[float, float, float]], bin_s: float) -> list[tuple[float, float]]:
    """Consecutive bins of at least ``bin_s``, each ``(length, arrivals)``: the requests finished
    in it plus the change in those inside (a bin read at two slightly different moments by the
    counter and the gauges can come out a request short: never below 0). A counter that went back
    (the server restarted) starts the bins again."""
    out: list[tuple[float, float]] = []
    it = iter(marks)
    start = next(it, None)
    if start is None:
        return out
    for mark in it:
        if mark[1] < start[1]:  # the counter went back: the server restarted
            start = mark
            continue
        if mark[0] - start[0] >= bin_s * (1 - 1e-6):
            out.append((mark[0] - start[0], max(0.0, (mark[1] - start[1]) + (mark[2] - start[2]))))
            start = mark
    return out


def hadamard_factor(bins: Sequence[tuple[float, float]]) -> tuple[float | None, int]:
    """The Hadamard factor of ``bins`` (``(length, arrivals)``): the mean squared second difference
    of three neighbouring bins' counts over six times their mean (1 for a Poisson stream; a linear
    trend cancels), over the runs whose bins' lengths are within a tenth of each other, and how
    many runs that was. None under :data:`MIN_TRIPLES` runs or :data:`MIN_MEAN` a bin."""
    runs = [
        (a, b, c)
        for (la, a), (lb, b), (lc, c) in zip(bins, bins[1:], bins[2:], strict=False)
        if max(la, lb, lc) - min(la, lb, lc) <= 0.1 * max(la, lb, lc)
    ]
    if len(runs) < MIN_TRIPLES:
        return None, len(runs)
    mean = statistics.fmean(a + b + c for a, b, c in runs) / 3
    if mean < MIN_MEAN:
        return None, len(runs)
    return statistics.fmean((c - 2 * b + a) ** 2 for a, b, c in runs) / (6 * mean), len(runs)


def clamp_cv2(cv2: float) -> float:
    lo, hi = CV2_RANGE
    return min(hi, max(lo, cv2))


def renewal_times(rates: Sequence[float], span_s: float, cv2: float, rng: random.Random) -> Iterator[float]:
    """Arrival times over ``span_s``, the windows of ``rates`` one after the other (each
    ``span_s / len(rates)`` long at its rate): a renewal process of unit-mean gamma intervals
    whose squared coefficient of variation is ``cv2``, run on the clock of the expected arrivals
    (a window at rate r passes r of it a second), so that every window holds its rate and the
    arrivals are as even as ``cv2`` across the windows' edges."""
    if not rates:
        return
    width = span_s / len(rates)
    shape = 1.0 / cv2
    due = rng.gammavariate(shape, cv2) * rng.random()  # about where a stream already running is
    passed = 0.0
    for k, rate in enumerate(rates):
        if rate <= 0:
            continue
        end = passed + rate * width
        while due < end:
            yield k * width + (due - passed) / rate
            due += rng.gammavariate(shape, cv2)
        passed = end


def poisson_windows(rates: Sequence[float], span_s: float, rng: random.Random) -> Iterator[float]:
    """Arrival times over ``span_s``, the windows of ``rates`` one after the other (each
    ``span_s / len(rates)`` long), Poisson at its rate within each."""
    width = span_s / len(rates)
    t, k = 0.0, 0
    while k < len(rates):
        end = (k + 1) * width
        rate = rates[k]
        gap = rng.expovariate(rate) if rate > 0 else math.inf
        if t + gap >= end:  # memoryless: the next window starts afresh at its own rate
            t, k = end, k + 1
            continue
        t += gap
        yield t


def gamma_times(rate: float, span_s: float, cv2: float, rng: random.Random) -> Iterator[float]:
    """Arrival times over ``span_s`` of a steady renewal process at ``rate`` whose gamma intervals'
    squared coefficient of variation is ``cv2`` (1: Poisson), begun as a stream already running."""
    shape = 1.0 / cv2
    scale = 1.0 / (rate * shape)
    t = rng.gammavariate(shape, scale) * rng.random()
    while t < span_s:
        yield t
        t += rng.gammavariate(shape, scale)
