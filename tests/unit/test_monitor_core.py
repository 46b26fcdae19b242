"""The monitor's pure parts: the event log, the health verdict and the SLA check, the queue alert."""

from dataclasses import replace
from pathlib import Path

from spoc_tui.core.hardware.gpu import GpuSample
from spoc_tui.core.metrics.promparse import parse_text
from spoc_tui.core.metrics.stats import LatencySummary
from spoc_tui.core.metrics.vllm import Scrape, ServerView, server_view
from spoc_tui.core.monitor.alerts import server_alerts
from spoc_tui.core.monitor.events import THROTTLE_HOLD_S, EventDetector, EventLog
from spoc_tui.core.monitor.snapshots import SourceStatus, VllmTick
from spoc_tui.core.monitor.verdict import breaches, verdict
from spoc_tui.core.ramp.sla import parse_sla

FIX = Path(__file__).parents[1] / "fixtures" / "vllm"


def _load_view():
    """The real vLLM 0.32 capture under load, windowed against its idle capture."""
    idle = parse_text((FIX / "vllm_0.32_cpu_full_idle.txt").read_text())
    load = parse_text((FIX / "vllm_0.32_cpu_full_load.txt").read_text())
    return server_view("http://127.0.0.1:8000", Scrape(load, 30.0, idle, 0.0)).total


def _tick(src, **fields):
    v = replace(_load_view(), **fields)
    return VllmTick((ServerView(src, "0.32", ("m",), v, (v,)),), None, frozenset(), (), ())


def _gpu(mask=0, clock=1980.0, temp=50.0):
    return GpuSample("nvml", "3", "GPU-3", sm_clock_mhz=clock, temp_c=temp, reasons_mask=mask, slowdown_temp_c=89)


# -- the queue alert ------------------------------------------------------------------------------------
def test_a_request_waiting_one_step_is_not_a_growing_queue():
    """The steady demo's false alarm: 0, 0, 0, 0, 0 -> 1 waiting."""
    assert server_alerts([(0, 0.1, 0)] * 5 + [(1, 0.1, 0)]) == []
    grown = server_alerts([(3, 0.1, 0), (4, 0.1, 0), (4, 0.1, 0), (6, 0.1, 0), (7, 0.1, 0), (9, 0.1, 0)])
    assert [a.key for a in grown] == ["queue"] and "3 -> 9" in grown[0].text


# -- events ---------------------------------------------------------------------------------------------
def test_a_throttle_that_flickers_is_one_episode_with_its_length():
    det = EventDetector()
    evs = []
    # power capped (0x4) at 0..8 s, one clean sample at 9 s, capped again 10..20 s, clean after
    for t in range(45):
        capped = t <= 8 or 10 <= t <= 20
        evs += det.gpus([_gpu(0x4 if capped else 0x0)], frozenset(), 1000.0 + t)
    texts = [e.text for e in evs]
    assert len(texts) == 2, texts
    assert "GPU 3 throttling (power: sw_power_cap) at 1980 MHz" == texts[0]
    assert texts[1] == "GPU 3 throttle over (power, lasted 20 s)"
    assert evs[1].t == 1000.0 + 20 + THROTTLE_HOLD_S
    # idling is not throttling
    assert det.gpus([_gpu(0x1)], frozenset(), 2000.0) == []


def test_server_restart_preemption_burst_kv_and_source_events():
    det = EventDetector()
    base = _load_view()
    src = "http://127.0.0.1:8000"
    t = 100.0
    assert det.servers(_tick(src, preemptions_total=0.0, kv_cache_usage=0.5), t) == []
    ev = det.servers(_tick(src, preemptions_total=4.0, kv_cache_usage=0.95), t + 1)
    assert [e.kind for e in ev] == ["preempt", "kv"]
    assert ev[0].text == "127.0.0.1:8000: preemptions started (+4)" and ev[0].severity == "error"
    assert det.servers(_tick(src, preemptions_total=9.0, kv_cache_usage=0.85), t + 2) == []  # same burst, KV hysteresis
    ev = det.servers(_tick(src, preemptions_total=9.0, kv_cache_usage=0.5), t + 40)
    assert [e.text for e in ev] == [
        "127.0.0.1:8000: preemption burst over: 9 in 1 s",
        "127.0.0.1:8000: KV cache back to 50%",
    ]
    assert base.generation_tokens_total
    ev = det.servers(_tick(src, generation_tokens_total=3.0, preemptions_total=0.0), t + 41)
    assert [e.kind for e in ev] == ["restart"]
    # sources: the first contact is not news; down once, up once
    up = SourceStatus(src, True)
    down = SourceStatus(src, False, "connection refused")
    assert det.status(up, t) == []
    assert [e.text for e in det.status(down, t)] == ["127.0.0.1:8000 down: connection refused"]
    assert det.status(down, t + 1) == []
    assert [e.text for e in det.status(up, t + 2)] == ["127.0.0.1:8000 back up"]


def test_event_log_keeps_the_newest():
    log = EventLog(size=3)
    for i in range(5):
        log.note("ramp", f"step {i}", t=float(i))
    assert [e.text for e in log.recent()] == ["step 2", "step 3", "step 4"]
    assert log.added == 5 and [e.text for e in log.recent(1)] == ["step 4"]


