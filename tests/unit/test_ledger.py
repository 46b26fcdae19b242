"""The headroom's ledger (issue 76, point 4): each minute the server served, predicted on a fit made
before it, beside what the server's own histograms said of it; in virtual time on the simulator."""

from __future__ import annotations

import copy
import math
import random
from itertools import accumulate

import pytest

from spoc_tui.core.metrics.stats import Histogram
from spoc_tui.core.monitor.model import HeadroomShown, MonitorModel
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import RequestSample
from spoc_tui.sim.options import SimOptions
from spoc_tui.sim.run import build
from spoc_tui.sim.virtual import VirtualServer
from spoc_tui.sim.watch import VirtualWatch
from spoc_tui.twin.headroom import Headroom, HeadroomLearner
from spoc_tui.twin.ledger import (
    LEDGER_S,
    Figure,
    Graded,
    Ledger,
    as_server_reads,
    prediction_interval,
    replay_values,
    to_buckets,
)
from spoc_tui.twin.live import LiveHeadroom
from spoc_tui.workload import load_workload

LIMITS = tuple(parse_sla("ttft_p99<=2s,itl_p99<=100ms"))
ITL_BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, math.inf)


def histogram_of(values: list[float], bounds: tuple[float, ...]) -> Histogram:
    counts = [sum(1 for v in values if v <= b) for b in bounds]
    return Histogram(bounds, tuple(float(c) for c in counts), float(len(values)), sum(values))


def test_a_replays_values_are_read_as_the_server_reads_its_own():
    """Counted into the server's buckets and interpolated as histogram_quantile does: the very
    figure a histogram of those values gives."""
    rng = random.Random(3)
    values = [rng.uniform(0.004, 0.06) for _ in range(500)]
    like = histogram_of([0.01], ITL_BOUNDS)
    for stat, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        assert as_server_reads(values, like, stat) == pytest.approx(histogram_of(values, ITL_BOUNDS).quantile(q))
    assert as_server_reads(values, like, "mean") == pytest.approx(sum(values) / len(values))
    assert as_server_reads([], like, "p99") is None


def test_a_figure_is_held_as_far_as_the_servers_buckets_can_tell():
    """The simulated A100 at a request a second: the server's gaps 9.8-10.0 ms, the twin's
    9.7-11.1 ms; the 10-25 ms bucket reads their p99s as 11.5 and 24.7 ms. Inside one bucket
    the interpolation is the histogram's guess: held. A server's p99 in the bucket below: not."""
    lo_edge, hi_edge = to_buckets(0.0243, 0.0249, histogram_of([0.01], ITL_BOUNDS), "p99")
    assert (lo_edge, hi_edge) == (0.01, 0.025)
    same = Figure("itl_p99", 0.0115, 0.0247, 0.0243, 0.0249, 6, lo_edge, hi_edge)
    below = Figure("itl_p99", 0.0099, 0.0247, 0.0243, 0.0249, 6, lo_edge, hi_edge)
    assert same.held and not below.held
    assert same.error == pytest.approx((0.0247 - 0.0115) / 0.0115)
    # a mean is exact (the histogram's sum over its count): no widening
    assert to_buckets(0.02, 0.03, histogram_of([0.01], ITL_BOUNDS), "mean") == (0.02, 0.03)
    # past the last finite bound: open above
    assert to_buckets(0.09, 0.2, histogram_of([0.01], ITL_BOUNDS), "p99") == (0.075, math.inf)


def test_the_interval_is_a_prediction_of_one_more_figure():
    point, lo, hi = prediction_interval([0.02] * 6)
    assert point == pytest.approx(0.02) and lo == pytest.approx(0.02) and hi == pytest.approx(0.02)
    vals = [0.018, 0.02, 0.022, 0.019, 0.021, 0.02]
    point, lo, hi = prediction_interval(vals)
    assert lo < min(vals) and hi > max(vals) and lo < point < hi  # wider than the replays' own range
    # from six replays, +- t(5) = 2.57 of their logs' spread times sqrt(1 + 1/6)
    logs = [math.log(v) for v in vals]
    m = sum(logs) / 6
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 5)
    assert math.log(hi) - math.log(point) == pytest.approx(2.571 * sd * math.sqrt(7 / 6), rel=0.01)


def test_a_replays_values_are_those_the_server_would_have_observed_in_the_window():
    """A TTFT when the first token came, each gap when its token came, inside [t0, t1)."""
    s = RequestSample(start=25.0, step=1, users=1, ok=True, ttft=4.0, e2e=8.0, itl=(1.0, 1.0, 1.0, 1.0), end=33.0)
    # first token at 29, then tokens at 30, 31, 32, 33
    assert replay_values([s], "ttft", 30.0, 90.0) == []  # its first token before the window
    assert replay_values([s], "itl", 30.0, 90.0) == [1.0, 1.0, 1.0, 1.0]
    assert replay_values([s], "itl", 31.5, 90.0) == [1.0, 1.0]
    assert replay_values([s], "ttft", 20.0, 30.0) == [4.0]
    assert replay_values([s], "e2e", 30.0, 90.0) == [8.0]
    failed = RequestSample(start=40.0, step=1, users=1, ok=False, error="http_5xx")
    assert replay_values([failed], "ttft", 30.0, 90.0) == []


