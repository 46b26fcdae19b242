"""The Tune screen: a study's live scatter, hypervolume and Pareto table; started from the UI."""

import asyncio
import os
import sys
from pathlib import Path

import pytest

from spoc_tui.config import data_dir
from spoc_tui.core.ramp.knee import FixedUsers
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.tuning.space import parse_objectives, parse_space
from spoc_tui.load.ramp import RampConfig
from spoc_tui.tui.messages import TuneEvent, TuneFinished
from spoc_tui.tui.screens.tune import TuneScreen
from spoc_tui.tui.widgets.charts import ParetoPlot, PlotPoint
from spoc_tui.tune import events
from spoc_tui.tune.evaluate import FastSimEvaluator
from spoc_tui.tune.study import TuneConfig, TuneSession
from spoc_tui.workload import load_workload
from tests.tui.helpers import make_app

SPACE = """
[fixed]
max-model-len = 8192

[flags.max-num-seqs]
pow2 = [8, 128]
default = 128

[flags.max-num-batched-tokens]
choices = [512, 2048, 8192]
default = 2048

[flags.enable-chunked-prefill]
choices = [true, false]
default = true
"""
LIMITS = parse_sla("ttft_p99<=30s,itl_p99<=150ms")
OBJ = parse_objectives("max:out_tok_s,min:itl_p99")


def study_events(tmp_path: Path) -> list[events.TuneEvent]:
    """A real (virtual-time) study's events, the way a running session posts them."""
    sp = parse_space(SPACE, "space.toml")
    ramp = RampConfig("", load_workload("coding"), FixedUsers([24]), LIMITS, Path(), step_s=30, warmup_s=8)
    cfg = TuneConfig(sp, OBJ, LIMITS, 10, tmp_path, population=4, seed=3)
    seen: list[events.TuneEvent] = []
    TuneSession(cfg, FastSimEvaluator(ramp, fixed=sp.fixed), seen.append).run()
    # notes are toasts; the opening names a temp folder
    return [ev for ev in seen if not isinstance(ev, (events.Note, events.StudyOpened))]


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_snapshot_tune_screen_after_a_study(snap_compare, size, tmp_path):
    evs = study_events(tmp_path)

    async def run_before(pilot):
        await pilot.press("t")
        await pilot.pause()
        scr = pilot.app.tune_screen
        scr.prepare(OBJ, LIMITS, " ".join)
        for ev in evs:
            pilot.app.post_message(TuneEvent(ev))
        pilot.app.post_message(
            TuneFinished("complete", "complete: 10 trial(s), results in /data/tunes/20261122-120000/pareto.json")
        )
        await pilot.pause()
        await pilot.pause()

    assert snap_compare(make_app(), terminal_size=size, run_before=run_before)


async def test_plot_marks_front_feasible_and_misses():
    app = make_app()
    async with app.run_test(size=(60, 14)) as pilot:
        plot = ParetoPlot()
        await app.screen.mount(plot)
        plot.show(
            [
                PlotPoint(100, 0.05, "pareto"),
                PlotPoint(300, 0.20, "pareto"),
                PlotPoint(150, 0.15, "feasible"),
                PlotPoint(50, 0.5, "breaks"),
            ],
            "output tokens/s",
            "ITL p99",
        )
        await pilot.pause()
        text = "\n".join(plot.render_line(y).text for y in range(14))
        assert text.count("◆") == 2 + 1 and text.count("●") == 1 + 1  # points + legend
        assert "×" in text and "×" in text and "·" in text  # the front is joined
        assert "ITL p99 (better ↓) against output tokens/s (better →)" in text