# -- verdict and SLA ------------------------------------------------------------------------------------
def _lat(p99, count=5000.0):
    return LatencySummary("60s", count, p99 / 2, p99 / 3, p99 / 1.5, p99)


def test_verdict_rules_in_order():
    v = _load_view()
    assert verdict(v, down="connection refused").word == "down"
    assert verdict(v, throttled=["GPU 3 thermal"]).word == "throttled"
    kv = verdict(replace(v, kv_cache_usage=0.95, preemptions_rate=0.0))
    assert kv.word == "KV-bound" and "KV cache 95%" in kv.reason
    q = verdict(replace(v, kv_cache_usage=0.4, preemptions_rate=0.0, waiting=6.0))
    assert q.word == "queue-bound" and q.severity == "warning"
    # a queue that emptied in one of the last refreshes is no bottleneck
    flicker = verdict(replace(v, kv_cache_usage=0.4, preemptions_rate=0.0, waiting=1.0), waiting=0.0)
    assert flicker.word == "healthy"
    assert verdict(replace(v, running=0.0, waiting=0.0, preemptions_rate=0.0, kv_cache_usage=0.0)).word == "idle"


def test_sla_breaches_and_a_thin_window_judges_nothing():
    v = _load_view()
    lat = dict(v.latency)
    lat["ttft"] = _lat(1.5)
    lat["itl"] = _lat(0.05)
    ok = replace(v, latency=lat, kv_cache_usage=0.2, waiting=0.0, preemptions_rate=0.0, running=4.0)
    limits = parse_sla("ttft_p99<1s,itl_p99<=100ms")
    (b,) = breaches(ok, limits)
    assert b.limit.key == "ttft_p99" and str(b) == "ttft_p99 1.50s > 1s"
    got = verdict(ok, limits=limits)
    assert got.word == "SLA broken" and got.severity == "error"
    assert verdict(replace(ok, kv_cache_usage=0.95), limits=limits).word == "KV-bound, SLA broken"
    lat["ttft"] = _lat(1.5, count=40.0)  # 40 requests: no p99 worth judging
    assert breaches(replace(ok, latency=lat), limits) == []
    assert verdict(replace(ok, latency=lat), limits=limits).text == "healthy: 4 running, within the SLA"


def test_the_monitor_model_judges_once_per_tick_without_a_terminal(monkeypatch):
    """The model the Monitor screen and a replay both feed: a tick in, the verdicts and alerts
    out, computed once per tick (the screen only draws them), and nothing of Textual loaded."""
    import subprocess
    import sys

    from spoc_tui.core.monitor import model as monitor_mod
    from spoc_tui.core.monitor.model import MonitorModel
    from spoc_tui.core.monitor.snapshots import SourceStatus
    from tests.tui.helpers import gpu_tick, server_tick

    calls = []
    real = monitor_mod.verdict
    monkeypatch.setattr(monitor_mod, "verdict", lambda *a, **k: calls.append(1) or real(*a, **k))
    model = MonitorModel(
        60.0, parse_sla("ttft_p99<=2s"), vllm_urls=["http://a:8000", "http://b:8000"], clock=lambda: 100.0
    )
    tick = server_tick()
    model.servers(tick)
    assert len(calls) == len(tick.servers) and [src for src, _ in model.verdicts] == [s.source for s in tick.servers]
    g = gpu_tick()
    model.gpus(g.tick, g.groups, g.note)
    assert len(calls) == 2 * len(tick.servers)  # once more for the GPU tick, never at draw time
    assert model.seen() is not None and model.gpu_samples == g.tick.gpus
    # a server that never answered is still judged: down
    model.status(SourceStatus("http://b:8000", False, "connection refused", None, None))
    assert ("http://b:8000", "down") in [(src, v.word) for src, v in model.verdicts]
    assert any(a.key == "down:http://b:8000" for a in model.alerts)
    model.reset()
    assert model.verdicts == () and len(model.events) == 0
    code = "import sys, spoc_tui.core.monitor.model; print('textual' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_the_ladder_puts_a_growing_queue_first_and_lists_the_causes_beneath():
    """Issue 35's overload: the queue grew 232 -> 632 with the KV cache at 99 %, preemptions and a
    power-throttled GPU: the headline is the queue, the rest are its causes, each with its figure."""
    v = replace(_load_view(), kv_cache_usage=0.99, preemptions_rate=3.0, waiting=632.0)
    got = verdict(v, throttled=["GPU 0 power"], queue=(232.0, 300.0, 390.0, 450.0, 560.0, 632.0))
    assert got.word == "shedding load" and "232 -> 632 waiting" in got.reason
    assert got.causes[0].startswith("KV-bound: KV cache 99%, 3 preemptions/s")
    assert got.causes[1] == "throttled: GPU 0 power"
    # a queue that fell once is not growing; then the KV cache is the headline
    assert verdict(v, throttled=["GPU 0 power"], queue=(232.0, 300.0, 290.0, 450.0, 560.0, 632.0)).word == "KV-bound"
    # rejections shed load whatever the queue does
    rej = verdict(replace(v, rejections_rate=2.0))
    assert rej.word == "shedding load" and "admission rejections 2/s" in rej.reason
    calm = replace(v, kv_cache_usage=0.3, preemptions_rate=0.0, waiting=0.0)
    assert verdict(calm, throttled=["GPU 1 thermal"], straggler="GPU 2 holds TP group 0-3 back").word == "throttled"
    s = verdict(calm, straggler="GPU 2 holds TP group 0-3 back", lagging="TTFT p99 236 ms vs its peers' median 39 ms")
    assert s.word == "straggler" and s.causes == ("lagging: TTFT p99 236 ms vs its peers' median 39 ms",)
    lag = verdict(calm, lagging="TTFT p99 236 ms vs its peers' median 39 ms")
    assert lag.word == "lagging" and "236 ms" in lag.reason
    assert lag.as_dict()["verdict"] == "lagging"