def served(seconds: float, rate: float | None = None, seed: int = 1) -> tuple[VirtualServer, HeadroomLearner]:
    """The simulated A100 (48 seats) under chatbot traffic whose rate swings x0.5-x2 of 1.2/s over
    ten minutes, scraped every 5 s into a learner (virtual time)."""
    engine, _ = build(SimOptions(gpu="a100-80gb", max_num_seqs=48, dcgm_port=None, seed=seed))
    vs = VirtualServer(engine, load_workload("chatbot"), 0, seed=seed)
    watch = VirtualWatch([vs], window_s=60.0, interval_s=5.0)
    learner = HeadroomLearner(LIMITS)

    def swing(t: float) -> None:
        if round(t) % 10 == 0:
            vs.set_rate(rate if rate is not None else 1.2 * 2 ** math.sin(2 * math.pi * t / 600.0))

    for _ in watch.run(seconds, before=swing):
        learner.add(watch.now, watch.expositions[0])
    return vs, learner


@pytest.fixture(scope="module")
def swung() -> HeadroomLearner:
    """The learner after twelve minutes of :func:`served`'s swinging traffic (a copy per test)."""
    return served(720.0)[1]


def test_the_learner_keeps_each_minute_with_the_slas_histograms():
    _, learner = served(200.0, rate=1.0)
    seen = list(learner.ledger.seen)
    assert len(seen) == 3  # the first scrape opens the first window: 0-60, 60-120, 120-180
    for s in seen:
        assert s.seconds == pytest.approx(LEDGER_S)
        assert {m for m, _ in s.histograms} == {"ttft", "itl"}
        assert 30 <= s.traffic.requests <= 100 and s.traffic.prompt is not None
    assert [s.t1 for s in seen] == [pytest.approx(t) for t in (65.0, 125.0, 185.0)]
    learner.ledger.restart()  # counters that went back: the window under way is lost, not the kept
    assert len(learner.ledger.seen) == 3 and learner.ledger.take_newest() is seen[-1]
    assert not learner.ledger.seen  # the older ones waiting dropped with it


def test_a_minute_is_graded_on_a_fit_made_before_it(swung):
    """The windows before the fit could say the step time are not graded, and say why; the
    newest, after ten minutes of swinging traffic, is predicted by six replays and held."""
    learner = copy.deepcopy(swung)
    seen = list(learner.ledger.seen)
    early, none = learner.grade(seen[1])
    assert early == "the fit before it could not say the step time yet" and none is None
    got, fit = learner.grade(seen[-1], seed=1)
    assert isinstance(got, Graded) and fit is not None and fit.identified, got
    # the SLA's figures, and beside them the mean gap (the step time the fit is about)
    assert [f.key for f in got.figures] == ["ttft_p99", "itl_p99", "itl_mean"]
    for f in got.figures:
        assert f.replays == 6 and f.lo <= f.predicted <= f.hi and f.lo_edge <= f.lo and f.hi <= f.hi_edge
        assert f.held, f
    learner.graded(early)
    learner.graded(got, fit)
    summary = learner.ledger_summary()
    assert (summary.windows, summary.held) == (1, 1)
    assert summary.line().startswith("predictions held 1 of 1 windows over 1 min (median error ")
    d = summary.as_dict()
    assert set(d["by_metric"]) == {"ttft_p99", "itl_p99", "itl_mean"}
    assert d["reason"] == "1 windows skipped: the fit before it could not say the step time yet"


def test_the_summary_counts_the_last_two_hours():
    ledger = Ledger(LIMITS)
    assert ledger.summary(0.0).line() == (
        "predictions not graded yet: a window is graded once a fit made before it can predict it"
    )

    def graded(t1: float, observed: float) -> Graded:
        return Graded(t1 - 60, t1, 100, (Figure("ttft_p99", observed, 0.2, 0.15, 0.3, 6, 0.1, 0.5),))

    for t1, obs in ((600.0, 0.2), (4000.0, 0.25), (7000.0, 0.9), (8000.0, 0.2)):
        ledger.add(graded(t1, obs))
    s = ledger.summary(8000.0)  # the one at 600 s is past two hours
    assert (s.windows, s.held) == (3, 2)
    assert s.median_error == pytest.approx(0.2)  # |0.2 - 0.25| / 0.25
    assert s.line() == "predictions held 2 of 3 windows over 68 min (median error 20 %)"
    h = Headroom.none("too little traffic yet", LIMITS)
    assert "ledger" not in h.as_dict()


