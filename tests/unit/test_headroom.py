"""The headroom learner (issue 52, first part): the traffic it reads from a server's counters and
histograms, the trace it draws from them again, and what it says before it can say a number.
How close its number comes is benchmarks/headroom.py's (against the knee measured on the same
simulated server)."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from spoc_tui.core.metrics.stats import Histogram
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.sim.options import SimOptions
from spoc_tui.sim.run import build
from spoc_tui.sim.virtual import VirtualServer
from spoc_tui.sim.watch import VirtualWatch
from spoc_tui.twin.headroom import Headroom, HeadroomLearner, LearnerState
from spoc_tui.twin.lengths import Lengths
from spoc_tui.twin.traffic import Traffic, synth_rows
from spoc_tui.workload import load_workload

if TYPE_CHECKING:
    from spoc_tui.twin import predict

INF = math.inf


def traffic(rate: float = 4.0, dispersion: float | None = 1.0, share: float | None = 0.5) -> Traffic:
    prompt = Histogram((100.0, 200.0, 500.0, 1000.0, INF), (0.0, 50.0, 80.0, 100.0, 100.0), 100.0, 30_000.0)
    output = Histogram((50.0, 100.0, 200.0, INF), (10.0, 60.0, 100.0, 100.0), 100.0, 9_000.0)
    return Traffic(600.0, rate * 600, rate, dispersion, prompt, output, share)


def test_the_trace_drawn_again_keeps_the_rate_the_lengths_and_the_prefix():
    rows = synth_rows(traffic(), 600.0, seed=1)
    assert len(rows) == pytest.approx(2400, rel=0.1)  # 4 requests/s for 600 s
    assert all(100 <= r.input_tokens <= 1000 for r in rows)  # inside the histogram's filled buckets
    assert all(1 <= r.output_tokens <= 200 for r in rows)
    # the shared leading blocks: half of each prompt, the same ids for every row
    first = rows[0]
    shared = int(0.5 * first.input_tokens) // 16
    assert all(r.hash_ids[:3] == (0, 1, 2) for r in rows if r.input_tokens >= 96)
    assert first.hash_ids[:shared] == tuple(range(shared))
    ts = [r.t for r in rows]
    assert ts == sorted(ts) and ts[-1] < 600.0


def test_bursty_traffic_is_drawn_burstier():
    def cv(dispersion: float) -> float:
        rows = synth_rows(traffic(dispersion=dispersion), 600.0, seed=2)
        gaps = [b.t - a.t for a, b in zip(rows, rows[1:], strict=False)]
        return statistics.pstdev(gaps) / statistics.fmean(gaps)

    assert cv(1.0) == pytest.approx(1.0, abs=0.15)  # Poisson
    assert cv(4.0) > 1.6  # bursts


def test_a_swelling_traffic_is_replayed_as_it_moved():
    """Traffic whose rate swings over minutes (a 300 s swell between 35 % and 100 % of 4/s) is
    replayed window by window at their rates, its busy minutes and its quiet ones, as the server's
    window of requests judged them. Drawn as gamma intervals of its mean rate it was another load
    (bursts of single requests at 2.7/s, never a sustained 4/s); its busiest two minutes alone
    judged only the peak. A swell barely moves the Allan factor (it compares neighbouring
    windows); the counts' index of dispersion shows it."""
    from spoc_tui.twin.traffic import swells

    rates = tuple(4.0 * (0.35 + 0.65 * (0.5 + 0.5 * math.sin(2 * math.pi * (30 * k + 15) / 300))) for k in range(20))
    counts = [30 * r for r in rates]
    swing = statistics.variance(counts) / statistics.fmean(counts)
    t = replace(traffic(rate=statistics.fmean(rates), dispersion=1.2), rates=rates, window_s=30.0, swing=swing)
    assert swing > 5 and t.profile() == rates
    rows = synth_rows(t, 120.0, seed=4, as_it_moved=True)
    assert len(rows) == pytest.approx(30 * sum(rates) * 120.0 / 600.0, rel=0.15)
    width = 120.0 / len(rates)
    busy = sum(1 for row in rows if row.t < 5 * width)  # windows 0-4: the swell's top
    quiet = sum(1 for row in rows if 5 * width <= row.t < 10 * width)  # 5-9: its bottom
    assert busy > 2 * quiet, (busy, quiet)
    # at speed s the replay asks for s times the span: the same windows, stretched
    assert len(synth_rows(t, 480.0, seed=4, as_it_moved=True)) == pytest.approx(4 * len(rows), rel=0.1)
    # a steady stream's counts (index of dispersion about 1) keep its mean rate and the gamma draw
    steady = replace(t, swing=1.1)
    assert not swells(1.1, 20) and swells(2.0, 20) and not swells(None, 20) and not swells(3.0, 3)
    assert steady.profile() is None
    assert synth_rows(steady, 120.0, seed=4, as_it_moved=True) == synth_rows(steady, 120.0, seed=4)
    assert t.as_dict()["rate_peak"] == pytest.approx(max(rates), abs=1e-3)
    assert steady.as_dict()["rate_peak"] is None and t.as_dict()["swing"] == pytest.approx(swing, abs=1e-3)


@pytest.mark.parametrize("mu", [4.3, 5.3, 6.3])
def test_lengths_drawn_again_keep_the_histograms_mean_and_buckets(mu):
    """Lengths drawn from vLLM's 1-2-5 buckets keep the histogram's mean (its _sum over _count)
    and each bucket's count. Drawn uniform inside each bucket, lognormal prompts of median 200
    came out 14 % long (the real CPU server's headroom asked its twin for a tenth more work than
    the server did, and put the knee that much low)."""
    import bisect
    import random

    rng = random.Random(7)
    values = [max(1, round(rng.lognormvariate(mu, 0.5))) for _ in range(4000)]
    bounds = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, INF)
    counts = tuple(float(sum(1 for v in values if v <= b)) for b in bounds)
    h = Histogram(bounds, counts, float(len(values)), float(sum(values)))
    lengths = Lengths.of(h)
    assert lengths is not None and lengths.mean() == pytest.approx(h.mean(), rel=1e-3)
    drawn = [lengths.draw(random.Random(11 + i)) for i in range(6000)]
    assert statistics.fmean(drawn) == pytest.approx(h.mean(), rel=0.03)
    # each bucket keeps its share (within a few standard errors of 6,000 draws)
    finite = bounds[:-1]
    for k in range(len(finite)):
        share = (counts[k] - (counts[k - 1] if k else 0.0)) / len(values)
        got = sum(1 for d in drawn if bisect.bisect_left(finite, d) == k) / len(drawn)
        assert got == pytest.approx(share, abs=0.03), (k, share, got)
    # uniform inside the buckets (the draw before) is off by more than the draw's noise
    uniform = [
        rng.uniform(bounds[k - 1] if k else 0.0, bounds[k]) for v in values for k in [bisect.bisect_left(bounds, v)]
    ]
    assert abs(statistics.fmean(uniform) / h.mean() - 1) > 0.05


def test_the_interval_holds_the_windows_own_scatter():
    """The knee a ramp would measure lies off the fit by the windows' own scatter about the model
    as well as by what the fit is unsure of: the two add in quadrature on a log scale."""
    from spoc_tui.twin.replayed import with_scatter

    assert with_scatter(5.0, (4.5, 5.5), 0.0) == ((4.5, 5.5), 0.0)
    assert with_scatter(5.0, (4.5, 5.5), math.nan) == ((4.5, 5.5), 0.0)
    (lo, hi), pct = with_scatter(5.0, (5.0, 5.0), 6.4)  # the fit sure: the scatter alone
    spread = 1.96 * 1.4826 * 0.064
    assert lo == pytest.approx(5.0 * math.exp(-spread)) and hi == pytest.approx(5.0 * math.exp(spread))
    assert pct == pytest.approx(100 * (math.exp(spread) - 1)) and 20 < pct < 21
    (lo, hi), _ = with_scatter(5.0, (4.0, 6.0), 6.4)
    assert lo == pytest.approx(5.0 * math.exp(-math.hypot(math.log(5 / 4), spread)))
    assert hi == pytest.approx(5.0 * math.exp(math.hypot(math.log(6 / 5), spread)))
    assert with_scatter(5.0, (None, 6.0), 6.4)[0][0] is None  # an open end stays open


