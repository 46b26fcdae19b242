"""The monitor an operator keeps open (issue #20): charts, events, the verdict, keys that work."""

import pytest

from spoc_tui.core.monitor.model import HeadroomShown
from spoc_tui.core.monitor.series import WINDOWS_S
from spoc_tui.core.monitor.snapshots import SourceStatus
from spoc_tui.tui.messages import HeadroomEstimated, ServersSampled, SourceStatusChanged
from spoc_tui.tui.screens.confirm import ConfirmScreen
from spoc_tui.tui.widgets.fields import Field
from spoc_tui.tui.widgets.timechart import TimeChart, plot
from tests.tui.helpers import URL, gpu_tick, make_app, server_tick, settings, settle


# -- charts ---------------------------------------------------------------------------------------------
def test_plot_places_values_by_scale_and_keeps_gaps():
    # 4 cells wide (8 dot columns), 2 rows (8 dots high), scale 0..7: value v -> dot row v from the bottom
    grid = plot([[0, 0, None, None, 7, 7, 7, 7]], 0.0, 7.0, 4, 2)
    chars = ["".join(c for c, _ in row) for row in grid]
    assert chars[0][0] == " " and chars[1][0] != " "  # 0 sits in the bottom row
    assert chars[0][1] == " " and chars[1][1] == " "  # the gap stays blank, not joined
    assert chars[0][2] != " " and chars[1][2] == " "  # 7 at the top; a fresh start after a gap is not joined down
    # a step from 0 to 7 in adjacent columns is joined vertically: both rows drawn in that cell
    joined = plot([[0, 7]], 0.0, 7.0, 1, 2)
    assert joined[0][0][0] != " " and joined[1][0][0] != " "
    assert joined[0][0][1] == 0  # owner: the series that drew it


async def test_charts_fill_the_terminal_with_axes_units_and_the_sla():
    s = settings()
    s.sla = "ttft_p99<=2s,itl_p99<=100ms"
    app = make_app(s)
    async with app.run_test(size=(200, 60)) as pilot:
        for _ in range(3):
            app.post_message(ServersSampled(server_tick()))
            app.post_message(gpu_tick())
            await settle(pilot)
        await settle(pilot)
        m = app.monitor
        charts = list(m.query(TimeChart))
        assert len(charts) == 8
        # the panels leave room: the charts take it (no blank half screen), four to a row
        assert m.charts.styles.grid_size_columns == 4
        assert charts[0].size.height >= 8
        body = m.query_one("#body")
        assert body.virtual_size.height <= body.size.height + 1

        def axis(chart):
            return "".join(seg.text for seg in chart.render_line(chart.size.height - 1))

        assert "-5 min" in axis(charts[0]) and axis(charts[0]).rstrip().endswith("now")
        ttft = m.query_one("#c-ttft", TimeChart)
        assert ttft.limit == ("SLA", 2.0)
        assert any("SLA" in str(seg.text) for seg in ttft.render_line(0))
        await pilot.press("w")
        assert m.span_s == WINDOWS_S[2]
        await settle(pilot)
        assert "-15 min" in axis(charts[0])


