"""How even a server's arrivals were, read from its counters (what finished, what is inside),
and the headroom's replay drawing its arrivals that even (issue 52: the closed loop's users send
their turns more evenly than Poisson, and replayed as Poisson their traffic read the knee 2-12 %
low; benchmarks/headroom.py's error budget)."""

from __future__ import annotations

import bisect
import math
import random
import statistics
from dataclasses import replace

import pytest

from spoc_tui.core.metrics.stats import Histogram
from spoc_tui.twin.arrivals import Evenness, FlowLog, bins_of, hadamard_factor, renewal_times
from spoc_tui.twin.model import ServerConfig
from spoc_tui.twin.traffic import Traffic, TrafficRows, synth_rows

INF = math.inf


def gamma_stream(rate: float, cv2: float, span_s: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    while True:
        t += rng.gammavariate(1.0 / cv2, cv2 / rate)
        if t >= span_s:
            return out
        out.append(t)


def flow_marks(arrivals: list[float], seed: int, every_s: float = 1.0) -> list[tuple[float, float, float]]:
    """What a server's counters would say of ``arrivals`` at each scrape, every ``every_s``: the
    requests finished so far and those inside (each one served 2-12 s)."""
    rng = random.Random(seed)
    ends = sorted(a + rng.uniform(2.0, 12.0) for a in arrivals)
    marks, t = [], every_s
    while t < arrivals[-1]:
        came, done = bisect.bisect_right(arrivals, t), bisect.bisect_right(ends, t)
        marks.append((t, float(done), float(came - done)))
        t += every_s
    return marks


def factor_of(times: list[float], bin_s: float = 5.0) -> float:
    counts = [0] * (int(max(times) // bin_s) + 1)
    for t in times:
        counts[int(t // bin_s)] += 1
    f, _ = hadamard_factor([(bin_s, float(c)) for c in counts])
    assert f is not None
    return f


def log_of(arrivals: list[float], seed: int) -> FlowLog:
    log = FlowLog(span_s=1e9)
    for mark in flow_marks(arrivals, seed):
        log.add(*mark)
    return log


@pytest.mark.parametrize("cv2", [0.3, 1.0, 3.0])
def test_the_counters_say_how_even_the_arrivals_were(cv2):
    """From what finished and what is inside at each scrape alone, the arrivals' factor at every
    scale comes out as the arrivals' own (the intervals' squared coefficient of variation where a
    bin holds many): the counter of finished requests alone reads the service's spread too."""
    arrivals = gamma_stream(6.0, cv2, 6000.0, seed=1)
    log = log_of(arrivals, seed=2)
    # each bin's count is the very arrivals in it (the first bin from the first scrape, at 1 s)
    bins = bins_of(log.marks, 5.0)
    came = [bisect.bisect_right(arrivals, 1.0 + 5.0 * (k + 1)) - bisect.bisect_right(arrivals, 1.0 + 5.0 * k)
            for k in range(len(bins))]  # fmt: skip
    assert [n for _, n in bins] == came
    ev = log.evenness()
    assert ev is not None and [s for s, _, _ in ev.scales] == [5.0, 10.0, 15.0, 20.0]
    assert ev.scales[0][2] > 1000
    assert ev.factor == pytest.approx(cv2, rel=0.2)
    assert ev.even is (cv2 < 1.0)
    # the finished requests alone are not the arrivals: their bins' counts differ
    marks = flow_marks(arrivals, seed=2)
    done = [b[1] - a[1] for a, b in zip(marks[::5], marks[5::5], strict=False)]
    assert done != came[: len(done)]


def test_a_swell_is_not_evenness_and_a_bounded_population_evens_with_the_scale():
    """A Poisson stream whose rate swells between 35 % and 100 % over five minutes reads 1 from
    second differences, where first differences (an Allan factor) read it bunched at 20 s. Users
    who each send a turn every 3-10 s (a closed loop's cycle) read evener the longer the bin."""
    rng = random.Random(11)
    swell, t = [], 0.0
    while t < 6000.0:  # thinned from 8/s
        t += rng.expovariate(8.0)
        if rng.random() < 0.35 + 0.65 * (0.5 + 0.5 * math.sin(2 * math.pi * t / 300.0)):
            swell.append(t)
    counts = [sum(1 for x in swell if k * 20.0 <= x < (k + 1) * 20.0) for k in range(300)]
    allan = statistics.fmean((b - a) ** 2 for a, b in zip(counts, counts[1:], strict=False)) / (
        2 * statistics.fmean(counts)
    )
    assert 0.7 < factor_of(swell, 20.0) < 1.4 < 2.0 < allan
    users = sorted(t for u in range(40) for t in _cycles(random.Random(100 + u), 6000.0))
    ev = log_of(users, seed=12).evenness()
    assert ev is not None and ev.even
    by_scale = [f for _, f, _ in ev.scales]
    assert by_scale[0] > by_scale[-1] and by_scale[-1] < 0.5, by_scale


def _cycles(rng: random.Random, span_s: float) -> list[float]:
    t, out = rng.uniform(0.0, 10.0), []
    while t < span_s:
        out.append(t)
        t += rng.uniform(3.0, 10.0)
    return out


def test_too_little_or_too_thin_to_read_and_a_restart_starts_again():
    short = log_of(gamma_stream(6.0, 1.0, 80.0, seed=3), seed=4)
    assert short.evenness() is None  # 15 bins of 5 s read (13 runs), 10 s not (5): one scale alone
    assert hadamard_factor(bins_of(short.marks, 5.0))[1] == 13
    assert hadamard_factor(bins_of(short.marks, 10.0)) == (None, 5)
    thin = log_of(gamma_stream(0.05, 1.0, 8000.0, seed=5), seed=6)
    assert thin.evenness() is None  # a request a bin at 20 s, fewer below: the counts say little
    n = len(thin.marks)
    thin.add(3000.0, None, 1.0)  # a scrape without the counter is passed over
    assert len(thin.marks) == n
    # a counter that goes back (the server restarted) starts the bins again, no negative bin
    marks = [(0.0, 100.0, 3.0), (5.0, 110.0, 2.0), (10.0, 4.0, 1.0), (15.0, 9.0, 2.0), (20.0, 15.0, 0.0)]
    assert bins_of(marks, 5.0) == [(5.0, 9.0), (5.0, 6.0), (5.0, 4.0)]
    # bins of unequal length are not compared
    assert hadamard_factor([(5.0, 3.0), (9.0, 8.0), (5.0, 3.0)] * 30)[1] == 0


def test_the_log_keeps_the_traffics_span():
    log = FlowLog(span_s=60.0)
    for k in range(200):
        log.add(float(k), float(k), 0.0)
    assert log.marks[0][0] >= 199 - 61 and len(log.marks) <= 62


@pytest.mark.parametrize("cv2", [0.3, 1.0, 2.5])
def test_replayed_arrivals_hold_each_windows_rate_and_the_evenness_asked(cv2):
    rates = (2.0, 8.0, 0.0, 4.0) * 10
    times = list(renewal_times(rates, 4000.0, cv2, random.Random(7)))
    assert times == sorted(times) and 0 <= times[0] and times[-1] < 4000.0
    width = 100.0
    for k, rate in enumerate(rates[:8]):  # each window at its own rate
        n = sum(1 for t in times if k * width <= t < (k + 1) * width)
        assert n == pytest.approx(rate * width, abs=4 * math.sqrt(rate * width * cv2) + 1)
    assert not any(2 * width <= t < 3 * width for t in times)  # a window at rate 0 stays empty
    steady = list(renewal_times((6.0,) * 40, 8000.0, cv2, random.Random(8)))
    assert factor_of(steady) == pytest.approx(cv2, rel=0.25)


def swelling(evenness: float | None) -> Traffic:
    prompt = Histogram((100.0, 200.0, 500.0, INF), (0.0, 50.0, 100.0, 100.0), 100.0, 25_000.0)
    output = Histogram((50.0, 100.0, 200.0, INF), (10.0, 60.0, 100.0, 100.0), 100.0, 9_000.0)
    rates = tuple(6.0 * (0.35 + 0.65 * (0.5 + 0.5 * math.sin(2 * math.pi * (30 * k + 15) / 300))) for k in range(20))
    counts = [30 * r for r in rates]
    ev = None if evenness is None else Evenness(evenness, ((5.0, evenness, 100), (10.0, evenness, 49)))
    return Traffic(
        600.0, sum(counts), statistics.fmean(rates), 1.0, prompt, output, 0.3, rates=rates,
        swing=statistics.variance(counts) / statistics.fmean(counts), evenness=ev,
    )  # fmt: skip


def test_a_swelling_traffic_is_replayed_as_even_as_it_came():
    """Where the counters read the arrivals evener than open traffic does, the replay's arrivals
    come that even; where they read about 1, or nothing, Poisson within each window, the rows the
    same to the byte as before; a draw of the fit replays a value drawn from what the counts leave
    open, around it."""
    even, open_, unread = swelling(0.4), swelling(0.9), swelling(None)
    assert even.regularity() == 0.4 and open_.regularity() == unread.regularity() == 1.0
    assert even.as_dict()["arrivals_evenness"] == 0.4 and unread.as_dict()["arrivals_evenness"] is None
    span = 3000.0  # the ten minutes' windows stretched five times: bins of 5 s hold a few each
    factors = {name: factor_of([r.t for r in synth_rows(t, span, seed=9, as_it_moved=True)]) for name, t in
               (("even", even), ("unread", unread))}  # fmt: skip
    assert factors["even"] < 0.6 < 0.8 < factors["unread"], factors
    assert synth_rows(open_, 600.0, seed=9, as_it_moved=True) == synth_rows(unread, 600.0, seed=9, as_it_moved=True)
    # the same rows as asked explicitly
    assert synth_rows(even, 600.0, seed=9, as_it_moved=True) == synth_rows(unread, 600.0, 9, 16, True, 0.4)
    server = ServerConfig("m", 4096, 16, 10_000, True, None, 256, 8192, True)
    rows = TrafficRows.of(even, 1, server, replay_s=60.0)
    assert rows.cv2 == 0.4
    drawn = [rows.redrawn(seed).cv2 for seed in range(200)]
    spread = statistics.pstdev(math.log(c) for c in drawn)
    assert statistics.median(drawn) == pytest.approx(0.4, rel=0.1)
    assert even.evenness is not None and spread == pytest.approx(even.evenness.spread, rel=0.2)
    assert even.evenness.spread == pytest.approx(math.sqrt(4 / 100))  # the scales agree: the sampling error
    assert rows.redrawn(5).cv2 == rows.redrawn(5).cv2  # a draw's own, the same each time
    assert TrafficRows.of(unread, 1, server, replay_s=60.0).redrawn(5).cv2 == 1.0
    assert TrafficRows.of(open_, 1, server, replay_s=60.0).redrawn(5).cv2 == 1.0
    tiny = replace(even, evenness=Evenness(0.001, ((5.0, 0.001, 100), (10.0, 0.001, 49))))
    assert tiny.regularity() == 0.1  # kept within reason


def test_a_steady_traffic_is_replayed_poisson_unless_its_arrivals_surely_say_otherwise():
    """The requests finished per window gave a steady traffic's intervals their spread; over ten
    minutes' 19 pairs of windows that is sure to about +-40 %, and flat Poisson traffic on the
    simulator read 0.69-0.86 and was replayed that even (the headroom 11 % high). The arrivals'
    evenness decides now, either way, where it was read; the dispersion only where it was not."""
    base = replace(swelling(None), rates=(), swing=None, dispersion=0.7)
    assert base.profile() is None and base.steady_cv2() == 0.7  # nothing read: as before
    about_one = replace(base, evenness=Evenness(0.86, ((5.0, 0.86, 118), (10.0, 0.83, 58))))
    even = replace(base, evenness=Evenness(0.4, ((5.0, 0.4, 118), (10.0, 0.4, 58))))
    bursty = replace(base, evenness=Evenness(2.5, ((5.0, 2.5, 118), (10.0, 2.5, 58))))
    assert about_one.steady_cv2() == 1.0 and even.steady_cv2() == 0.4 and bursty.steady_cv2() == 2.5
    gaps = {}
    for name, t in (("about_one", about_one), ("even", even), ("bursty", bursty)):
        times = [r.t for r in synth_rows(t, 3000.0, seed=4, as_it_moved=True)]
        d = [b - a for a, b in zip(times, times[1:], strict=False)]
        gaps[name] = statistics.variance(d) / statistics.fmean(d) ** 2
    assert gaps["even"] < 0.6 < 0.8 < gaps["about_one"] < 1.2 < 2.0 < gaps["bursty"], gaps
    # a swelling traffic's burstiness is its windows' rates: its evenness is not read as bursts
    assert replace(swelling(None), evenness=bursty.evenness).regularity() == 1.0