def test_a_histogram_with_nothing_in_it_draws_no_lengths():
    assert Lengths.of(Histogram((1.0, 2.0, INF), (0.0, 0.0, 0.0), 0.0, 0.0)) is None


def test_what_each_prompt_computed_shapes_the_cached_prefix():
    """vLLM 0.13+ reports each prompt's computed tokens, its prefix-cache hits left out: a long
    context with short new text keeps that shape when drawn again. (From the cache's share alone,
    half of every prompt was new: a 1,000-token context computed 500 tokens where the server
    computed 150, and the twin broke its ITL limit at two thirds of the measured knee.)"""
    computed = Histogram((50.0, 100.0, 200.0, INF), (20.0, 90.0, 100.0, 100.0), 100.0, 8_000.0)
    rows = synth_rows(replace(traffic(), computed=computed), 600.0, seed=3)
    own = [r.input_tokens - 16 * sum(1 for h in r.hash_ids if h < 1_000_000) for r in rows]
    assert all(0 <= n < 200 + 16 for n in own)  # the computed histogram's top, and a block's rounding
    assert statistics.fmean(own) == pytest.approx(computed.mean(), abs=16)
    prompt = traffic().prompt
    assert prompt is not None and prompt.mean() == 300.0
    assert statistics.fmean(r.input_tokens for r in rows) == pytest.approx(300.0, rel=0.05)  # as long as before
    half = synth_rows(traffic(), 600.0, seed=3)
    own_half = [r.input_tokens - 16 * sum(1 for h in r.hash_ids if h < 1_000_000) for r in half]
    assert statistics.fmean(own_half) == pytest.approx(0.5 * 300.0, abs=16)  # the cache's share alone: half new


def test_a_prompt_and_its_computed_part_are_drawn_in_step():
    """A long prompt's computed part is drawn long too (one quantile for both): drawn apart, a long
    computed part met a short prompt and was cut to it, and the replay's prefills lost their tail
    (on the simulated A100 the computed tokens' mean 429 to 366, their p99 2,311 to 1,482, and the
    headroom read 23-41 % high)."""
    computed = Histogram((50.0, 100.0, 200.0, 500.0, 1000.0, INF), (0.0, 60.0, 80.0, 92.0, 100.0, 100.0), 100.0,
                         19_000.0)  # fmt: skip
    rows = synth_rows(replace(traffic(), computed=computed), 600.0, seed=5)
    own = sorted(r.input_tokens - 16 * sum(1 for h in r.hash_ids if h < 1_000_000) for r in rows)
    assert statistics.fmean(own) == pytest.approx(computed.mean(), abs=16)  # a block's rounding (apart: 136)
    assert own[int(0.95 * len(own))] > 500  # the top bucket (500-1000) keeps its 8 %


def watched(seconds: float, rates, sla: str = "ttft_p99<=2s,itl_p99<=100ms") -> HeadroomLearner:
    engine, _ = build(SimOptions(gpu="a100-80gb", max_num_seqs=48, dcgm_port=None, seed=1))
    vs = VirtualServer(engine, load_workload("chatbot"), 0, seed=1)
    w = VirtualWatch([vs], window_s=60.0, interval_s=5.0)
    learner = HeadroomLearner(tuple(parse_sla(sla)) if sla else ())
    for _ in w.run(seconds, before=lambda t: vs.set_rate(rates(t))):
        learner.add(w.now, w.expositions[0])
    return learner


def test_what_the_learner_reads_of_a_server_and_says_before_it_can_say_a_number():
    learner = watched(200.0, lambda t: 2.0)
    tr = learner.traffic()
    assert tr is not None and tr.rate == pytest.approx(2.0, rel=0.3) and tr.requests > 200
    assert tr.prompt is not None and tr.output is not None and tr.prefix_share is not None
    # the simulator reports what each prompt computed, as vLLM does: less than the prompts (the
    # chatbot's follow-up turns find their conversation cached)
    assert tr.computed is not None and tr.computed.count == tr.prompt.count
    assert (tr.computed.mean() or 0) < (tr.prompt.mean() or 0) * (1 - 0.5 * (tr.prefix_share or 0))
    assert any("histogram" in e for e in tr.estimated)
    assert learner.kv_tokens and learner.kv_tokens > 0 and learner.block_size == 16
    h = learner.estimate()
    assert not h.identified and h.estimate is None
    assert h.reason.startswith("too little traffic yet: 6 windows"), h.reason
    assert h.line().startswith("headroom: too little traffic yet")
    doc = h.as_dict()
    assert set(doc) >= {"estimate", "ci95", "unit", "binding_limit", "identified", "windows", "traffic"}
    assert doc["unit"] == "x" and doc["identified"] is False and doc["windows"] == 6
    server = learner.server()
    assert server.max_num_seqs == 256 and server.sources["max_num_seqs"] == "assumed"
    assert server.sources["num_gpu_blocks"] == "reported" and server.num_gpu_blocks * 16 == learner.kv_tokens


def test_without_an_sla_there_is_nothing_to_hold():
    h = watched(60.0, lambda t: 1.0, sla="").estimate()
    assert not h.identified and h.reason == "no SLA to hold: give --sla"


def test_a_queue_with_room_in_the_kv_cache_shows_the_seats():
    """Past its seats the server queues with KV to spare: the most it then ran is max-num-seqs,
    which the monitor was not told."""
    learner = watched(120.0, lambda t: 40.0)
    assert learner.seats == 48
    assert learner.server().sources["max_num_seqs"] == "inferred"


def test_seats_the_operator_tells_are_the_twins_and_no_longer_assumed():
    """vLLM's /metrics does not report max-num-seqs: until a queue shows them the headroom assumes
    256 and says so; told them (``spoc inspect --headroom --max-num-seqs``), it takes them, before a
    queue's, and assumes nothing."""
    assert HeadroomLearner(()).server().sources["max_num_seqs"] == "assumed"
    told = HeadroomLearner((), seats=48)
    server = told.server()
    assert server.max_num_seqs == 48 and server.sources["max_num_seqs"] == "told"
    with pytest.raises(ValueError, match="max-num-seqs must be at least 1"):
        HeadroomLearner((), seats=0)


def test_the_monitors_estimates_wait_as_long_as_their_cpu_takes_to_be_half_a_percent_of_a_core(monkeypatch):
    """Issue 52's cost: an estimate is 1-25 s of CPU by the traffic's weight, so the next waits
    until the last one's CPU is LIVE_CPU_SHARE of a core over the time since it began (never
    sooner than LIVE_REFRESH_S), and the line says when it comes and why."""
    import spoc_tui.twin.live as live

    now = [0.0]
    cpu = [100.0]
    monkeypatch.setattr(live.time, "thread_time", lambda: cpu[0])
    lh = live.LiveHeadroom(parse_sla("ttft_p99<=2s"), clock=lambda: now[0])
    lh._learners["u"] = HeadroomLearner(lh.limits)
    assert not lh.due()  # the fit has no windows yet
    now[0] = live.MIN_WINDOWS * live.WINDOW_S
    assert not lh.due()  # its windows could have closed, and have not: half a window more
    lh._learners["u"].refused.extend([None] * live.MIN_WINDOWS)  # ... unless they have: at once
    assert lh.due()
    lh._learners["u"].refused.clear()
    now[0] = (live.MIN_WINDOWS + 0.5) * live.WINDOW_S
    assert lh.due()  # no window closed (no traffic): tried, and it says why

    def refresh_taking(seconds: float, said: bool = True) -> None:
        def estimate(*_a: object) -> Headroom:
            cpu[0] += seconds
            if not said:
                return Headroom(None, (None, None), None, None, False, "not yet", 0, None)
            return Headroom(2.0, (1.5, 2.5), "ttft_p99", None, True, "identified", 20, None)

        monkeypatch.setattr(LearnerState, "estimate", estimate)
        lh.refresh()

    # no number yet (too few windows: no replay, little CPU): tried again as the next window may
    # have closed, not minutes later
    refresh_taking(0.001, said=False)
    assert lh.interval_s == live.LIVE_RETRY_S == 10.0 and lh.next_note() == "tried again in 10 s"
    now[0] += 9
    assert not lh.due()
    now[0] += 1
    assert lh.due()
    refresh_taking(1.0, said=False)  # ... yet never more often than its CPU allows
    assert lh.interval_s == 1.0 / live.LIVE_CPU_SHARE == 200.0
    refresh_taking(1.0)  # a light server: every LIVE_REFRESH_S, and nothing more said
    assert lh.cpu_s == 1.0 and lh.interval_s == live.LIVE_REFRESH_S and lh.next_note() == ""
    start = now[0]
    now[0] = start + live.LIVE_REFRESH_S - 1
    assert not lh.due()
    now[0] = start + live.LIVE_REFRESH_S
    assert lh.due()
    refresh_taking(24.0)  # the 70B TP 8 server's weight: 24 s / 0.5 % = 80 minutes
    start = now[0]
    assert lh.interval_s == 24.0 / live.LIVE_CPU_SHARE == 4800.0
    now[0] = start + 4799
    assert not lh.due()
    now[0] = start + 4800
    assert lh.due()
    assert lh.next_note() == "next in 80 min (this one took 24 s of CPU; estimates are kept to 0.5 % of a core)"
    # over the whole run the estimates' CPU stays within the share
    assert 24.0 / lh.interval_s <= live.LIVE_CPU_SHARE


