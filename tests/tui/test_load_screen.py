import asyncio
import json

import pytest
from textual.app import App

from spoc_tui.core.ramp.inference import infer_knee
from spoc_tui.core.ramp.knee import Knee, KneeWhy
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import RequestSample, ServerWindow, summarize_step
from spoc_tui.load.ramp import RampProgress
from spoc_tui.tui.messages import RampFinished, RampProgressed
from spoc_tui.tui.screens.load import LoadScreen
from spoc_tui.tui.widgets.charts import Bar, LimitBarChart
from tests.tui.helpers import make_app

SLA = "ttft_p90<=500ms,itl_p90<=60ms"


def _steps(windows=None):
    lims = parse_sla(SLA)
    out = []
    for i, (users, ttft, itl) in enumerate(((2, 0.05, 0.015), (8, 0.06, 0.018), (40, 3.7, 0.02)), 1):
        samples = [
            RequestSample(
                0.0,
                i,
                users,
                True,
                ttft * (1 + k / 200),
                ttft + 1.0,
                (itl,) * 20,
                21,
                end=k / 6,
                since_answer=0.25 + k / 4000 if k else None,
                asked_wait=0.25 if k else None,
            )
            for k in range(60)
        ]  # finishing through the 10 s window, TTFTs spread a little; sent 0-15 ms after the think time asked
        server = ServerWindow(seen=True, waiting_max=0.0 if users < 40 else 23.0, kv_cache_usage_max=0.02 * i)
        out.append(summarize_step(i, users, samples, 10.0, lims, server=server))
        if windows is not None:
            windows.append((users, samples))
    return tuple(out)


def _finished_ramp(app):
    scr = app.load_screen
    scr.limits = parse_sla(SLA)
    scr.total_steps = 3
    windows: list = []
    steps = _steps(windows)
    why = KneeWhy("batch_full", "the batch is full: 8 running, up to 23 waiting with the KV cache at 6%")
    # the inferred knee too: the charts draw its fit and band, and bracket its interval's levels
    knee = Knee(8, 40, "ttft_p90", why=why, inferred=infer_knee(windows, parse_sla(SLA)))
    app.post_message(RampProgressed(RampProgress("done", 3, 40, 42.0, 10.0, 180, steps, knee)))
    app.post_message(RampFinished("stopped_early", "stopped_early: results in /data/ramps/20261122-120000"))


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_load_screen_after_a_ramp(snap_compare, size):
    async def run_before(pilot):
        await pilot.press("l")
        await pilot.pause()
        _finished_ramp(pilot.app)
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


class ChartApp(App[None]):
    """One LimitBarChart alone, for the chart tests."""

    def compose(self):
        yield LimitBarChart("p99 TTFT", id="c")