async def test_plot_draws_intervals_and_provisional_members():
    app = make_app()
    async with app.run_test(size=(100, 16)) as pilot:
        plot = ParetoPlot()
        await app.screen.mount(plot)
        plot.show(
            [
                PlotPoint(100, 0.05, "pareto", x_ci=(80, 120), y_ci=(0.04, 0.06)),
                PlotPoint(300, 0.20, "provisional", x_ci=(200, 400), y_ci=(0.1, 0.3)),
                PlotPoint(290, 0.21, "feasible"),
            ],
            "output tokens/s",
            "ITL p99",
        )
        await pilot.pause()
        lines = [plot.render_line(y).text for y in range(14)]
        text = "\n".join(lines)
        assert text.count("◇") == 1 + 1 and text.count("◆") == 1 + 1  # points + legend
        row = next(ln for ln in lines if "◇" in ln and "provisional" not in ln)
        assert "─◇" in row or "─" in row.split("◇")[0][-3:]  # a horizontal whisker through the point
        assert sum("│" in ln.split("│", 1)[1] for ln in lines if "│" in ln) >= 2  # and a vertical one
        assert "95 % intervals" in text
        # the whiskers widen the axes: the interval ends are on the scale
        assert plot._range[0] <= 80 and plot._range[1] >= 400


async def test_bad_form_shows_the_problem_and_starts_nothing():
    app = make_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("t")
        await pilot.pause()
        scr = app.tune_screen
        scr.query_one("#launch").value = f"{sys.executable} -m spoc_tui.cli sim --port {{port}} {{flags}}"
        scr.query_one("#objectives").value = "min:out_tok_s,ttft_p99"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert not scr.running
        assert "can only be maximised" in str(scr.form_error.render())
        scr.query_one("#launch").value = "/nonexistent/vllm serve --port {port}"
        scr.query_one("#objectives").value = "out_tok_s,ttft_p99"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert not scr.running and "not a command" in str(scr.form_error.render())


async def test_study_from_the_ui_with_the_monitor_one_key_away(tmp_path):
    from spoc_tui.config import Settings
    from spoc_tui.tui.app import SpocApp
    from tests.e2e.test_tune_cli import guards_of

    space = tmp_path / "space.toml"
    space.write_text("[flags.max-num-seqs]\nchoices = [2, 16]\ndefault = 16\n")
    launch = (
        f"{sys.executable} -m spoc_tui.cli sim llama-3.1-8b --gpu a100-40gb --port {{port}} --dcgm-port 0 {{flags}}"
    )
    app = SpocApp(Settings(nvml=False, tune_launch=launch, dcgm_urls=[]), start_workers=False)
    before = set(guards_of(os.getpid()))  # simulators other fixtures keep running are not the study's
    async with app.run_test(size=(120, 45)) as pilot:
        await pilot.press("t")
        await pilot.pause()
        scr = app.tune_screen
        assert isinstance(app.screen, TuneScreen) and scr.query_one("#launch").value == launch
        scr.query_one("#space").value = str(space)
        scr.query_one("#sla").value = "ttft_p99<=5s"
        scr.query_one("#trials").value = "2"
        scr.query_one("#users").value = "16"
        scr.query_one("#step").value = "6"
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert scr.running
        await pilot.press("m")  # the monitor; the study keeps going
        await pilot.pause()
        assert app.screen is app.monitor and scr.running
        for _ in range(240):
            await asyncio.sleep(0.25)
            if not scr.running:
                break
        assert not scr.running
        assert "complete: 2 trial(s)" in str(scr.status.render())
        assert scr.table.row_count >= 1 and scr.commands
        assert all(c.startswith(sys.executable) and "--max-num-seqs" in c for c in scr.commands.values())
        await pilot.press("t")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        # where OSC 52 cannot reach a clipboard (tmux), the command is on screen and in a file
        saved = list((data_dir() / "commands").glob("trial-*.sh"))
        assert len(saved) == 1 and saved[0].read_text().strip() in scr.commands.values()
        assert saved[0].read_text().strip() in str(scr.query_one("#selected").render())
        assert not set(guards_of(os.getpid())) - before, "the study left its server running"


def test_a_job_that_finished_says_whether_it_left_a_result():
    from spoc_tui.tui.messages import RampFinished

    assert [RampFinished(s, "").ok for s in ("complete", "stopped_early", "interrupted", "error")] == [
        True,
        True,
        False,
        False,
    ]
    assert [TuneFinished(s, "").ok for s in ("complete", "exhausted", "interrupted", "error")] == [
        True,
        True,
        False,
        False,
    ]
