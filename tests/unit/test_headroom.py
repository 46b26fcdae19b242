"""The headroom learner (issue 52, first part): the traffic it reads from a server's counters and
histograms, the trace it draws from them again, and what it says before it can say a number.
How close its number comes is benchmarks/headroom.py's (against the knee measured on the same
simulated server)."""

from __future__ import annotations

import math
import statistics

import pytest

from spoc_tui.core.sla import parse_sla
from spoc_tui.core.stats import Histogram
from spoc_tui.sim.options import SimOptions
from spoc_tui.sim.run import build
from spoc_tui.sim.virtual import VirtualServer
from spoc_tui.sim.watch import VirtualWatch
from spoc_tui.twin.headroom import HeadroomLearner, Traffic, synth_rows
from spoc_tui.workload import load_workload

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
