"""The monitor's live headroom (issue 52): learning first, then why not yet, then a number with its
interval, and an alert when it is low. The scrapes come from the simulator in virtual time
(:class:`spoc_tui.sim.watch.VirtualWatch`: its own /metrics text every 5 virtual seconds), fed to
the app's learner as its poller feeds it; the estimate runs in the app's worker thread."""

import math
import re

from spoc_tui.collectors.poller import VllmPoller
from spoc_tui.core.monitor.model import HeadroomShown
from spoc_tui.core.ramp.experiment import RampProgress
from spoc_tui.core.ramp.inference import KneeEstimate
from spoc_tui.core.ramp.knee import FixedSpeeds, Knee
from spoc_tui.core.ramp.rules import StepRules
from spoc_tui.core.traces.read import trace_source
from spoc_tui.sim.options import SimOptions
from spoc_tui.sim.run import build
from spoc_tui.sim.virtual import VirtualServer
from spoc_tui.sim.watch import VirtualWatch
from spoc_tui.tui.app import MonitorSources, SpocApp
from spoc_tui.twin.headroom_confirm import confirm_speeds
from spoc_tui.twin.live import LiveHeadroom
from spoc_tui.twin.publish import HeadroomCollector
from spoc_tui.workload import load_workload
from tests.tui.helpers import URL, painted, settings, settle


def feed(live: LiveHeadroom, seconds: float, swell: bool, seed: int = 1, peak: float = 8.0) -> None:
    """``seconds`` of open-loop chat traffic on a simulated A100 with 48 seats: flat at 1 request
    a second, or swelling between 0.35 and 1 times ``peak`` a second over five minutes."""
    engine, _ = build(SimOptions(gpu="a100-80gb", max_num_seqs=48, dcgm_port=None, seed=seed))
    vs = VirtualServer(engine, load_workload("chatbot"), 0, seed=seed)
    watch = VirtualWatch([vs], window_s=60.0, interval_s=5.0)

    def rate(t: float) -> float:
        return peak * (0.35 + 0.65 * (0.5 + 0.5 * math.sin(2 * math.pi * t / 300.0))) if swell else 1.0

    for _ in watch.run(seconds, before=lambda t: vs.set_rate(rate(t)) if round(t) % 10 == 0 else None):
        live.add(URL, watch.now, watch.expositions[0])


def text_of(app: SpocApp) -> str:
    return str(app.monitor.headroom_view.render())


async def estimated(app: SpocApp, pilot) -> str:
    app.monitor.model.headroom = {}
    app.run_worker(app.jobs.headroom.work, group="headroom", thread=True)  # as the monitor starts it
    for _ in range(1200):  # the estimate is seconds of CPU in a thread; the UI stays responsive
        await pilot.pause(0.1)
        if app.monitor.model.headroom:
            break
    return text_of(app)