def test_the_estimates_take_what_the_monitors_own_work_leaves_of_its_share():
    """Issue 75: the monitor over 16 replicas took 1.17-1.32 % of a core itself, and its estimates'
    fixed 0.5 % and its grading's 0.15 % made 1.57-1.67 %. The process's own share is measured on
    its quiet spans (one in which an estimate or a grading ran is left out: their CPU is budgeted
    apart), and the grading and the estimates are kept to what it leaves of 1.45 %: 0.15 % and
    0.6 % beside one server's 0.7 %, 0.15 % and at most 0.8 % beside a lighter one (issue 73: the
    estimates' refresh every 5 minutes), the least beside a monitor that takes it all; nothing
    measured yet, 0.15 % and 0.5 %."""
    import spoc_tui.twin.live as live

    now, spent = [0.0], [0.0]
    meter = live.CpuMeter(window_s=120.0, clock=lambda: now[0], cpu=lambda: spent[0])

    def ticks(n: int, cpu_each: float, busy: bool = False, every: float = 1.0) -> None:
        for _ in range(n):
            now[0] += every
            spent[0] += cpu_each
            meter.sample(busy)

    lh = live.LiveHeadroom(parse_sla("ttft_p99<=2s"), clock=lambda: now[0])
    lh.meter = meter
    ticks(30, 0.007)
    assert meter.share() is None and (lh.share, lh.grade_share) == (live.LIVE_CPU_SHARE, live.LEDGER_CPU_SHARE)
    ticks(60, 0.007)
    assert meter.share() == pytest.approx(0.007)  # one server: the grading its share, the estimates the rest
    assert lh.grade_share == live.LEDGER_CPU_SHARE
    assert lh.share == pytest.approx(live.TOTAL_CPU_SHARE - 0.007 - live.LEDGER_CPU_SHARE) == pytest.approx(0.006)
    ticks(10, 2.0, busy=True)  # an estimate: its 20 s of CPU are not the monitor's
    ticks(1, 0.007)  # the first tick after it starts the count again
    assert meter.share() == pytest.approx(0.007)
    # a monitor ticking every 15 s (Prometheus's reads): a grading begun and ended between two ticks
    meter.busy()
    ticks(1, 9.0, every=15.0)
    assert meter.share() == pytest.approx(0.007)
    ticks(9, 0.0125 * 15, every=15.0)  # sixteen replicas: the window is theirs alone
    assert meter.share() == pytest.approx(0.0125)
    left = live.TOTAL_CPU_SHARE - 0.0125
    assert lh.grade_share == pytest.approx(live.GRADE_PART * left)
    assert lh.share == pytest.approx(left - lh.grade_share)
    lh.cpu_s, lh.results = 180.0, {"a": Headroom.none("x", parse_sla("ttft_p99<=2s"))}
    assert lh.interval_s == pytest.approx(180.0 / lh.share)
    assert "what the monitor's own work leaves of 1.45 %" in lh.next_note()
    lh.grade_cpu_s = 10.0
    total = meter.share() + lh.cpu_s / lh.interval_s + lh.grade_cpu_s / (lh.grade_cpu_s / lh.grade_share)
    assert total == pytest.approx(live.TOTAL_CPU_SHARE)
    ticks(9, 0.02 * 15, every=15.0)  # a monitor that takes more than the whole share: they still come, rarely
    assert lh.share == live.MIN_CPU_SHARE and lh.grade_share == live.MIN_CPU_SHARE / 5
    ticks(9, 0.003 * 15, every=15.0)  # a light monitor: the estimates take no more than their most
    assert meter.share() == pytest.approx(0.003)
    assert (lh.share, lh.grade_share) == (live.LIVE_CPU_MOST, live.LEDGER_CPU_SHARE)


def test_a_confirming_ramps_knee_is_set_beside_the_headroom_it_confirms():
    """Issue 52: after a ramp of the headroom's own traffic, predicted and measured side by side,
    and whether the measured knee lies in the predicted interval."""
    from spoc_tui.core.ramp.inference import KneeEstimate
    from spoc_tui.twin.headroom_confirm import HeadroomClaim

    said = Headroom(5.9, (4.0, 8.0), "ttft_p99", None, True, "", 40, None)
    claim = HeadroomClaim.of(said, "/t.jsonl")
    assert claim is not None and claim.trace == "/t.jsonl"
    knee = KneeEstimate(5.02, (4.6, 5.4), "ttft_p99", "smooth", unit="x")
    assert claim.beside(knee) == (
        "the live headroom predicted x5.9 (95 %: 4-8); this ramp measured x5 (95 %: 4.6-5.4): "
        "inside the prediction's interval, the point 18 % high"
    )
    far = KneeEstimate(9.5, (9.0, 10.0), "itl_p99", "smooth", unit="x")
    assert "OUTSIDE the prediction's interval, the point 38 % low" in claim.beside(far)
    assert claim.beside(None).endswith("this ramp measured no knee to set beside it")
    bound = KneeEstimate(8.0, (8.0, None), None, "bound", unit="x")
    assert claim.beside(bound).endswith("this ramp measured >8 (a bound: no point to set beside it)")
    beyond = Headroom(10.0, (10.0, None), None, None, True, "", 40, None)
    assert (
        HeadroomClaim.of(beyond, "/t")
        .beside(knee)
        .startswith(  # type: ignore[union-attr]
            "the live headroom predicted x10 (a bound: every speed it replayed met the SLA)"
        )
    )
    assert HeadroomClaim.of(Headroom(None, (None, None), None, None, False, "no", 3, None), "/t") is None


def test_the_search_goes_on_past_x8_to_say_beyond_x10():
    """Traffic far below the server's knee: the headroom's search doubles past x8 to the fastest it
    replays and says "beyond x10". (With the default budget of a ramp's search, ten minutes of
    load, it stopped at x8 and said "beyond x8" of a server whose knee was x9.8.)"""
    from spoc_tui.twin.headroom import MAX_SPEED, headroom_of
    from spoc_tui.twin.passive import PassiveFit
    from tests.unit.test_twin_fit import SERVER, TRUE

    fit = PassiveFit(TRUE, (), 20, (1.0, 4.0), True, "identified (test)", 1.0)
    # answers of 1,000-1,500 tokens: each replay's step lasts past its 120 s to its last answer
    long = Histogram((1000.0, 1500.0, INF), (0.0, 100.0, 100.0), 100.0, 125_000.0)
    tr = replace(traffic(rate=0.05), output=long)
    h = headroom_of(fit, SERVER, tr, tuple(parse_sla("ttft_p99<=5s")), seed=1, draws=0, replay_s=120.0)
    assert h.identified and h.estimate == MAX_SPEED, h
    assert "every speed replayed met the SLA" in h.reason and "beyond x10" in h.line(), h.line()