def test_the_monitors_worker_grades_within_its_share_and_shows_the_ledger(swung):
    """LiveHeadroom: an estimate when due; in between the newest minute graded, no more often than
    its CPU share allows; the line's ledger beside the estimate, which keeps its age."""
    now = [0.0]
    live = LiveHeadroom(LIMITS, clock=lambda: now[0], draws=0, replay_s=30.0)
    learner = copy.deepcopy(swung)
    live._learners["sim"] = learner  # the scrapes as the poller would have fed them
    now[0] = 720.0
    assert live.due()
    found, fresh = live.work(seed=1)  # the estimate first
    assert fresh and found["sim"].ledger is not None and found["sim"].ledger.windows == 0
    assert live.grade_due()  # windows wait to be graded
    found, fresh = live.work(seed=1)
    ledger = found["sim"].ledger
    assert not fresh
    assert ledger is not None and ledger.windows == 1, ledger
    assert not learner.ledger.seen and not live.grade_due()  # the older ones waiting dropped
    assert live.grade_cpu_s > 0
    shown = HeadroomShown(found["sim"].line(), found["sim"].estimate, found["sim"].identified, ledger.line(), False)
    m = MonitorModel(60.0, clock=lambda: now[0])
    m.set_headroom({"sim": HeadroomShown("headroom x5", 5.0, True)})
    now[0] += 300.0
    m.set_headroom({"sim": shown})  # a grading, not an estimate: the estimate's age stands
    assert m.headroom_age("sim") == "worked out 5 min ago" and len(m.headroom_history["sim"]) == 1


def test_a_windows_accumulated_itl_matches_its_token_times() -> None:
    s = RequestSample(start=0.0, step=1, users=1, ok=True, ttft=0.5, itl=(0.1, 0.2, 0.3))
    times = list(accumulate(s.itl, initial=0.5))[1:]
    assert times == pytest.approx([0.6, 0.8, 1.1])
    assert replay_values([s], "itl", 0.7, 1.0) == [0.2]


def missed(t0: float, observed: float, predicted: float = 0.010) -> Graded:
    """A window whose mean gap the replays put at ``predicted`` +-3 %, the server's at ``observed``."""
    return Graded(t0, t0 + 60, 100, (Figure("itl_mean", observed, predicted, predicted * 0.97, predicted * 1.03, 6,
                                            predicted * 0.97, predicted * 1.03),))  # fmt: skip


def test_two_windows_missed_the_same_way_are_a_server_that_changed():
    ledger = Ledger(LIMITS)
    ledger.add(missed(0.0, 0.0125))
    assert ledger.drift() is None  # one miss: chance
    ledger.add(missed(60.0, 0.0101))  # held
    ledger.add(missed(120.0, 0.0125))
    assert ledger.drift() is None
    ledger.add(missed(180.0, 0.0080))  # missed, but the other way
    assert ledger.drift() is None
    ledger.add(missed(240.0, 0.0075))
    assert ledger.drift() == (180.0, "itl_mean predicted 25 % and 33 % high, outside the intervals")


def test_a_server_that_changed_is_learned_again_from_the_windows_since(swung):
    """Issue 76: where the ledger's predictions miss, the headroom says it is re-learning and its
    fit forgets the windows before the change (the throttled server of benchmarks/ledger.py,
    flagged two windows after its clocks fell to 60 %)."""
    learner = copy.deepcopy(swung)
    learner.ledger.fit = learner.fit()
    before = len(learner.windows)
    learner.graded(missed(600.0, 0.0129), learner.ledger.fit)
    assert learner.relearning is None and len(learner.windows) == before
    learner.graded(missed(660.0, 0.0149), learner.ledger.fit)
    assert learner.relearning == (600.0, "itl_mean predicted 22 % and 33 % low, outside the intervals")
    assert learner.windows and all(w.t - w.seconds >= 600.0 - 1e-6 for w in learner.windows)
    assert len(learner.windows) < before and learner.ledger.fit is None  # the old fit grades no more
    h = learner.estimate(seed=1, draws=0, replay_s=30.0)
    assert not h.identified and h.reason.startswith(
        "re-learning since 2 min ago, the server no longer the one its windows showed (itl_mean predicted 22 % and "
        "33 % low, outside the intervals): the windows before forgotten: "
    ), h.reason


def test_an_interval_is_widened_by_what_the_ledger_measured():
    from spoc_tui.twin.headroom import widened_by_ledger
    from spoc_tui.twin.ledger import LedgerSummary

    h = Headroom(4.0, (3.0, 5.0), "ttft_p99", None, True, "identified", 20, None)
    good = LedgerSummary(10, 9, 3600.0, 0.3, ())
    assert widened_by_ledger(h, good) is h  # held 9 of 10: the twin's sampling is the interval
    assert widened_by_ledger(h, LedgerSummary(4, 0, 600.0, 0.3, ())) is h  # too few to say
    bad = widened_by_ledger(h, LedgerSummary(10, 6, 3600.0, 0.25, ()))
    assert bad.ci95 == (pytest.approx(2.4), pytest.approx(6.25)) and bad.estimate == 4.0
    assert bad.reason.endswith(
        "; the interval widened by the twin's median error over its last 10 windows (25 %: its predictions held 6 of them)"
    )
