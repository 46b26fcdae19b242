"""The headroom learned through Prometheus (issue 75, point 1): a replica's scrapes as Prometheus
answers a range selector (raw samples, a scrape's sharing its timestamp) grouped back into
scrapes; its history read at once into the learners, then what came since; and what Prometheus
cannot give said for that replica, never filled in. On the virtual clock: the history is the
simulator's scrapes served as Prometheus would answer (the real Prometheus is the real-engine
tier's, tests/realengine/test_fleet_real.py)."""

from __future__ import annotations

import io
import re

import pytest

from spoc_tui.collectors.promql import to_scrapes
from spoc_tui.core.metrics.promparse import Exposition, parse_text
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.sim.exposition import vllm_metrics
from spoc_tui.sim.history import write_openmetrics
from spoc_tui.sim.options import SimOptions
from spoc_tui.sim.run import build
from spoc_tui.sim.virtual import VirtualServer
from spoc_tui.twin.history import PrometheusFeed
from spoc_tui.twin.live import LiveHeadroom
from spoc_tui.workload import load_workload

WALL = 1_800_000_000.0
"""Where the virtual clock's 0 lies on the wall clock Prometheus stamps."""
LIMITS = tuple(parse_sla("ttft_p99<=2s,itl_p99<=100ms"))


def sim(seed: int, rate: float) -> VirtualServer:
    engine, _ = build(SimOptions(gpu="a100-80gb", max_num_seqs=48, dcgm_port=None, seed=seed))
    vs = VirtualServer(engine, load_workload("chatbot"), 0, seed=seed)
    vs.set_rate(rate)
    return vs


def history(servers: dict[str, VirtualServer], seconds: float, every: float = 5.0, edit=None):
    """Each replica scraped every ``every`` s of the virtual clock, as Prometheus stores them."""
    out: dict[str, list[tuple[float, Exposition]]] = {name: [] for name in servers}
    t = 0.0
    while t < seconds - 1e-9:
        t += every
        for name, vs in servers.items():
            vs.advance(t)
            text = vllm_metrics(vs.engine)
            out[name].append((WALL + t, parse_text(edit(text) if edit else text)))
    return out


class Stored:
    """A Prometheus answering from ``stored``, as of the clock's now (what it held by then)."""

    def __init__(self, stored: dict[str, list[tuple[float, Exposition]]]):
        self.stored = stored
        self.now = max(t for rows in stored.values() for t, _ in rows)
        self.asked: list[tuple[float, float]] = []

    def scrapes(self, start: float, end: float):
        self.asked.append((start, end))
        return {k: [(t, e) for t, e in rows if start < t <= end] for k, rows in self.stored.items()}

    def clock(self) -> float:
        return self.now


def matrix(rows: list[tuple[str, dict[str, str], list[tuple[float, str]]]]) -> list[dict]:
    return [{"metric": {"__name__": n, **labels}, "values": [[t, v] for t, v in values]} for n, labels, values in rows]


def test_raw_samples_grouped_by_timestamp_are_each_scrape_again():
    a = {"instance": "a:8000", "job": "vllm", "model_name": "m"}
    got = to_scrapes(
        matrix(
            [
                ("vllm_num_requests_running", a, [(100.0, "3"), (105.0, "4")]),  # OpenMetrics' vllm_ name
                ("vllm:request_success_total", {**a, "finished_reason": "stop"}, [(100.0, "10"), (105.0, "12")]),
                ("vllm:num_requests_waiting", {**a, "instance": "b:8000"}, [(101.0, "NaN"), (106.0, "1")]),
            ]
        )
    )
    assert [t for t, _ in got["a:8000"]] == [100.0, 105.0]
    first = got["a:8000"][0][1]
    assert first.get("vllm:num_requests_running") == {(("model_name", "m"),): 3.0}
    assert first.get("vllm:request_success_total") == {(("finished_reason", "stop"), ("model_name", "m")): 10.0}
    assert got["b:8000"][0][1].nonfinite == 1 and got["b:8000"][1][1].get("vllm:num_requests_waiting")
    # a later slice merged by timestamp; what came before ``after`` left out
    more = to_scrapes(matrix([("vllm_num_requests_running", a, [(105.0, "4"), (110.0, "5")])]), after=100.0, into=got)
    assert [t for t, _ in more["a:8000"]] == [100.0, 105.0, 110.0]
    assert more["a:8000"][1][1].get("vllm:request_success_total")  # the same scrape, not a second