async def test_the_headroom_line_learns_says_why_not_yet_then_a_number_and_alerts_when_low():
    published = HeadroomCollector()  # spoc monitor --serve-metrics
    app = SpocApp(settings(), MonitorSources(vllm=VllmPoller([URL])), start_workers=False, published=published)
    assert app.headroom is not None and app.sources.vllm.on_scrape == app.headroom.add
    # the line and its wiring are the subject, not the figure (benchmarks/headroom.py's): a short
    # replay on the fit and one draw keeps the estimate to about a second of CPU
    app.headroom.draws, app.headroom.replay_s = 1, 20.0
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "headroom: learning from the scrapes (the first estimate in about 4 min" in text_of(app)
        # on screen, inside its panel: painted, not only rendered (it had been laid out below the
        # panel's edge, and no terminal ever showed it)
        await settle(pilot)
        assert "headroom: learning from the scrapes" in painted(app)
        assert app.monitor.servers_panel.region.contains_region(app.monitor.headroom_view.region)
        # three minutes of flat traffic: too few windows (seven of 30 s are needed), said, never a number
        feed(app.headroom, 200, swell=False)
        shown = await estimated(app, pilot)
        assert shown.startswith("headroom: ") and "headroom x" not in shown, shown
        assert "traffic yet" in shown or "variety yet" in shown, shown
        (h,) = app.monitor.model.headroom.values()
        assert not h.identified and h.estimate is None
        # ten minutes of traffic that swells and ebbs: the step time is identified, a number with
        # its interval, against the default SLA, resting on an assumption it names
        app.headroom.reset()
        feed(app.headroom, 600, swell=True, peak=2.0)
        shown = await estimated(app, pilot)
        (h,) = app.monitor.model.headroom.values()
        assert h.identified and h.estimate is not None and h.estimate > 1, shown
        assert "within ttft_p99<=2s,itl_p99<=100ms" in shown, shown
        # a point with its interval, or (the search stops short of x10) a bound; the seats never queued
        # here, so the number says what it assumes of them: as many as its replay ran at once, or
        # (issue 76) the range from the most seen running to vLLM's 256 its interval covers (the
        # server has 48)
        assert shown.startswith("headroom beyond x") or ("headroom x" in shown and "(95 %: " in shown), shown
        seats = re.search(r"assumes max-num-seqs (\d+)(?: or more|-256) \(not seen\)", shown)
        assert seats is not None and 1 <= int(seats[1]) <= 48, shown
        assert "(worked out just now)" in text_of(app)  # issue 73: the estimate's age beside it
        # and served to Prometheus as worked out (issue 75): the server's estimate, the fleet's its own
        ratio = {tuple(s.labels.values()): s.value for m in published.collect() for s in m.samples
                 if m.name == "spoc_headroom_ratio"}  # fmt: skip
        assert ratio[(URL, "estimate")] == ratio[("fleet", "estimate")] == h.estimate
        await settle(pilot)
        assert shown[:60] in painted(app), painted(app)
        # its history under it: the first estimate could not say (·), the second could
        # (over the wall-clock minutes between the two estimates: how long the host took is not the subject)
        assert re.search(rf"history x{h.estimate:.2g} ·█ x{h.estimate:.2g} over \d+ min", shown), shown
        # the Load screen, opened now, is set to confirm it: that traffic as a trace, at speeds
        # around the estimate, said under the form
        (full,) = app.headroom.results.values()
        app.action_load()
        await pilot.pause()
        form = app.load_screen
        trace = form.query_one("#trace").value
        assert trace.endswith(".jsonl") and "/headroom/traffic-" in trace
        assert form.query_one("#speeds").value == confirm_speeds(full.estimate)
        assert "pre-filled to confirm the live headroom" in str(form.form_error.render())
        rows = list(trace_source(trace).rows())
        assert len(rows) >= 30 and rows == sorted(rows, key=lambda r: r.t)
        # the ramp of that trace ends with the knee it measured beside the headroom it confirms
        # (its progress handed to the screen as the ramp's worker hands it; the ramp itself is
        # tests/e2e's and benchmarks/headroom.py's)
        form.request = form.StartRequested(
            load_workload("chatbot"), FixedSpeeds([1.0]), form.limits, StepRules(step_s=5.0, warmup_s=1.0, max_step_s=5.0),
            0, trace_source(trace),
        )  # fmt: skip
        measured = KneeEstimate(full.estimate, (full.estimate * 0.9, full.estimate * 1.1), "ttft_p99", "smooth",
                                unit="x")  # fmt: skip
        knee = Knee(None, None, None, unit="x", inferred=measured)
        form.show_progress(RampProgress("done", 1, 1.0, 10.0, 5.0, 0, (), knee, unit="x"))
        said = str(form.knee.render())
        assert f"the live headroom predicted x{full.estimate:.2g}" in said, said
        assert "this ramp measured" in said and "inside the prediction's interval, the point 0 % high" in said, said
        form.request = None
        await pilot.press("m")
        await pilot.pause()
        assert not any(a.key.startswith("headroom:") for a in app.monitor.model.alerts)
        # a headroom under x1.2 of the recent traffic is an alert, in the alerts panel
        app.monitor.apply_headroom({URL: HeadroomShown("headroom x1.1 (95 %: 1-1.2) ...", 1.1, True)})
        await pilot.pause()
        (alert,) = [a for a in app.monitor.model.alerts if a.key == f"headroom:{URL}"]
        assert "little headroom: x1.1" in alert.text and "under x1.2" in alert.text
        assert "little headroom" in str(app.monitor.tp.render())