def _near_and_every(monkeypatch, sla: str) -> tuple[dict[bool, predict.Predicted], dict[bool, int]]:
    """A headroom of a fit with two draws (its step's fixed cost 10 % apart) worked out twice, its
    draws replayed near the fit's knee (True) and at every speed the fit ran (False): each one's
    prediction, and the replays each made."""
    from spoc_tui.twin import headroom, predict
    from spoc_tui.twin.passive import PassiveFit
    from tests.unit.test_twin_fit import SERVER, TRUE

    fit = PassiveFit(TRUE, (replace(TRUE, b0=TRUE.b0 * 0.9), replace(TRUE, b0=TRUE.b0 * 1.1)), 20, (1.0, 4.0), True,
                     "identified (test)", 1.0)  # fmt: skip
    replays = {True: 0, False: 0}
    seen: dict[bool, predict.Predicted] = {}
    real_replay, real_predict = predict.TraceBackend.start_replay, predict.predict

    async def counted(backend, *args, **kw):
        replays[backend.p.draws_near_knee] += 1
        return await real_replay(backend, *args, **kw)

    def kept(p, progress=None):
        seen[p.draws_near_knee] = real_predict(p, progress)
        return seen[p.draws_near_knee]

    monkeypatch.setattr(predict.TraceBackend, "start_replay", counted)
    monkeypatch.setattr(predict, "predict", kept)
    limits = tuple(parse_sla(sla))
    for near in (False, True):
        monkeypatch.setattr(headroom, "DRAWS_NEAR_KNEE", near)
        h = headroom.headroom_of(fit, SERVER, traffic(rate=2.0), limits, seed=1, draws=2, replay_s=20.0)
        assert h.identified and h.estimate is not None, h
    return seen, replays


def test_the_draws_replayed_only_about_the_fits_knee_find_the_knees_every_level_finds(monkeypatch):
    """A headroom reads its draws' knees alone, so at a cliff (here: the queue's) each draw replays
    the two speeds of the fit's bracket, and where it meets the SLA at the lower and breaks it at
    the upper its cliff is that bracket's (:func:`~spoc_tui.twin.predict.draw_near_knee`,
    ``cliff``; else it goes further out while its knee lies past them): the same knees as
    replaying every speed the fit ran, from fewer replays (each one the very replay the whole run
    makes at its speed)."""
    seen, replays = _near_and_every(monkeypatch, "ttft_p99<=2s,itl_p99<=100ms")
    knees = {near: seen[near].draw_knees for near in seen}
    assert knees[True] == knees[False] and all(k is not None for k in knees[True]), knees
    assert replays[True] < replays[False], replays
    cliff = seen[True]
    assert cliff.knee.inferred is not None and cliff.knee.inferred.boundary == "cliff"
    assert all(len(d) == 2 for d in cliff.draw_figures), [len(d) for d in cliff.draw_figures]


def test_a_draw_at_a_smooth_knee_replays_once_and_reads_about_the_knee_its_every_level_finds(monkeypatch):
    """Where the fit's knee is a crossing (not a cliff), a draw replays the traffic once, at the fit's
    knee, and its knee is the fit's trend moved through its own figures there
    (:func:`~spoc_tui.twin.predict.draw_at_knee`): about the knee the draw finds replaying every
    speed the fit ran (here within 5 %), from one replay where three or more."""
    seen, replays = _near_and_every(monkeypatch, "itl_p99<=70ms")
    at_knee, every = seen[True], seen[False]
    assert at_knee.knee.inferred is not None and at_knee.knee.inferred.boundary == "smooth"
    assert replays[True] == len(at_knee.runs) + 2, replays  # the fit's, then one a draw
    assert all(len(d) == 1 for d in at_knee.draw_figures)
    for a, b in zip(at_knee.draw_knees, every.draw_knees, strict=True):
        assert a is not None and b is not None and abs(a / b - 1) < 0.05, (at_knee.draw_knees, every.draw_knees)


def test_a_headrooms_draws_work_their_figures_out_only_when_the_intervals_are_read(monkeypatch):
    """A headroom reads its draws' knees alone: their steps' figures (the predicted steps'
    intervals, a tenth of a crossing's CPU) are worked out when the intervals are read, and are
    then the ones worked out at once (``spoc twin predict``'s)."""
    from spoc_tui.twin import headroom, predict
    from spoc_tui.twin.passive import PassiveFit
    from tests.unit.test_twin_fit import SERVER, TRUE

    fit = PassiveFit(TRUE, (replace(TRUE, b0=TRUE.b0 * 0.9), replace(TRUE, b0=TRUE.b0 * 1.1)), 20, (1.0, 4.0), True,
                     "identified (test)", 1.0)  # fmt: skip
    worked = [0]
    real_figures = predict.figures_of

    def counted(run):
        worked[0] += 1
        return real_figures(run)

    monkeypatch.setattr(predict, "figures_of", counted)
    out: dict[bool, predict.Predicted] = {}
    real_predict = predict.predict

    def kept(p, progress=None):
        out[p.draws_near_knee] = real_predict(p, progress)
        return out[p.draws_near_knee]

    monkeypatch.setattr(predict, "predict", kept)
    headroom.headroom_of(fit, SERVER, traffic(rate=2.0), tuple(parse_sla("ttft_p99<=2s,itl_p99<=100ms")), seed=1,
                         draws=2, replay_s=20.0)  # fmt: skip
    near = out[True]
    assert near.draws == 2 and worked[0] == 0, worked
    lazy = near.intervals
    assert worked[0] == sum(len(d) for d in near.draw_figures) > 0
    eager = replace(near, draw_figures=[{k: real_figures(d._runs[k]) for k in d} for d in near.draw_figures])
    assert lazy == eager.intervals and any(len(d) < len(near.runs) for d in near.draw_figures)


def test_a_knee_beyond_the_speeds_replayed_runs_no_draw_and_says_what_every_draw_would(monkeypatch):
    """Where the fit met the SLA at every speed, the headroom is "beyond" them, and its interval
    the fit's own: a draw's knee widens a crossing's interval only. The draws are then not
    replayed (on the demo's traffic they were 60 % of an estimate's CPU, to no effect on what it
    said): the same headroom as replaying every speed on every draw, from the fit's replays alone."""
    from spoc_tui.twin import headroom, predict
    from spoc_tui.twin.passive import PassiveFit
    from tests.unit.test_twin_fit import SERVER, TRUE

    fit = PassiveFit(TRUE, (replace(TRUE, b0=TRUE.b0 * 0.9), replace(TRUE, b0=TRUE.b0 * 1.1)), 20, (1.0, 4.0), True,
                     "identified (test)", 1.0)  # fmt: skip
    replays = {True: 0, False: 0}
    real_replay = predict.TraceBackend.start_replay

    async def counted(backend, *args, **kw):
        replays[backend.p.draws_near_knee] += 1
        return await real_replay(backend, *args, **kw)

    monkeypatch.setattr(predict.TraceBackend, "start_replay", counted)
    long = Histogram((1000.0, 1500.0, INF), (0.0, 100.0, 100.0), 100.0, 125_000.0)
    tr = replace(traffic(rate=0.05), output=long)
    said = {}
    for near in (False, True):
        monkeypatch.setattr(headroom, "DRAWS_NEAR_KNEE", near)
        h = headroom.headroom_of(fit, SERVER, tr, tuple(parse_sla("ttft_p99<=5s")), seed=1, draws=2, replay_s=120.0)
        assert h.estimate == headroom.MAX_SPEED and "beyond x10" in h.line(), h.line()
        said[near] = (h.estimate, h.ci95, h.reason, h.line())
    assert said[True] == said[False]
    # every speed on each of two draws where the fit's alone (each replayed once)
    assert replays[False] == 3 * replays[True], replays