async def test_charts_and_tables_redraw_in_the_new_theme_without_waiting_for_new_points():
    """A chart's plot, a chart's title and a table's style are kept between ticks; a theme change
    must not leave them in the old colours (a chart stayed so in a paused replay, where no tick
    comes)."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(ServersSampled(server_tick()))
        await settle(pilot)
        chart = app.monitor.query_one("#c-requests", TimeChart)
        lines = {
            "plot": lambda: chart.render_line(chart.size.height - 1),
            "title": lambda: chart.render_line(0),
            "table": lambda: app.monitor.servers.render_line(1),
        }

        def backgrounds() -> dict[str, object]:
            out = {}
            for name, line in lines.items():
                styles = [seg.style for seg in line() if seg.style is not None and seg.style.bgcolor is not None]
                out[name] = styles[-1].bgcolor if styles else None
            return out

        before = backgrounds()
        assert all(v is not None for v in before.values()), before
        app.theme = "textual-light" if app.theme != "textual-light" else "textual-dark"
        await settle(pilot)
        after = backgrounds()
        assert all(after[k] != before[k] for k in lines), (before, after)


async def test_a_charts_title_row_alone_does_not_draw_its_plot_and_shows_new_figures():
    """Below the fold only a chart's title row is painted: its plot waits until scrolled to; a
    new figure repaints the title alone."""
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(ServersSampled(server_tick()))
        await settle(pilot)
        chart = app.monitor.query_one("#c-requests", TimeChart)
        chart._cache = None  # as if the plot moved on
        title = "".join(seg.text for seg in chart.render_line(0))
        assert title.startswith("Requests") and "running" in title
        assert chart._cache is None  # the title alone did not draw the plot
        assert chart.render_line(1) is not None and chart._cache is not None
        before = chart._title_key
        chart._title_strip = None
        chart._title_key = tuple("999" for _ in before)
        assert "999" in "".join(seg.text for seg in chart.render_line(0))


async def test_charts_shrink_to_80x24_below_the_fold():
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        app.post_message(ServersSampled(server_tick()))
        app.post_message(gpu_tick())
        await settle(pilot)
        assert app.monitor.charts.styles.grid_size_columns == 2
        assert app.monitor.query_one("#c-requests", TimeChart).size.height >= 5


# -- verdict, SLA colouring, a dead server --------------------------------------------------------------
async def test_a_dead_server_reads_down_not_no_alerts():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(ServersSampled(server_tick()))
        await settle(pilot)
        app.post_message(ServersSampled(server_tick(up=False)))
        app.post_message(SourceStatusChanged(SourceStatus(URL, False, "cannot connect (connection refused)")))
        await settle(pilot)
        verdicts = str(app.monitor.verdicts.render())
        assert "192.0.2.5:8000 down: cannot connect" in verdicts
        tp = str(app.monitor.tp.render())
        assert "is down" in tp and "no alerts" not in tp
        events = str(app.monitor.events_view.render())
        assert "192.0.2.5:8000 down: cannot connect (connection refused)" in events


async def test_a_server_that_never_answered_is_down_too():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(SourceStatusChanged(SourceStatus(URL, False, "cannot connect")))
        await settle(pilot)
        assert "never answered" in str(app.monitor.verdicts.render())
        assert "no alerts" not in str(app.monitor.tp.render())


async def test_sla_colours_the_latency_cells_and_the_verdict_says_it():
    s = settings()
    # the capture's TTFT p50 (38 ms, 144 requests) is far above 1 ms, its ITL p50 far below 10 s; its
    # p99 rests on 144 requests, too few to judge: not coloured, not a breach
    s.sla = "ttft_p50<=1ms,itl_p50<=10s,ttft_p99<=1ms"
    app = make_app(s)
    async with app.run_test(size=(160, 48)) as pilot:
        app.post_message(ServersSampled(server_tick()))
        await settle(pilot)

        def styles(cell):
            return str(cell.style) + " ".join(str(sp.style) for sp in cell.spans)

        ttft = app.monitor.latency.get_row("ttft")
        itl = app.monitor.latency.get_row("itl")
        assert "red" in styles(ttft[1]) and "green" in styles(itl[1])
        assert "red" not in styles(ttft[3]) and "italic" in styles(ttft[3])
        verdicts = str(app.monitor.verdicts.render())
        assert "SLA broken" in verdicts and "ttft_p50" in verdicts and "ttft_p99" not in verdicts


def test_a_bad_sla_in_the_config_is_a_clear_error(tmp_path):
    import subprocess
    import sys

    cfg = tmp_path / "c.toml"
    cfg.write_text('vllm_urls = ["http://127.0.0.1:9"]\nsla = "ttft<=2s"\n')
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "monitor", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "sla: cannot parse SLA clause 'ttft<=2s'" in r.stderr and "Traceback" not in r.stderr


# -- events ---------------------------------------------------------------------------------------------
async def test_throttling_and_milestones_reach_the_events_panel():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(gpu_tick())
        await settle(pilot)
        app.events.note("ramp", "ramp step 1 at 8 users: meets the SLA (n=120)")
        app.post_message(gpu_tick())
        await settle(pilot)
        text = str(app.monitor.events_view.render())
        assert "GPU node-a:3 throttling (thermal: sw_thermal) at 980 MHz" in text
        assert text.index("ramp step 1") < text.index("GPU node-a:3")  # newest first


# -- keys -----------------------------------------------------------------------------------------------
class _Worker:
    is_running = True

    def __init__(self):
        self.cancelled = False

    def cancel(self):
        self.cancelled = True


async def test_ctrl_x_stops_a_ramp_from_inside_a_field_and_m_is_typed_not_eaten():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("l")
        await settle(pilot)
        screen = app.load_screen
        assert not isinstance(app.focused, Field)  # no field takes the keys when the screen opens
        users = screen.query_one("#users", Field)
        before = users.value
        users.focus()
        await settle(pilot)
        assert users.selection.is_empty  # focusing does not select the text
        await pilot.press("end", "m")
        assert users.value == before + "m" and app.screen is screen  # typing goes to the field
        worker = _Worker()
        app.jobs.ramp.worker = worker
        screen.set_running(True)
        await pilot.press("ctrl+x")
        await settle(pilot)
        assert worker.cancelled  # the field did not eat ctrl+x
        await pilot.press("escape")  # leave the field
        assert not isinstance(app.focused, Field) and app.screen is screen
        await pilot.press("m")  # then m is the screen's key again
        await settle(pilot)
        assert app.screen is app.monitor


async def test_f_keys_switch_screens_from_a_field():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f3")
        await settle(pilot)
        app.load_screen.query_one("#users", Field).focus()
        await pilot.press("f2")
        await settle(pilot)
        assert app.screen is app.monitor


async def test_quitting_during_a_ramp_asks_first_and_the_monitor_says_it_runs():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.jobs.ramp.worker = _Worker()
        app.set_background()
        await settle(pilot)
        assert "a load ramp running" in str(app.monitor.status.render())
        await pilot.press("q")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await settle(pilot)
        assert app.screen is app.monitor and app.is_running
        await pilot.press("q")
        await settle(pilot)
        await pilot.press("y")
        await settle(pilot)
    assert app.return_code == 0


@pytest.mark.parametrize("title", ["Load ramp", "Tune", "Capacity", "Pause / resume", "Chart span", "Help", "Monitor"])
async def test_every_app_action_is_in_the_command_palette(title):
    app = make_app()
    async with app.run_test(size=(120, 40)):
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert title in titles


# -- record and replay ----------------------------------------------------------------------------------
async def test_the_monitor_records_what_it_sees_and_replay_plays_and_seeks_it(tmp_path):
    from spoc_tui.core.monitor.recording import Recorder, read_recording
    from spoc_tui.tui.app import title_for
    from spoc_tui.tui.replay import ReplayApp

    s = settings()
    s.vllm_urls = ["http://admin:hunter2@192.0.2.5:8000"]
    s.api_key = "sk-TOPSECRET"
    path = tmp_path / "rec.jsonl"
    recorder = Recorder(path, {"title": title_for(s), "window_s": 60, "interval_s": 1, "sla": None})
    app = make_app(s)
    app.recorder = recorder
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(ServersSampled(server_tick()))
        app.post_message(gpu_tick())
        await settle(pilot)
        # the live headroom as the monitor's worker thread posts it: recorded, and played back
        app.post_message(HeadroomEstimated({URL: HeadroomShown("headroom x1.1 (95 %: 1-1.2) of ...", 1.1, True)}))
        await settle(pilot)
        app.post_message(SourceStatusChanged(SourceStatus(URL, False, "cannot connect")))
        app.post_message(ServersSampled(server_tick(up=False)))
        await settle(pilot)
    text = path.read_text()
    assert "hunter2" not in text and "sk-TOPSECRET" not in text  # the password and the key stay out
    rec = read_recording(path)
    assert [r.kind for r in rec.records] == ["servers", "gpus", "headroom", "status", "servers"]

    replay = ReplayApp(rec, speed=60.0)
    async with replay.run_test(size=(120, 40)) as pilot:
        for _ in range(50):
            await pilot.pause(0.05)
            if replay.i >= len(rec.records):
                break
        assert replay.i == len(rec.records)
        m = replay.monitor
        # one monitor, on the recording's clock (its charts, events and history read as they did)
        assert [type(s).__name__ for s in replay.screen_stack].count("MonitorScreen") == 1
        assert m.model.clock() == replay.pos_t
        assert "down" in str(m.verdicts.render())
        assert "headroom x1.1 (95 %: 1-1.2)" in str(m.headroom_view.render())
        assert any("little headroom" in a.text for a in m.model.alerts)
        assert "192.0.2.5:8000 down: cannot connect" in str(m.events_view.render())
        title = str(m.query_one("#title").render())
        assert title.startswith("REPLAY rec.jsonl") and "end" in title
        await pilot.press("space")
        assert replay.paused and "paused" in str(m.query_one("#title").render())
        await pilot.press("home")  # seek back to the start: the history is rebuilt, the down event gone
        await settle(pilot)
        assert replay.i == 1 and "down: cannot connect" not in str(m.events_view.render())
        assert "down" not in str(m.verdicts.render()) and "192.0.2.5:8000" in str(m.verdicts.render())
        await pilot.press("space")  # playing on from there reaches the end again
        for _ in range(50):
            await pilot.pause(0.05)
            if replay.i == len(rec.records):
                break
        assert "down" in str(m.verdicts.render())


def test_replay_cli_exports_and_refuses_a_bad_file(tmp_path):
    import subprocess
    import sys

    from spoc_tui.core.monitor.recording import Recorder

    path = tmp_path / "rec.jsonl"
    r = Recorder(path, {})
    r.servers(server_tick(), t=100.0)
    r.close()

    def spoc(*args):
        return subprocess.run([sys.executable, "-m", "spoc_tui.cli", *args], capture_output=True, text=True, timeout=60)

    out = spoc("replay", str(path), "--export", "csv")
    assert out.returncode == 0 and out.stdout.startswith("t,kind,source") and "192.0.2.5:8000" in out.stdout
    bad = tmp_path / "bad.txt"
    bad.write_text("not json\n")
    err = spoc("replay", str(bad))
    assert err.returncode == 2 and "not a spoc recording" in err.stderr and "Traceback" not in err.stderr
    err = spoc("monitor", "--url", "http://127.0.0.1:9", "--record", str(tmp_path))
    assert err.returncode == 2 and "--record" in err.stderr and "Traceback" not in err.stderr


async def test_a_ramp_on_a_busy_server_asks_first():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.post_message(ServersSampled(server_tick()))  # the capture: 16 requests running
        await settle(pilot)
        await pilot.press("l")
        await settle(pilot)
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen)
        assert "already busy: 16 running, 0 waiting" in str(app.screen.query_one("Static").render())
        await pilot.press("n")
        await settle(pilot)
        assert app.screen is app.load_screen and not app.load_screen.running
        assert "not started: the server is busy" in str(app.load_screen.status.render())


async def test_a_study_on_gpus_that_already_serve_asks_first():
    from dataclasses import replace

    from spoc_tui.core.monitor.snapshots import GpuTick
    from spoc_tui.tui.messages import GpusSampled

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        g = replace(gpu_tick().tick.gpus[0], source="nvml", fb_used_mib=70_000.0)  # this host's GPU, 70 GB used
        app.post_message(GpusSampled(GpuTick((g,), frozenset(), (), ())))
        app.post_message(ServersSampled(server_tick()))
        await settle(pilot)
        assert app.jobs.tune.gpus_in_use("spoc sim --port {port} {flags}") is None  # the simulator needs no GPU
        shared = app.jobs.tune.gpus_in_use("vllm serve m --port {port} {flags}")
        assert shared == "1 of 1 GPU(s) with memory in use, the server 16 running, 0 waiting"
        await pilot.press("t")
        await settle(pilot)
        app.tune_screen.query_one("#launch", Field).value = "vllm serve m --port {port} {flags}"
        await pilot.press("ctrl+r")
        await settle(pilot)
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await settle(pilot)
        assert not app.tune_screen.running
        assert "already serve a model" in str(app.tune_screen.form_error.render())


async def test_a_drag_alert_does_not_blink_when_the_gpu_hovers_at_the_threshold():
    from dataclasses import replace

    from spoc_tui.core.hardware.gpu import analyse_groups
    from spoc_tui.core.monitor.snapshots import GpuTick
    from spoc_tui.tui.messages import GpusSampled

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        t = [1000.0]
        app.monitor.clock = lambda: t[0]
        hot = gpu_tick()  # GPU 3 drags its group (980 MHz, 90 C)
        gpus = list(hot.tick.gpus)
        cool = [*gpus[:3], replace(gpus[3], sm_clock_mhz=gpus[0].sm_clock_mhz, temp_c=gpus[0].temp_c, reasons_mask=0)]
        cool_msg = GpusSampled(GpuTick(tuple(cool), frozenset(), (), ()), tuple(analyse_groups([[0, 1, 2, 3]], cool)))
        app.post_message(hot)
        await settle(pilot)
        assert "GPU 3 drags TP group 0-3" in str(app.monitor.tp.render())
        t[0] += 4
        app.post_message(cool_msg)  # one good sample: the alert stays, saying when it last held
        await settle(pilot)
        text = str(app.monitor.tp.render())
        assert "GPU 3 drags TP group 0-3" in text and "(4 s ago)" in text
        t[0] += 10
        app.post_message(cool_msg)  # quiet for 10 s: gone
        await settle(pilot)
        assert "drags" not in str(app.monitor.tp.render())


async def test_esc_closes_the_keys_panel_first():
    from textual.widgets import HelpPanel

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("l")
        await settle(pilot)
        app.action_show_help_panel()  # the palette's "Keys"
        await settle(pilot)
        assert app.screen.query(HelpPanel)
        await pilot.press("escape")
        await settle(pilot)
        assert not app.screen.query(HelpPanel) and app.screen is app.load_screen
        await pilot.press("escape")  # with no panel, Esc is the screen's again: back to the monitor
        await settle(pilot)
        assert app.screen is app.monitor


def test_the_full_screen_commands_refuse_a_pipe_and_point_at_inspect(tmp_path):
    """`spoc monitor | head` and `spoc monitor > f < /dev/null` would write escape codes into the
    pipe or the file forever: refused, naming the end that is not a terminal and `spoc inspect`."""
    import subprocess
    import sys

    for argv in (["monitor", "--url", "http://127.0.0.1:9", "--no-nvml"], ["demo"]):
        r = subprocess.run(
            [sys.executable, "-m", "spoc_tui.cli", *argv], capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert "not a terminal" in r.stderr and "spoc inspect" in r.stderr and "\x1b[" not in r.stdout


async def test_the_same_keys_work_on_every_screen():
    """? opens the help, q and escape go back to the monitor, and each screen's letter reaches the
    others from Load, Tune and Capacity alike (issue 35: they were dead keys there)."""
    from spoc_tui.tui.screens.capacity import CapacityScreen
    from spoc_tui.tui.screens.help import HelpScreen
    from spoc_tui.tui.screens.load import LoadScreen
    from spoc_tui.tui.screens.tune import TuneScreen

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        for key, kind in (("l", LoadScreen), ("t", TuneScreen), ("c", CapacityScreen)):
            await pilot.press(key)
            await pilot.pause()
            assert isinstance(app.screen, kind)
            app.set_focus(None)  # letters go to a focused text field, as they should
            await pilot.press("question_mark")
            await pilot.pause()
            assert isinstance(app.screen, HelpScreen)
            await pilot.press("escape")
            await pilot.pause()
            assert isinstance(app.screen, kind)
            for other, other_kind in (("l", LoadScreen), ("t", TuneScreen), ("c", CapacityScreen)):
                if other_kind is kind:
                    continue
                await pilot.press(other)
                await pilot.pause()
                assert isinstance(app.screen, other_kind), (key, other)
                assert len(app.screen_stack) == 3  # the default screen, the monitor, and this one
                await pilot.press(key)
                await pilot.pause()
                assert isinstance(app.screen, kind)
                app.set_focus(None)
            await pilot.press("q")
            await pilot.pause()
            assert app.screen is app.monitor
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert titles.count("Screenshot") == 1 and titles.count("Quit") == 1


async def test_a_running_ramp_shows_a_badge_on_every_screen():
    """Issue 35: no badge said a ramp was running when the operator was on another screen."""
    from spoc_tui.tui.widgets.badge import WorkBadge

    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        app.jobs.ramp.badge = "step 2 · 4 users · knee so far >4"

        class Running:
            is_running = True

        app.jobs.ramp.worker = Running()  # type: ignore[assignment]
        for key in ("l", "t", "c"):
            await pilot.press(key)
            await pilot.pause()
            await pilot.pause()
            (badge,) = app.screen.query(WorkBadge)
            assert badge.display and "a load ramp (step 2 · 4 users" in str(badge.render()), key
            app.set_focus(None)
            await pilot.press("m")
            await pilot.pause()
        assert "a load ramp (step 2" in app.monitor.background
        app.jobs.ramp.worker = None
        app.set_background()
        await pilot.press("l")
        await pilot.pause()
        await pilot.pause()
        assert not app.screen.query_one(WorkBadge).display
