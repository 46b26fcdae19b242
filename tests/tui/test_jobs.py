"""The TUI's jobs (issue 78 point 3): every intent a screen posts and every report a job's worker
posts is taken by exactly one job, and the app hands each to it."""

from __future__ import annotations

import pytest
from textual.message import Message

from spoc_tui.config import Settings
from spoc_tui.tui.app import SpocApp
from spoc_tui.tui.jobs import Jobs
from spoc_tui.tui.messages import Intent, JobFinished, JobReport, RampFinished


def concrete(base: type[Message]) -> set[type[Message]]:
    """Every subclass of ``base`` that is posted (the shared base of the ends is not)."""
    import spoc_tui.tui.screens.load
    import spoc_tui.tui.screens.tune

    assert spoc_tui.tui.screens.load.LoadScreen and spoc_tui.tui.screens.tune.TuneScreen  # their intents

    out: set[type[Message]] = set()
    todo = list(base.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is not JobFinished:
            out.add(cls)
    return out


def test_every_intent_and_report_is_taken_by_one_job():
    app = SpocApp(Settings(vllm_urls=["http://127.0.0.1:1"], nvml=False), start_workers=False)
    taken = app.jobs.messages()
    assert len(taken) == len(set(taken))
    posted = concrete(Intent) | concrete(JobReport)
    assert len(posted) >= 12 and posted == set(taken), posted ^ set(taken)


def test_a_message_no_job_takes_is_a_defect_said_by_its_type():
    class Stray(JobReport):
        pass

    jobs = SpocApp(Settings(vllm_urls=["http://127.0.0.1:1"], nvml=False), start_workers=False).jobs
    assert isinstance(jobs, Jobs)
    with pytest.raises(KeyError, match="Stray"):
        jobs.take(Stray())


async def test_the_app_hands_a_report_to_its_job():
    app = SpocApp(Settings(vllm_urls=["http://127.0.0.1:1"], nvml=False, window=10), start_workers=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("l")  # the Load screen, where a ramp's end is shown
        await pilot.pause()
        app.jobs.ramp.badge = "step 2"
        app.post_message(RampFinished("complete", "complete: results in /tmp/x"))
        await pilot.pause()
        assert app.jobs.ramp.badge == "" and "ramp complete: results in /tmp/x" in [e.text for e in app.events.recent()]