def test_a_refresh_after_beyond_x10_replays_x10_first_and_says_the_same_in_one_replay(monkeypatch):
    """Issue 73, point 2: the monitor's next estimate starts from the last one. Beyond the fastest
    speed a headroom replays, the search starts there: one replay that meets the SLA again says
    "beyond x10" as the whole search from x1 did (the demo's refresh: 0.9 s of CPU where 2.5)."""
    from spoc_tui.twin import headroom, predict
    from spoc_tui.twin.passive import PassiveFit
    from tests.unit.test_twin_fit import SERVER, TRUE

    fit = PassiveFit(TRUE, (), 20, (1.0, 4.0), True, "identified (test)", 1.0)
    speeds: list[float] = []
    real_replay = predict.TraceBackend.start_replay

    async def counted(backend, idx, speed):
        speeds.append(speed)
        return await real_replay(backend, idx, speed)

    monkeypatch.setattr(predict.TraceBackend, "start_replay", counted)
    long = Histogram((1000.0, 1500.0, INF), (0.0, 100.0, 100.0), 100.0, 125_000.0)
    tr = replace(traffic(rate=0.05), output=long)
    sla = tuple(parse_sla("ttft_p99<=5s"))
    cold = headroom.headroom_of(fit, SERVER, tr, sla, seed=1, draws=0, replay_s=120.0)
    assert cold.beyond_top and speeds[0] == 1.0 and speeds[-1] == headroom.MAX_SPEED, speeds
    speeds.clear()
    warm = headroom.headroom_of(fit, SERVER, tr, sla, seed=1, draws=0, replay_s=120.0, start=headroom.MAX_SPEED)
    assert speeds == [headroom.MAX_SPEED] and warm.beyond_top
    assert warm.line() == cold.line() and warm.estimate == cold.estimate == headroom.MAX_SPEED
    # a crossing's estimate is not a bound: the next search starts at its interval (below); one
    # that spans two searches (the seats unseen: vLLM's default and the most seen) starts each
    # search from its own part
    crossing = replace(cold, ci95=(4.0, 6.0), estimate=5.0, beyond_top=False)
    spanned = replace(crossing, assumed=("max-num-seqs 7-256",), ci95=(2.0, 6.0), parts=(cold, crossing))
    starts: list[tuple[float, tuple[float, ...]]] = []
    monkeypatch.setattr(headroom, "headroom_of", lambda *a, **k: starts.append((a[8], a[9])) or crossing)
    state = replace(LearnerState((), (), tr, SERVER, None, True), limits=sla)
    monkeypatch.setattr(headroom, "fit_of", lambda *a: fit)
    for last in (crossing, cold, None, spanned, replace(spanned, parts=(crossing, cold))):
        state.estimate(seed=1, draws=0, last=last)
    assert starts == [
        (1.0, (4.0, 5.0, 6.0)),
        (headroom.MAX_SPEED, ()),
        (1.0, ()),
        (headroom.MAX_SPEED, ()),
        (1.0, (4.0, 5.0, 6.0)),
    ], starts
    assert headroom.refresh_speeds(spanned) == ()  # its interval is two searches', not one's
    # seats unseen, the replay running more at once than the server was seen to: two searches, each
    # from its own part, and the estimate keeps both for the next
    starts.clear()
    ran_more = replace(crossing, seats_peak=100)
    lower = replace(crossing, ci95=(2.0, 3.0), estimate=2.5)
    made = iter([ran_more, lower, ran_more, lower])
    monkeypatch.setattr(headroom, "headroom_of", lambda *a, **k: starts.append((a[8], a[9])) or next(made))
    seen = replace(state, running_most=20.0)
    first = seen.estimate(seed=1, draws=0)
    assert first.parts == (ran_more, lower) and first.assumed, first
    seen.estimate(seed=1, draws=0, last=first)
    assert starts == [(1.0, ()), (1.0, ()), (1.0, (4.0, 5.0, 6.0)), (1.0, (2.0, 2.5, 3.0))], starts


def test_a_refresh_after_a_crossing_replays_its_interval_first_and_finds_the_knee_in_fewer_replays(monkeypatch):
    """Issue 73, point 2: where the last estimate was a crossing, the refresh replays the ends of
    its interval and its point first, then one more (:data:`REFRESH_STEPS` in all, where a search
    from x1 runs six): on the same traffic, the knee again inside the last interval. A knee that
    moved out of it is searched for on, as from x1."""
    from spoc_tui.twin import headroom, predict
    from spoc_tui.twin.passive import PassiveFit
    from tests.unit.test_twin_fit import SERVER, TRUE

    fit = PassiveFit(TRUE, (replace(TRUE, b0=TRUE.b0 * 0.9), replace(TRUE, b0=TRUE.b0 * 1.1)), 20, (1.0, 4.0), True,
                     "identified (test)", 1.0)  # fmt: skip
    speeds: list[float] = []
    real_replay = predict.TraceBackend.start_replay

    async def counted(backend, idx, speed):
        if not backend.p.draws_near_knee or backend.seed_of(idx) < 1000:  # the fit's, not a draw's
            speeds.append(speed)
        return await real_replay(backend, idx, speed)

    monkeypatch.setattr(predict.TraceBackend, "start_replay", counted)
    sla = tuple(parse_sla("itl_p99<=70ms"))
    cold = headroom.headroom_of(fit, SERVER, traffic(rate=2.0), sla, seed=1, draws=2, replay_s=20.0)
    assert cold.identified and cold.estimate is not None and None not in cold.ci95, cold
    assert len(speeds) == headroom.SEARCH_STEPS and speeds[0] == 1.0, speeds
    first = headroom.refresh_speeds(cold)
    lo, hi = cold.ci95
    assert first == tuple(sorted(round(v, 2) for v in (lo, cold.estimate, hi))), first
    speeds.clear()
    warm = headroom.headroom_of(fit, SERVER, traffic(rate=2.0), sla, seed=2, draws=2, replay_s=20.0, first=first)
    assert tuple(speeds[:3]) == first and len(speeds) <= headroom.REFRESH_STEPS, speeds
    assert warm.identified and warm.estimate is not None and lo <= warm.estimate <= hi, (warm.line(), cold.line())
    # a knee that moved out of the last interval (the traffic fell five-fold since): searched for on
    speeds.clear()
    moved = headroom.headroom_of(fit, SERVER, traffic(rate=2.0), sla, seed=2, draws=0, replay_s=20.0,
                                 first=(1.0, 1.2, 1.4))  # fmt: skip
    assert len(speeds) > headroom.REFRESH_STEPS and moved.estimate is not None, (speeds, moved.line())
    fresh = headroom.headroom_of(fit, SERVER, traffic(rate=2.0), sla, seed=2, draws=0, replay_s=20.0)
    mlo, mhi = moved.ci95  # coarser than from x1 (three replays spent below it), its interval holds it
    assert fresh.estimate is not None and mlo is not None and mhi is not None, (moved.line(), fresh.line())
    assert mlo <= fresh.estimate <= mhi, (moved.line(), fresh.line())
    # nothing to start from: a bound, none
    assert headroom.refresh_speeds(replace(cold, ci95=(lo, None))) == ()
    assert headroom.refresh_speeds(None) == ()


def test_the_monitors_refresh_hands_each_server_its_last_estimate(monkeypatch):
    import spoc_tui.twin.live as live

    now = [live.MIN_WINDOWS * live.WINDOW_S]
    lh = live.LiveHeadroom(parse_sla("ttft_p99<=2s"), clock=lambda: now[0])
    lh._learners["u"] = HeadroomLearner(lh.limits)
    seen: list[Headroom | None] = []
    said = Headroom(10.0, (10.0, None), None, None, True, "beyond", 20, None, beyond_top=True)

    def estimate(self, seed, draws, replay_s, last=None):
        seen.append(last)
        return said

    monkeypatch.setattr(LearnerState, "estimate", estimate)
    lh.refresh()
    lh.refresh()
    assert seen == [None, said]


def test_the_first_estimate_to_say_a_number_counts_the_learning_before_it_in_its_share(monkeypatch):
    """The first estimate comes once the fit has its windows (3.5 minutes, none run before it), so
    its CPU is spread over that time too (at most ``refresh_s`` of it): the demo's first, 2.5 s,
    is followed under 5 minutes later, not 8, and the share since the start is the same."""
    import spoc_tui.twin.live as live

    now = [0.0]
    cpu = [0.0]
    monkeypatch.setattr(live.time, "thread_time", lambda: cpu[0])
    lh = live.LiveHeadroom(parse_sla("ttft_p99<=2s"), clock=lambda: now[0])
    lh._learners["u"] = HeadroomLearner(lh.limits)
    now[0] = live.MIN_WINDOWS * live.WINDOW_S  # 210 s

    def refresh_taking(seconds: float) -> None:
        def estimate(*_a: object) -> Headroom:
            cpu[0] += seconds
            return Headroom(10.0, (10.0, None), None, None, True, "beyond", 20, None)

        monkeypatch.setattr(LearnerState, "estimate", estimate)
        lh.refresh()

    refresh_taking(2.5)  # 2.5 / 0.5 % = 500 s, 210 of them before it
    assert lh.interval_s == 2.5 / live.LIVE_CPU_SHARE - 210.0 == 290.0
    assert 2.5 / (now[0] + lh.interval_s) <= live.LIVE_CPU_SHARE
    now[0] += lh.interval_s
    refresh_taking(2.5)  # the next ones: their own CPU over the time after them
    assert lh.interval_s == 500.0