def test_an_hours_history_identifies_each_replicas_fit_at_once_and_the_reads_after_take_what_is_new():
    stored = history({"gpu-a:8000": sim(1, 3.0), "gpu-b:8000": sim(2, 1.5)}, 600.0)
    prom = Stored(stored)
    live = LiveHeadroom(LIMITS, draws=1, replay_s=30.0)
    assert not live.due()
    feed = PrometheusFeed(prom.scrapes, live, since_s=3600.0, clock=prom.clock)
    assert feed.read() == 2 * 120
    assert prom.asked == [(prom.now - 3600.0, prom.now)]
    assert live.due()  # ten minutes of history: no waiting for windows
    for name in ("gpu-a:8000", "gpu-b:8000"):  # (the estimates' replays: the real-engine tier's test)
        learner = live.learner(name)
        assert learner is not None and len(learner.windows) >= 18, name
        fit, traffic = learner.fit(), learner.traffic()
        assert fit.identified and traffic is not None, (name, fit.reason)
        assert traffic.rate == pytest.approx(3.0 if name == "gpu-a:8000" else 1.5, rel=0.2)
    # each read after takes the scrapes stored since the last (reaching back for late ones)
    assert feed.read() == 0
    more = history({"gpu-a:8000": sim(1, 3.0)}, 610.0)
    prom.stored["gpu-a:8000"].append(more["gpu-a:8000"][-1])
    prom.now += 10.0
    assert feed.read() == 1
    assert prom.asked[-1][0] == pytest.approx(prom.now - 10.0, abs=0.01)  # from the replicas' last scrapes read


def test_scrapes_too_far_apart_are_named_not_fitted():
    prom = Stored(history({"gpu-a:8000": sim(1, 3.0)}, 900.0, every=60.0))
    live = LiveHeadroom(LIMITS, draws=1, replay_s=30.0)
    PrometheusFeed(prom.scrapes, live, clock=prom.clock).read()
    h = live.refresh()["gpu-a:8000"]
    assert not h.identified and h.estimate is None
    assert h.reason.startswith("Prometheus scrapes gpu-a:8000 every 60 s; the headroom needs a scrape every 30 s")


def test_a_series_prometheus_does_not_hold_is_named():
    """A relabelling that drops the engine-step histogram (or an old vLLM without it)."""

    def drop(text: str) -> str:
        return "\n".join(ln for ln in text.splitlines() if not ln.startswith("vllm:iteration_tokens_total"))

    prom = Stored(history({"gpu-a:8000": sim(1, 3.0)}, 300.0, edit=drop))
    live = LiveHeadroom(LIMITS, draws=1, replay_s=30.0)
    PrometheusFeed(prom.scrapes, live, clock=prom.clock).read()
    h = live.refresh()["gpu-a:8000"]
    assert not h.identified
    assert h.reason == (
        "Prometheus holds no vllm:iteration_tokens_total_count for gpu-a:8000 (its engine steps): a relabelling "
        "dropped it, or its vLLM does not report it"
    )


def test_a_replica_restarted_inside_the_history_says_so_and_learns_again():
    before = history({"gpu-a:8000": sim(1, 3.0)}, 600.0)["gpu-a:8000"]
    after = history({"gpu-a:8000": sim(5, 3.0)}, 60.0)["gpu-a:8000"]  # its counters from 0 again
    stored = {"gpu-a:8000": before + [(t + 600.0, e) for t, e in after]}
    prom = Stored(stored)
    live = LiveHeadroom(LIMITS, draws=1, replay_s=30.0)
    PrometheusFeed(prom.scrapes, live, clock=prom.clock).read()
    h = live.refresh()["gpu-a:8000"]
    assert not h.identified and re.match(r"the server restarted 1 min ago \(its counters went back\)", h.reason)