async def test_each_step_says_how_soon_its_users_sent_after_an_answer():
    """Issue 77: under each step's intervals, the gap from an answer's end to the user's next send
    and the client's own delay in it (here 0-15 ms past a 250 ms think time)."""
    app = make_app()
    async with app.run_test(size=(120, 45)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        _finished_ramp(app)
        await pilot.pause()
        shown = str(app.load_screen.knee.render())
        says = "client: next send after an answer: p50 258 ms, p99 265 ms (the client's own delay p50 7.5 ms, p99 15 ms"
        assert says + "; 59 sends)" in shown


async def test_chart_draws_limit_and_marks_breaches():
    app = ChartApp()
    async with app.run_test(size=(40, 9)) as pilot:
        chart = app.query_one(LimitBarChart)
        chart.show([Bar("2", 0.05), Bar("40", 3.0)], 0.5)
        await pilot.pause()
        lines = [chart.render_line(y).text for y in range(9)]
    assert "limit 500ms" in lines[0]
    assert sum("SLA" in line for line in lines) == 1
    assert lines[-1].split() == ["2", "40"]
    assert "█" in "".join(lines[1:-1])  # the 3 s column fills the plot


async def test_chart_draws_the_fit_its_band_and_the_knees_interval():
    """#31: the knee inference's fit crosses each column at its height, its band beside it, and
    the levels inside the knee's interval are bracketed."""
    app = ChartApp()
    async with app.run_test(size=(60, 9)) as pilot:
        chart = app.query_one(LimitBarChart)
        chart.show(
            [
                Bar("4", 0.2, fitted=0.25, band=(0.2, 0.3)),
                Bar("8", 0.9, fitted=0.8, band=(0.6, 1.1), in_knee=True),
                Bar("16", 2.0, fitted=2.0, band=(1.5, 2.6), in_knee=True),
            ],
            1.0,
        )
        await pilot.pause()
        lines = [chart.render_line(y).text for y in range(9)]
    assert "━┊ fit" in lines[0] and "[] knee" in lines[0]
    assert lines[-1].split() == ["4", "[8]", "[16]"]
    plot = lines[1:-1]
    assert sum("━" in line for line in plot) >= 2 and any("┊" in line for line in plot)
    # the fit's mark for the 2 s column sits on the top rows (the scale is 2 s)
    assert "━" in "".join(plot[:2])


async def test_bad_form_shows_the_problem_and_starts_nothing():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        scr = app.load_screen
        scr.query_one("#sla").value = "ttft<=1s"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert "cannot parse SLA clause" in str(scr.form_error.render())
        assert not scr.running


async def virtual_ramp(cfg, on_progress):
    """The Load screen's ramp over the experiment's virtual backend (the same driver ``spoc
    ramp`` runs, on ``spoc sim --gpu a100-40gb --max-num-seqs 8``'s engine, or a trace on a
    twin's): the screens' flow is the subject, and a virtual ramp is the same on every host. A
    malformed trace is refused as the live ramp refuses it (its reading is the same code)."""
    from spoc_tui.load.ramp import scan_trace
    from tests.unit.test_ramp_virtual import on_sim8, on_twin

    if cfg.trace is not None:
        scan_trace(cfg.trace)
        return await on_twin(cfg, on_progress)
    return await on_sim8(cfg, on_progress)


def virtual_app(settings=None):
    """The app with no polling, its Load screen's ramps on the virtual backend, and every text
    its status line shows recorded."""
    from spoc_tui.config import Settings
    from spoc_tui.tui.app import SpocApp

    app = SpocApp(settings or Settings(vllm_urls=["http://127.0.0.1:1"], nvml=False, window=10), start_workers=False)
    app.jobs.ramp.runner = virtual_ramp
    app.backgrounds = []
    set_background = app.set_background

    def recorded() -> None:
        set_background()
        app.backgrounds.append(app.monitor.background)

    app.set_background = recorded
    return app


async def ramp_ended(pilot, scr) -> None:
    """Until the ramp's worker has ended (virtual: the first turns of the event loop)."""
    for _ in range(400):
        await pilot.pause()
        if not scr.running:
            return
    raise AssertionError("the ramp did not end")


async def test_ramp_from_the_ui_with_the_monitor_one_key_away(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    app = virtual_app()
    async with app.run_test(size=(120, 45)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        scr = app.load_screen
        assert isinstance(app.screen, LoadScreen)
        scr.query_one("#users").value = "4,40"
        scr.query_one("#step").value = "5"
        scr.query_one("#warmup").value = "1"
        scr.query_one("#max-step").value = "5"  # the flow is the subject: a step is not measured on
        scr.query_one("#sla").value = "ttft_p50<=500ms,itl_p50<=60ms"  # chatbot users think 3-15 s: few requests
        # each step's progress handled as it comes, while the ramp runs (a virtual ramp never
        # waits, so its posted messages would all be read after its end)
        from spoc_tui.tui.messages import RampProgressed

        app.jobs.ramp.runner = paused_ramp = Paused(
            lambda cfg, _post: virtual_ramp(cfg, lambda p: app.jobs.ramp.progressed(RampProgressed(p)))
        )
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert scr.running
        await pilot.press("m")  # back to the monitor; the ramp keeps going
        await pilot.pause()
        assert app.screen is app.monitor and scr.running
        paused_ramp.go.set()
        await ramp_ended(pilot, scr)
        badges = set(app.backgrounds)
        # the monitor's status line said the ramp ran, where it was, and the knee so far
        assert any(b.startswith("a load ramp (step 1 · 4 users") for b in badges), badges
        assert any("knee so far" in b for b in badges), badges
        assert app.monitor.background == ""
        shown = str(scr.knee.render())
        if "knee: 4 users meet the SLA; 40 break ttft_p50" in shown:
            assert "why: the batch is full" in shown
        else:  # 5 s of chatbot users is a few requests: a step left undecided says so (and why)
            assert "inconclusive at" in shown, shown
        assert "95 % intervals" in shown
        assert scr.steps.row_count == 2


class Paused:
    """A ramp runner that starts once ``go`` is set (so the test sees the ramp running)."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.go = asyncio.Event()

    async def __call__(self, cfg, on_progress):
        await self.go.wait()
        return await self.runner(cfg, on_progress)


async def test_the_forms_defaults_start_the_knee_search_with_its_budget():
    from spoc_tui.core.ramp.knee import KneeSearch

    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        scr = app.load_screen
        request = scr.read_form()  # press start, change nothing
        assert request is not None and isinstance(request.plan, KneeSearch)
        assert request.rules.budget_s == 600 and request.rules.max_step_s is None and request.workers == 0
        assert [str(x) for x in request.limits] == ["ttft_p99<=2s", "itl_p99<=100ms"]
        scr.query_one("#budget").value = "0.1"  # 6 s: less than one step
        assert scr.read_form() is None and "the budget must be at least one step" in str(scr.form_error.render())
        scr.query_one("#budget").value = ""
        scr.query_one("#users").value = "1,2"
        request = scr.read_form()
        assert request is not None and request.rules.budget_s is None


async def test_f6_without_a_trace_folder_says_what_to_set():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        await pilot.click("#users")  # a focused field must not eat the key
        await pilot.press("f6")
        await pilot.pause()
        shown = str(app.load_screen.profile.render())
        assert "--trace-dir" in shown and "--profiler-config" in shown


async def test_f6_against_a_server_without_the_profiler_shows_the_flag(tmp_path):
    """F6 profiles through the real capture; the server (a vLLM started without the profiler,
    answering 404 to /start_profile) is answered in memory."""
    from functools import partial

    import httpx

    from spoc_tui.config import Settings
    from spoc_tui.profile.capture import capture
    from spoc_tui.tui.app import SpocApp

    asked: list[str] = []

    def server(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(404, text="Not Found")

    app = SpocApp(Settings(vllm_urls=["http://gpu-a:8000"], nvml=False, trace_dir=str(tmp_path)), start_workers=False)
    app.jobs.profile.capture = partial(capture, transport=httpx.MockTransport(server))
    async with app.run_test(size=(120, 45)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        await pilot.press("f6")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert not app.load_screen.profiling
        shown = str(app.load_screen.profile.render())
        assert "profile failed" in shown and "404" in shown and "--profiler-config" in shown
    assert asked == ["/start_profile"]


async def test_profile_panel_draws_a_real_trace_with_its_roofline():
    from spoc_tui.core.hardware.presets import GPUS, MODELS
    from spoc_tui.profile.analyze import analyse
    from spoc_tui.profile.report import decode_roofline
    from spoc_tui.profile.trace import read_trace
    from spoc_tui.tui.messages import ProfileFinished
    from tests.tui.helpers import FIX

    b = analyse(read_trace(FIX / "profiles" / "vllm_0.32_cpu_tiny_llama.pt.trace.json.gz"))
    b.roofline_step_s, b.roofline_basis = decode_roofline(MODELS["llama-3.1-8b"], GPUS["h100-80gb"])
    app = make_app()
    async with app.run_test(size=(160, 60)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        app.post_message(ProfileFinished(b))
        await pilot.pause()
        shown = str(app.load_screen.profile.render())
        assert "GEMM" in shown and "█" in shown and "decode: 11 steps" in shown
        assert "x the roofline" in shown


async def test_a_trace_replayed_from_the_load_screen(tmp_path, monkeypatch):
    """The trace field replaces the profile: its arrival plot is shown, each step is a speed, and
    the knee comes out in speed multiples; a bad trace is said under the form."""
    import json

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        "".join(
            json.dumps({"timestamp": 100 * i, "input_length": 300 + 10 * i, "output_length": 8, "hash_ids": [1]}) + "\n"
            for i in range(20)
        )
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": "many", "output_length": 3}\n')
    app = virtual_app()
    async with app.run_test(size=(120, 45)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        scr = app.load_screen
        scr.query_one("#trace").value = str(tmp_path / "missing.jsonl")
        assert scr.read_form() is None and "no such file" in str(scr.form_error.render())
        scr.query_one("#trace").value = str(trace)
        scr.query_one("#speeds").value = "1,4"
        scr.query_one("#sla").value = "ttft_p50<=2s"
        request = scr.read_form()
        assert request is not None and request.trace is not None and request.plan.speeds == [1.0, 4.0]
        await pilot.press("ctrl+r")
        await ramp_ended(pilot, scr)
        assert "arrivals |" in str(scr.trace_view.render()) and "20 rows to send" in str(scr.trace_view.render())
        assert scr.steps.row_count == 2
        assert "x4" in str(scr.knee.render()) and scr.ttft_chart.title == "p50 TTFT by speed"
        # a malformed trace: the ramp refuses it before any load, and the screen says where
        scr.query_one("#trace").value = str(bad)
        scr.query_one("#speeds").value = "1"
        await pilot.press("ctrl+r")
        for _ in range(400):  # (the ramp starts asynchronously: wait for its end, not for "not running")
            await pilot.pause()
            if "input_length" in str(scr.status.render()):
                break
        assert "line 1: input_length is 'many'" in str(scr.status.render())
        assert not scr.running


async def test_the_twins_prediction_is_drawn_beside_each_finished_step(tmp_path, monkeypatch):
    """Issue 76, point 3: with a twin in the form, the ramp runs its shadow twin (the driver has it
    predict each step as it is measured, kept on the step); the screen draws each step's
    prediction as it comes, and ramp.json keeps it: the screen simulates nothing of its own."""
    from spoc_tui.twin.model import write_twin
    from tests.unit.test_twin_fit import twin

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    path = tmp_path / "twin.json"
    write_twin(twin(0.05), path)
    app = virtual_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("l")
        await pilot.pause()
        scr = app.load_screen
        scr.query_one("#twin").value = str(tmp_path / "missing.json")
        scr.query_one("#users").value = "2,8,40"
        req = scr.read_form()
        assert req is None and "no such file" in str(scr.form_error.render())
        scr.query_one("#twin").value = str(path)
        scr.query_one("#step").value = "5"
        scr.query_one("#warmup").value = "1"
        scr.query_one("#max-step").value = "5"
        scr.query_one("#sla").value = "ttft_p90<=30s,itl_p90<=2s"  # every step within it: all three run
        req = scr.read_form()
        assert req is not None and req.twin is not None and req.twin_path == str(path)
        await pilot.press("ctrl+r")
        await ramp_ended(pilot, scr)
        await pilot.pause()
        assert sorted(scr.predicted) == [2, 8, 40], scr.predicted
        bars = scr.ttft_chart.bars
        assert all(b.predicted is not None and b.predicted > 0 for b in bars)
        assert scr.ttft_chart.render_line(0).text.rstrip().endswith("◆ twin")
        plot = "".join(scr.itl_chart.render_line(y).text for y in range(1, 8))
        assert plot.count("◆") == 3
    (ramp,) = (tmp_path / "spoc-tui" / "ramps").glob("*/ramp.json")
    steps = json.loads(ramp.read_text())["steps"]
    assert [s["shadow"]["twin"].split("#")[0] for s in steps] == ["twin.json"] * 3
    assert [s["shadow"]["figures"]["ttft_p90"] for s in steps] == [
        pytest.approx(scr.predicted[lv][0]) for lv in (2, 8, 40)
    ]


async def test_chart_marks_a_prediction_at_its_height():
    app = ChartApp()
    async with app.run_test(size=(40, 9)) as pilot:
        chart = app.query_one(LimitBarChart)
        chart.show([Bar("2", 0.05, 0.05), Bar("40", 3.0, 0.5)], 1.0)
        await pilot.pause()
        lines = [chart.render_line(y).text for y in range(9)]
    marks = [(y, line.index("◆")) for y, line in enumerate(lines) if "◆" in line and y > 0]
    assert len(marks) == 2
    (y_small, _), (y_big, _) = sorted(marks, reverse=True)
    assert y_small > y_big  # the larger prediction is drawn higher


async def test_the_step_table_shows_the_percentile_the_sla_judges():
    """An SLA on p90 gets p90 columns (they read p99 whatever the SLA said)."""
    from spoc_tui.tui.screens.load import StepTable

    class TableApp(App[None]):
        def compose(self):
            yield StepTable(id="t")

    steps = _steps()
    app = TableApp()
    async with app.run_test(size=(120, 8)) as pilot:
        table = app.query_one(StepTable)
        table.show(steps, {"ttft": "p90", "itl": "p90"})
        await pilot.pause()
        header, row = table.render_line(0).text, table.render_line(3).text
        assert "TTFT p90" in header and "ITL p90" in header and "p99" not in header
        from spoc_tui.core import fmt

        assert fmt.seconds(steps[2].latency.ttft.p90) in row
        table.show(steps)  # no SLA on them: p99
        await pilot.pause()
        assert "TTFT p99" in table.render_line(0).text
        assert fmt.seconds(steps[2].latency.ttft.p99) in table.render_line(3).text