def test_the_interval_always_holds_its_own_point():
    """The point is the fit's knee, the interval its draws': where they disagree (a term the windows
    barely identify) the interval is widened to hold the point, never printed beside it apart (the
    twin's predictions, the headroom's among them, widen by this rule)."""
    from spoc_tui.twin.predict import holding

    assert holding(8.7, (3.6, 6.9)) == (3.6, 8.7)
    assert holding(2.0, (3.6, 6.9)) == (2.0, 6.9)
    assert holding(5.0, (3.6, 6.9)) == (3.6, 6.9)
    assert holding(5.0, (None, 6.9)) == (None, 6.9) and holding(8.0, (4.0, None)) == (4.0, None)


def test_a_windows_decode_context_is_the_kv_a_running_request_holds_not_the_gauges_mean():
    """The decode context of a window is a mean over its steps, and the KV gauge is one instant: at
    a few sequences a scrape often lands between requests and reads 0. Its mean weighs every
    scrape's gauge by the engine steps since the scrape before (an idle stretch weighs nothing;
    where no steps are counted the scrapes count alike), yet an idle instant still weighs by the
    steps before it; so where the server reports its running requests, the window's context is
    the share of the cache one running request held (over the scrapes that found any), times the
    window's decodes."""
    from spoc_tui.core.metrics.promparse import parse_text
    from spoc_tui.core.metrics.vllm import kv_reading
    from spoc_tui.twin.passive import KvGauge
    from tests.conftest import fixture_text

    def exp(kv: float, steps: float | None, running: float | None = None) -> object:
        text = f'vllm:kv_cache_usage_perc{{engine="0"}} {kv}\n'
        if steps is not None:
            text += f'vllm:iteration_tokens_total_count{{engine="0"}} {steps}\n'
        if running is not None:
            text += f'vllm:num_requests_running{{engine="0"}} {running}\n'
        return parse_text(text)

    gauge = KvGauge()
    for kv, steps in ((0.1, 0), (0.2, 100), (0.4, 400), (0.0, 400)):  # 100 steps at 0.2, 300 at 0.4, idle
        gauge.add(exp(kv, steps))
    assert gauge.close() == (pytest.approx((0.2 * 100 + 0.4 * 300) / 400), None)  # no running count
    assert gauge.close() == (None, None)  # a fresh window
    for kv in (0.2, 0.4):
        gauge.add(exp(kv, None))
    assert gauge.close()[0] == pytest.approx(0.3)
    # 2 running at 0.2, 4 at 0.4, then idle: 0.1 a request; the steps' mean counts the idle 0
    for kv, steps, running in ((0.2, 500, 2), (0.4, 600, 4), (0.0, 700, 0)):
        gauge.add(exp(kv, steps, running))
    mean, per = gauge.close()
    assert per == pytest.approx(0.1) and mean == pytest.approx((0.2 + 0.4) * 100 / 300)
    # vLLM 0.32's own scrape: the gauge, the steps and the running as it reports them
    full = parse_text(fixture_text("vllm/vllm_0.32_cpu_full_load.txt"))
    kv, kv_sum, steps, running = kv_reading(full)
    assert kv is not None and 0.0 <= kv <= 1.0 and steps is not None and steps > 0
    assert kv_sum == pytest.approx(kv) and running is not None and running > 0  # one engine


def test_the_knees_interval_over_few_draws_holds_a_further_draw_95_percent_of_the_time():
    """The headroom replays on four draws of the fit. Their 2.5 and 97.5 percentiles are about
    their extremes, which hold a fifth draw only 3 times in 5; the prediction interval holds it
    about 19 in 20, and many draws keep their percentiles."""
    import random

    from spoc_tui.twin.predict import draws_interval

    rng = random.Random(7)
    for n in (2, 4, 8):
        held = extremes = 0
        for _ in range(4000):
            vals = [rng.gauss(6.0, 0.8) for _ in range(n)]
            new = rng.gauss(6.0, 0.8)
            lo, hi = draws_interval(vals)
            held += lo <= new <= hi
            extremes += min(vals) <= new <= max(vals)
        assert 0.93 <= held / 4000 <= 0.97, (n, held)
        assert extremes / 4000 < 0.8  # what the percentiles of a few said
    many = [float(v) for v in range(1, 101)]
    assert draws_interval(many) == pytest.approx((3.475, 97.525))
    # knees that spread wide, as multiples do (as likely half as twice): the interval holds a
    # further one 95 % of the time, and its lower end is a knee, never a clamp at 0
    held = 0
    for _ in range(4000):
        vals = [6.0 * math.exp(rng.gauss(0, 0.4)) for _ in range(4)]
        lo, hi = draws_interval(vals)
        held += lo <= 6.0 * math.exp(rng.gauss(0, 0.4)) <= hi
        assert lo > 0
    assert 0.93 <= held / 4000 <= 0.97, held
    lo, hi = draws_interval([3.0, 5.0, 6.5, 9.0])  # "x6 (95 %: 0-11.3)" taken on the knees themselves
    assert 1.0 < lo < 3.0 and hi > 9.0


def test_each_draw_replays_a_sample_of_the_traffic_of_its_own_and_the_point_is_their_median():
    """A replay's knee moves with its two minutes of the traffic: each draw of the fit replays a
    sample of its own (so the interval holds that sampling), the point is the median of the fit's
    replay and its draws'. A trace file's rows are what they are, for every draw."""
    from spoc_tui.twin.model import ServerConfig
    from spoc_tui.twin.predict import TraceRows
    from spoc_tui.twin.replayed import replays_median
    from spoc_tui.twin.traffic import TrafficRows

    server = ServerConfig("m", 32_768, 16, 10_000, True, None, 48, 8192, True)
    base = TrafficRows.of(traffic(), 1, server, replay_s=60.0)
    again = base.redrawn(1001)
    assert again.seed == 1001 and base.seed == 1
    assert [r.input_tokens for r in again.at(2.0)] != [r.input_tokens for r in base.at(2.0)]
    assert again.at(2.0) == base.redrawn(1001).at(2.0)  # the same draw, the same sample
    assert base.at(2.0) == TrafficRows.of(traffic(), 1, server, replay_s=60.0).at(2.0)
    rows = TraceRows(base.rows, len(base.rows), {}, 60.0, 0.5)
    assert rows.redrawn(1001) is rows
    # the point: the median of the knees found (a draw beyond the speeds replayed left out)
    assert replays_median(5.0, [4.0, None, 6.0, 7.0]) == (5.5, 4)
    assert replays_median(3.3, []) == (3.3, 1)


def test_a_replays_lengths_hold_each_part_of_the_histogram_in_its_share():
    """The lengths of a replay are drawn at stratified quantiles: each replay carries the
    histogram's tail in its share (the long prompts the p99 gap comes from), where independent
    draws left their count to chance, a fifth either way in a two-minute replay."""
    import random

    from spoc_tui.twin.traffic import strata

    qs = strata(500, random.Random(4))
    assert all(k / 500 <= q < (k + 1) / 500 for k, q in enumerate(sorted(qs)))
    assert sorted(qs) != qs  # in a random order: not the earliest arrivals with the shortest prompts
    t = traffic()
    lengths = Lengths.of(t.prompt)
    assert lengths is not None
    cut = lengths.at(0.96)  # the longest 4 %
    counts = []
    for seed in range(12):
        rows = synth_rows(t, 120.0, seed)
        counts.append((sum(1 for r in rows if r.input_tokens > cut), len(rows)))
    assert all(abs(n - 0.04 * total) <= 1.5 for n, total in counts), counts