def test_the_verdict_shown_holds_for_three_polls_and_says_since_when():
    from spoc_tui.core.monitor.verdict import Verdict, VerdictTracker

    t = VerdictTracker()
    healthy, kv, down = (
        Verdict("healthy", "ok", "4 running"),
        Verdict("KV-bound", "error", "KV 95%"),
        Verdict("down", "error", "refused"),
    )
    assert t.update("a", healthy, 10.0).since == 10.0
    # a verdict that flickers for one or two polls is not shown
    assert t.update("a", kv, 11.0).word == "healthy"
    assert t.update("a", healthy, 12.0).word == "healthy"
    assert t.update("a", kv, 13.0).word == "healthy"
    assert t.update("a", kv, 14.0).word == "healthy"
    # a GPU tick re-judging between polls does not count towards a change
    assert t.update("a", kv, 14.5, count=False).word == "healthy"
    shown = t.update("a", kv, 15.0)
    assert shown.word == "KV-bound" and shown.since == 13.0  # since it began to hold
    assert t.update("a", replace(kv, reason="KV 97%"), 16.0).reason == "KV 97%"  # figures refresh
    assert t.update("a", kv, 17.0).since == 13.0
    assert t.update("a", down, 18.0).word == "down"  # a server going down is shown at once


def test_a_calm_verdict_keeps_its_figure_a_few_seconds_an_alarm_refreshes_every_poll():
    from spoc_tui.core.monitor.verdict import CALM_FIGURE_S, Verdict, VerdictTracker

    t = VerdictTracker()
    assert t.update("a", Verdict("healthy", "ok", "13 running"), 10.0).reason == "13 running"
    # the running count moves every second: the headline keeps its figure (the table shows it live)
    assert t.update("a", Verdict("healthy", "ok", "12 running"), 11.0).reason == "13 running"
    assert t.update("a", Verdict("healthy", "ok", "9 running"), 10.0 + CALM_FIGURE_S - 0.1).reason == "13 running"
    later = t.update("a", Verdict("healthy", "ok", "9 running"), 10.0 + CALM_FIGURE_S)
    assert later.reason == "9 running" and later.since == 10.0
    # an alarm's figure is news: shown at every poll
    t.update("b", Verdict("KV-bound", "error", "KV 95%"), 10.0)
    assert t.update("b", Verdict("KV-bound", "error", "KV 97%"), 11.0).reason == "KV 97%"
    # a calm verdict changing its word (idle -> healthy) is a change of rung, not of figure
    t.update("c", Verdict("idle", "ok", ""), 10.0)
    for now in (11.0, 12.0):
        assert t.update("c", Verdict("healthy", "ok", "2 running"), now).word == "idle"
    assert t.update("c", Verdict("healthy", "ok", "2 running"), 13.0).reason == "2 running"


def test_a_lagging_replica_is_judged_against_its_peers_median():
    from spoc_tui.core.monitor.fleet import lagging

    def server(src, ttft, itl):
        lat = dict(_load_view().latency)
        lat["ttft"], lat["itl"] = _lat(ttft), _lat(itl)
        v = replace(_load_view(), latency=lat, waiting=0.0)
        return ServerView(src, "0.32", ("m",), v, (v,))

    fleet = [server("a", 0.039, 0.02), server("b", 0.041, 0.021), server("c", 0.236, 0.02), server("d", 0.04, 0.05)]
    lags = {x.source: x.reason for x in lagging(fleet)}
    assert set(lags) == {"c", "d"}
    assert lags["c"] == "TTFT p99 236 ms vs its peers' median 40 ms"  # of 39, 41 and 40
    assert lags["d"] == "ITL p99 50 ms vs its peers' median 20 ms"


def test_a_sparkline_shows_a_value_under_its_floor_low_and_one_not_finite_as_missing():
    from spoc_tui.core.fmt import sparkline

    assert sparkline([-1.0, 5.0]) == " █"  # under low: the first mark, not one from the end
    assert sparkline([float("nan"), 1.0, float("inf"), None]) == "·█··"
    assert sparkline([2.0, 2.0], low=2.0) == "  " and sparkline([]) == ""