def test_a_history_written_as_openmetrics_for_promtool_keeps_every_sample():
    stored = history({"gpu-a:8000": sim(1, 1.0), "gpu-b:8000": sim(2, 1.0)}, 20.0)
    out = io.StringIO()
    n = write_openmetrics(stored, out)
    text = out.getvalue()
    assert n == sum(len(exp.get(name)) for rows in stored.values() for _, exp in rows for name in exp.samples)
    assert text.endswith("# EOF\n") and text.count("# TYPE ") == len(
        {n for r in stored.values() for _, e in r for n in e.samples}
    )
    line = next(ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running{"))
    assert 'instance="gpu-a:8000"' in line and 'job="vllm"' in line and line.endswith(f" {WALL + 5.0:.3f}")


class Replicas:
    """A Prometheus holding ``n`` replicas, each scraped when the test says (no HTTP)."""

    def __init__(self, n: int):
        self.clock = 1000.0
        self.last = {f"r{i}:8000": 1000.0 for i in range(n)}
        self.queries: list[float] = []
        self.down = False

    def stamps(self, at):
        if self.down:
            from spoc_tui.collectors.scrape import SourceError

            raise SourceError("http://prom:9090: Prometheus query failed (connection refused)")
        return dict(self.last)

    def query(self, selector, at):
        self.queries.append(at)
        engine, _ = build(SimOptions(gpu="a100-80gb", dcgm_port=None, seed=1))
        exp = parse_text(vllm_metrics(engine))
        return dict.fromkeys(self.last, exp)


def test_the_monitor_reads_prometheus_again_once_most_replicas_were_scraped_again():
    """Issue 75: a read of 16 replicas' every series is about a tenth of a second of CPU; read once
    a second, the monitor over Prometheus took 12 % of a core, where Prometheus's figures change
    once a scrape. Now: a read when most replicas have a scrape the last did not hold (or a replica
    came or went, or a minute passed); its window's baseline an earlier read, not a second query."""
    from spoc_tui.collectors.promql import PromQLPoller

    prom = Replicas(4)
    poller = PromQLPoller(prom, window_s=60.0, url="http://prom:9090", clock=lambda: prom.clock)
    tick, change = poller.poll()
    assert tick is not None and len(tick.servers) == 4 and change is not None and change.up
    assert prom.queries == [1000.0, 940.0]  # now, and the first window's start
    prom.clock += 1.0
    prom.last = {k: v + 5 for k, v in prom.last.items()}
    assert poller.poll() == (None, None)  # a second on: not asked yet (every 5 s)
    prom.last = {k: v - 5 for k, v in prom.last.items()}
    prom.clock += 5.0
    assert poller.poll() == (None, None)  # nothing scraped since: nothing read
    prom.last["r0:8000"] += 5
    prom.clock += 5.0
    assert poller.poll() == (None, None)  # one of four
    prom.last["r1:8000"] += 5
    prom.clock += 5.0
    handed: list[tuple[str, float]] = []
    poller.on_scrape = lambda inst, t, exp: handed.append((inst, t))  # the headroom's feed
    tick, change = poller.poll()  # two of four: read (in the first minute, with its window's start)
    assert tick is not None and change is None and prom.queries[-2:] == [1016.0, 956.0]
    assert sorted(handed) == sorted(prom.last.items())  # each replica's scrape, stamped as Prometheus stamped it
    for _ in range(20):  # a minute on, the read 60 s old is the next window's baseline
        prom.clock += 5.0
        prom.last = {k: v + 5 for k, v in prom.last.items()}
        poller.poll()
    assert prom.queries[-3:] == [prom.clock - 10, prom.clock - 5, prom.clock]  # reads only, no window queries
    prom.down = True
    prom.clock += 5.0
    tick, change = poller.poll()
    assert tick is None and change is not None and not change.up and "connection refused" in (change.reason or "")