def test_untold_seats_are_assumed_as_many_as_the_replay_ran_at_once():
    """The seats the monitor was not told: the headroom says how many its replay needed, the most it
    ran at once at the speeds up to its point, so an operator whose max-num-seqs is lower knows the
    number does not hold (and tells it); where the replay filled the assumed 256, it says 256."""
    from types import SimpleNamespace

    from spoc_tui.twin.replayed import seats_assumed

    def run(speed: float, peak: int | None) -> SimpleNamespace:
        return SimpleNamespace(step=SimpleNamespace(speed=speed), engine=SimpleNamespace(running_peak=peak))

    runs = [run(1.0, 6), run(2.0, 10), run(4.0, 30), run(8.0, 182), run(6.7, 101), run(6.8, 116)]
    assert seats_assumed(256, runs, 6.7) == "max-num-seqs 101 or more"  # x6.8's and x8's broke: not counted
    assert seats_assumed(256, runs, 5.0) == "max-num-seqs 30 or more"
    assert seats_assumed(100, runs, 6.7) == "max-num-seqs 100"  # the replay filled them
    assert seats_assumed(256, runs, 0.5) == "max-num-seqs 6 or more"  # under every speed: the slowest's
    assert seats_assumed(256, [run(1.0, None)], 1.0) == "max-num-seqs 256"  # nothing counted


def test_the_engine_counts_the_most_requests_it_ran_at_once_never_past_its_seats():
    engine, _ = build(SimOptions(gpu="a100-80gb", max_num_seqs=12, dcgm_port=None, seed=3))
    vs = VirtualServer(engine, load_workload("chatbot"), 0, seed=3)
    vs.set_rate(6.0)
    most = 0
    for k in range(1, 121):
        vs.advance(k * 0.5)
        most = max(most, len(engine.running))
    assert engine.running_peak == 12 and most <= 12  # a queue formed: every seat taken at some step
    engine.running_peak = 0
    vs.set_rate(0.2)
    vs.drain(120.0)
    assert 0 < engine.running_peak <= 12


@pytest.mark.parametrize(
    ("labels", "says"),
    [
        ({"num_gpu_blocks": "inf"}, "num_gpu_blocks='inf'"),
        ({"num_gpu_blocks": "-inf"}, "num_gpu_blocks='-inf'"),
        ({"num_gpu_blocks": "nan"}, "num_gpu_blocks='nan'"),
        ({"num_gpu_blocks": "1e308"}, "num_gpu_blocks='1e308'"),
        ({"num_gpu_blocks": "0"}, "num_gpu_blocks='0'"),
        ({"num_gpu_blocks": "12.5"}, "num_gpu_blocks='12.5'"),
        ({"block_size": "inf"}, "block_size='inf'"),
        ({"block_size": "1e9"}, "block_size='1e9'"),
        ({"block_size": "x" * 100}, "block_size='xxxxxxxxxxxxxxxxxxxxx...'"),
    ],
)
def test_a_kv_cache_no_server_has_is_refused_with_the_label_that_says_it(labels, says):
    """Issue 74: ``num_gpu_blocks="inf"`` in one replica's cache_config_info raised out of the
    learner inside the poller (every replica went blank); ``1e308`` and ``block_size="1e9"``
    raised out of the estimate. Read once, by one rule, each is a reason naming the label."""
    from spoc_tui.core.metrics.vllm import kv_blocks

    good = {"num_gpu_blocks": "4096", "block_size": "16"}
    assert kv_blocks(good) == (4096, 16) and kv_blocks({"num_gpu_blocks": "None", "block_size": "16"}) is None
    why = kv_blocks({**good, **labels})
    assert isinstance(why, str) and says in why, why


def relabel(**labels):
    """An edit of a scrape's text: its cache_config_info's labels replaced."""

    def edit(text: str) -> str:
        for k, v in labels.items():
            text = re.sub(k + r'="[^"]*"', f'{k}="{v}"', text)
        return text

    return edit


def hostile(engine, **labels):
    """``engine``'s scrape with its cache_config_info's labels replaced."""
    from spoc_tui.core.metrics.promparse import parse_text
    from spoc_tui.sim.exposition import vllm_metrics

    return parse_text(relabel(**labels)(vllm_metrics(engine)))


def scrapes(servers, seconds: float, every: float = 5.0, edit=None):
    """``(t, exposition)`` of simulated servers scraped in turn (one a scrape: a round-robin URL
    where there are two), their text edited by ``edit`` where given."""
    from spoc_tui.core.metrics.promparse import parse_text
    from spoc_tui.sim.exposition import vllm_metrics

    t, k = 0.0, 0
    while t < seconds:
        t += every
        for vs in servers:
            vs.advance(t)
        text = vllm_metrics(servers[k % len(servers)].engine)
        k += 1
        yield t, parse_text(edit(text) if edit else text)


def sim(seed: int = 1, rate: float = 3.0, seats: int = 48) -> VirtualServer:
    engine, _ = build(SimOptions(gpu="a100-80gb", max_num_seqs=seats, dcgm_port=None, seed=seed))
    vs = VirtualServer(engine, load_workload("chatbot"), 0, seed=seed)
    vs.set_rate(rate)
    return vs


def test_one_replicas_impossible_label_costs_only_its_own_headroom(monkeypatch):
    """Issue 74: a replica with ``num_gpu_blocks="inf"`` beside a healthy one: the healthy one
    keeps its headroom; the other says why it has none. A learner that fails all the same (a
    defect) costs its source alone: the poller's scrape thread never sees the error."""
    from spoc_tui.twin.live import LiveHeadroom

    vs = sim(1, rate=2.0)
    live = LiveHeadroom(tuple(parse_sla("ttft_p99<=2s")))
    t = 0.0
    while t < 120:
        t += 5.0
        vs.advance(t)
        live.add("good", t, hostile(vs.engine))
        live.add("inf", t, hostile(vs.engine, num_gpu_blocks="inf"))
        live.add("1e308", t, hostile(vs.engine, num_gpu_blocks="1e308"))
    out = live.refresh()
    assert out["good"].reason.startswith("too little traffic yet"), out["good"].reason
    assert "num_gpu_blocks='inf'" in out["inf"].line() and "num_gpu_blocks='1e308'" in out["1e308"].line()

    real_add = HeadroomLearner.add

    def add(self, t, exp):
        if exp is poison:
            raise OverflowError("cannot convert float infinity to integer")
        real_add(self, t, exp)

    poison = hostile(vs.engine)
    monkeypatch.setattr(HeadroomLearner, "add", add)
    live.add("good", t + 5, hostile(vs.engine))
    live.add("inf", t + 5, poison)  # raises inside: never out
    out = live.refresh()
    assert out["inf"].line() == (
        "headroom: its scrapes could not be learned from (cannot convert float infinity to integer); see spoc.log"
    )
    assert out["good"].reason.startswith("too little traffic yet")


def test_an_estimate_that_fails_is_its_servers_no_number_not_every_servers(monkeypatch):
    from spoc_tui.twin.live import estimate_of

    learner = HeadroomLearner(tuple(parse_sla("ttft_p99<=2s")))

    def broken(*a, **k):
        raise ValueError("SVD did not converge")

    monkeypatch.setattr(HeadroomLearner, "estimate", broken)
    h = estimate_of(learner, learner.limits)
    assert not h.identified and h.line() == "headroom: could not be worked out (SVD did not converge); see spoc.log"


def test_an_estimate_interrupted_is_not_waited_for():
    """Issue 74: Ctrl-C in ``spoc inspect --headroom`` while the estimate ran did not stop it:
    ``asyncio.run`` joins ``to_thread``'s executor, an estimate's tens of seconds. Cancelled, the
    await ends at once and nothing waits for the thread (here one blocked for 30 s)."""
    import asyncio
    import threading
    import time

    from spoc_tui.twin.live import off_loop

    gate = threading.Event()
    timer = threading.Timer(30.0, gate.set)  # the test's own bound, should the await wait after all
    timer.start()

    async def main() -> None:
        task = asyncio.ensure_future(off_loop(gate.wait))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    t0 = time.monotonic()
    try:
        asyncio.run(main())
        assert time.monotonic() - t0 < 15
        assert asyncio.run(off_loop(lambda: 42)) == 42
        with pytest.raises(ZeroDivisionError):
            asyncio.run(off_loop(lambda: 1 / 0))
    finally:
        gate.set()
        timer.cancel()