async def test_the_ledger_is_a_line_under_the_headroom_and_a_grading_keeps_the_estimates_age():
    """Issue 76: how the twin's predictions of the minutes since held, under the headroom line,
    painted at 80x24; a grading posted between estimates leaves the estimate's age as it was."""
    app = SpocApp(settings(), MonitorSources(vllm=VllmPoller([URL])), start_workers=False)
    ledger = "predictions held 27 of 30 windows over 2.0 h (median error 8 %)"
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.monitor.apply_headroom({URL: HeadroomShown("headroom x3 (95 %: 2-4) of the last 15 min", 3.0, True)})
        await pilot.pause()
        assert "predictions" not in text_of(app)
        app.monitor.apply_headroom({URL: HeadroomShown("headroom x3 (95 %: 2-4) of the last 15 min", 3.0, True,
                                                       ledger, fresh=False)})  # fmt: skip
        await settle(pilot)
        shown = text_of(app)
        assert shown.index("headroom x3") < shown.index(ledger), shown
        assert "predictions held 27 of 30" in painted(app), painted(app)
        assert len(app.monitor.model.headroom_history[URL]) == 1  # one estimate, graded twice
        # the server changed under the twin (its predictions missed two minutes the same way): no
        # number while the fit learns again, said with why, the ledger's record under it
        relearning = ("headroom: re-learning since 2 min ago, the server no longer the one its windows showed "
                      "(itl_mean predicted 19 % and 24 % low, outside the intervals): the windows before forgotten")  # fmt: skip
        app.monitor.apply_headroom({URL: HeadroomShown(relearning, None, False, "predictions held 26 of 29 windows "
                                                       "over 35 min (median error 4 %)")})  # fmt: skip
        await settle(pilot)
        shown = text_of(app)
        assert shown.startswith("headroom: re-learning since 2 min ago") and "held 26 of 29" in shown, shown
        assert "re-learning" in painted(app)


async def test_no_headroom_when_switched_off():
    s = settings()
    s.headroom = False
    app = SpocApp(s, MonitorSources(vllm=VllmPoller([URL])), start_workers=False)
    assert app.headroom is None and app.sources.vllm.on_scrape is None
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert not app.monitor.headroom_view.display


def test_the_monitors_told_seats_and_prior_twin_reach_each_servers_learner(tmp_path):
    """``spoc monitor --max-num-seqs 48 --twin twin.json``: every server's learner is told the
    seats (they take precedence over the prior's and a queue's, and nothing is assumed) and has
    the twin as its fit's prior; without them the seats are assumed, and said to be."""
    from spoc_tui.twin.model import write_twin
    from tests.unit.test_twin_fit import twin

    path = tmp_path / "twin.json"
    write_twin(twin(0.05), path)
    s = settings()
    s.max_num_seqs, s.twin = 48, str(path)
    told = SpocApp(s, MonitorSources(vllm=VllmPoller([URL])), start_workers=False).headroom
    untold = SpocApp(settings(), MonitorSources(vllm=VllmPoller([URL])), start_workers=False).headroom
    assert told is not None and untold is not None
    assert told.prior is not None and told.prior.server == twin(0.05).server and untold.prior is None
    for live in (told, untold):
        feed(live, 30, swell=False)
    learner, bare = told._learners[URL], untold._learners[URL]
    assert learner.prior is told.prior
    server = learner.server()
    assert server.max_num_seqs == 48 and server.sources["max_num_seqs"] == "told"
    assert bare.server().sources["max_num_seqs"] == "assumed" and bare.server().max_num_seqs == 256