def test_windows_whose_counters_no_server_makes_are_refused_not_fitted():
    """Issue 74: histogram buckets counted 1e300 times made numpy's least squares fail to converge
    out of the estimate. Such a window (a step of 1e-302 s) is refused with its reason; most of
    the recent windows refused, the headroom says so rather than anything else."""
    from spoc_tui.twin.passive import PassiveWindow

    ok = PassiveWindow(t=0.0, seconds=30.0, step_s=0.02, gaps=900, decodes=12, context_k=40, prefill=30, mixed=0.5)
    assert ok.impossible() is None
    assert "1e-302 s" in (replace(ok, step_s=1e-302).impossible() or "")
    assert "not a finite number" in (replace(ok, prefill_s=math.inf).impossible() or "")
    assert "sequences or tokens a step" in (replace(ok, decodes=1e12).impossible() or "")

    def huge(text: str) -> str:
        return re.sub(r"^(\S*_bucket\S*) (\S+)$", lambda m: f"{m[1]} {float(m[2]) * 1e300!r}", text, flags=re.M)

    learner = HeadroomLearner(tuple(parse_sla("ttft_p99<=2s")))
    for t, exp in scrapes([sim(1, rate=2.0)], 150.0, edit=huge):
        learner.add(t, exp)
    h = learner.estimate()
    assert learner.refused and not learner.windows
    assert h.reason.startswith(f"{len(learner.refused)} of its last {len(learner.refused)} windows refused"), h.reason
    assert "mean inter-token gap of" in h.reason


def test_a_kv_cache_smaller_than_the_traffics_prompts_says_why_it_cannot_replay_them():
    """Issue 74's critical finding: a server reporting a KV cache that holds fewer tokens than its
    traffic's prompts (the replay draws them up to 1.5x the top bucket's edge) had the monitor's
    estimate wait on them for ever, growing to gigabytes. They are counted before any replay, and
    the line says why there is no number."""
    learner = HeadroomLearner(tuple(parse_sla("ttft_p99<=2s")))
    for t, exp in scrapes([sim(1, rate=3.0)], 300.0, edit=relabel(num_gpu_blocks="40")):
        learner.add(t, exp)
    h = learner.estimate()
    assert not h.identified and h.estimate is None
    assert re.search(r"\d+ of the \d+ requests drawn from its traffic are longer than its whole KV cache as "
                     r"reported \(640 tokens\): no replay can run them", h.reason), h.reason  # fmt: skip


def test_counters_that_go_back_restart_the_learning_or_say_more_than_one_server_answers():
    """Issue 76, point 2: a server restarted inside the window read its traffic 35 % low, the
    restart unsaid; two replicas behind one round-robin URL read x0.83 'identified' where each
    has x3.7. A restart starts the learning over and says so; counters that go back and forth
    are more than one server: no number, with that reason."""
    learner = HeadroomLearner(tuple(parse_sla("ttft_p99<=2s")))
    for t, exp in scrapes([sim(1)], 300.0):
        learner.add(t, exp)
    assert len(learner.windows) >= 8
    again = sim(2)  # the restarted server: its counters from 0
    for t, exp in scrapes([again], 90.0):
        learner.add(300.0 + t, exp)
    assert 1 <= len(learner.windows) <= 3  # what came before the restart is forgotten
    h = learner.estimate()
    assert h.reason.startswith("the server restarted 1 min ago (its counters went back); learning again: "), h.reason

    lb = HeadroomLearner(tuple(parse_sla("ttft_p99<=2s")))
    for t, exp in scrapes([sim(1, rate=3.0), sim(2, rate=1.0)], 300.0):
        lb.add(t, exp)
    h = lb.estimate()
    assert not h.identified and re.match(r"its counters went back \d+ times in 5 min: more than one server", h.reason)
    assert "watch each replica at its own URL" in h.line()


def test_gauges_no_server_reports_are_refused_with_their_reason():
    """Issue 76, point 2: ``kv_cache_usage_perc`` fifty times too large read x7.7 (95 %:
    7.2-8.1) against x3.2; a constant ``num_requests_waiting`` was taken as seats seen (x1.38
    against x3.7), nothing said. The first is refused window by window with its reason; the
    second is no queue at the seats (the running counts beside it range widely), not taken."""

    def kv50(text: str) -> str:
        return re.sub(r"^(vllm:kv_cache_usage_perc\S*) (\S+)$", lambda m: f"{m[1]} {float(m[2]) * 50 + 2}", text,
                      flags=re.M)  # fmt: skip

    learner = HeadroomLearner(tuple(parse_sla("ttft_p99<=2s")))
    for t, exp in scrapes([sim(1)], 300.0, edit=kv50):
        learner.add(t, exp)
    h = learner.estimate()
    assert not h.identified and not learner.windows
    assert re.search(r"windows refused, their counters no server's: its KV-cache use reads [\d.]+, where a share of "
                     r"the cache is at most 1", h.reason), h.reason  # fmt: skip

    def stuck(text: str) -> str:
        return re.sub(r"^(vllm:num_requests_waiting\S*) (\S+)$", r"\1 3.0", text, flags=re.M)

    learner = HeadroomLearner(tuple(parse_sla("ttft_p99<=2s")))
    for t, exp in scrapes([sim(1, rate=2.0)], 300.0, edit=stuck):
        learner.add(t, exp)
    assert learner.seats is None and learner.server().sources["max_num_seqs"] == "assumed"
    assert learner.snapshot().queue_odd and "no queue at the seats" in (learner.snapshot().queue_odd or "")
    told = HeadroomLearner(tuple(parse_sla("ttft_p99<=2s")), seats=4)
    for t, exp in scrapes([sim(1, rate=2.0)], 120.0):
        told.add(t, exp)
    assert any(w and "more than the max-num-seqs it was told (4)" in w for w in told.refused), told.refused


def test_unseen_seats_widen_the_interval_down_to_the_knee_with_the_most_seen_running():
    """Issue 76, point 1: a server with 48 seats, never filled and untold, read x4.5 (95 %:
    3.7-5.5) from vLLM's default 256 where a ramp measured x1.4. Replayed with the most requests
    seen running at once as well, the interval reaches down to that knee; the point stays the
    default's and says so; seats that do not bind at either end change nothing but the words."""
    from spoc_tui.twin.replayed import seats_range

    def h(est: float, lo: float | None, hi: float | None) -> Headroom:
        return Headroom(est, (lo, hi), "ttft_p99", None, True, "fit", 10, None, None, ("ttft_p99<=2s",),
                        assumed=("max-num-seqs 94 or more",), seats_peak=94)  # fmt: skip

    both = seats_range(h(4.5, 3.7, 5.5), h(1.3, 1.2, 1.45), 37, 256)
    assert both.estimate == 4.5 and both.ci95 == (1.2, 5.5) and both.assumed == ("max-num-seqs 37-256",)
    assert "the point takes vLLM's default 256, and the interval reaches down to x1.3, the knee with 37 seats" in (
        both.reason
    )
    assert (
        both.line().startswith("headroom x4.5 (95 %: 1.2-5.5)")
        and "assumes max-num-seqs 37-256 (not seen)" in both.line()
    )
    bound = seats_range(h(10.0, 10.0, None), h(2.3, 2.0, 2.6), 12, 256)  # the default met the SLA at every speed
    assert bound.ci95 == (2.0, None) and bound.line().startswith("headroom beyond x2 ")
    same = seats_range(h(4.5, 3.7, 5.5), h(10.0, 10.0, None), 37, 256)  # 37 seats met it at every speed too
    assert same.ci95 == (3.7, 5.5) and same.assumed == ("max-num-seqs 37 or more",)


def test_the_learner_keeps_the_most_requests_seen_at_once_over_the_traffics_span():
    learner = HeadroomLearner((), window_s=30.0, traffic_s=90.0)
    vs = sim(1, rate=1.0)
    for t, exp in scrapes([vs], 200.0):
        learner.add(t, exp)
    most = learner.snapshot().running_most
    assert most is not None and 1 <= most <= 48
    assert len(learner._most) <= 4  # three windows and the one under way
