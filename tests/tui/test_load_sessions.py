"""The Load screen's side of agent sessions (issue 53): the latest step's sessions under the knee,
from the steps as the ramp's worker hands them over (the ramp itself is
tests/unit/test_ramp_virtual.py's, in virtual time)."""

from spoc_tui.core.ramp.experiment import RampProgress
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import RequestSample, summarize_step
from tests.tui.helpers import make_app


def call(conv: str, turn: int, start: float, last: bool) -> RequestSample:
    return RequestSample(start=start, end=start + 1.0, step=1, users=4, ok=True, ttft=0.2, e2e=1.0,
                         output_tokens=20, conversation=conv, turn=turn, last=last)  # fmt: skip


async def test_the_latest_steps_sessions_show_under_the_knee():
    app = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        app.action_load()
        await pilot.pause()
        form = app.load_screen
        calls = [call(f"u{u}#s", t, u * 0.1 + t * 2.0, t == 2) for u in range(4) for t in range(3)]
        step = summarize_step(1, 4, calls, 30.0, parse_sla("ttft_p90<=1s"))
        form.show_progress(RampProgress("step_done", 1, 4, 30.0, 30.0, len(calls), (step,), None))
        await pilot.pause()
        shown = str(form.knee.render())
        assert "at 4 users: sessions: 4 active, 4 started, 4 finished; 4 whole: every call met the SLA in 4" in shown
        # single calls have no sessions line
        singles = [RequestSample(start=float(i), end=i + 1.0, step=1, users=4, ok=True, ttft=0.2, e2e=1.0,
                                 conversation=f"u{i}#x") for i in range(4)]  # fmt: skip
        one = summarize_step(1, 4, singles, 30.0, parse_sla("ttft_p90<=1s"))
        form.show_progress(RampProgress("step_done", 1, 4, 30.0, 30.0, 4, (one,), None))
        await pilot.pause()
        assert "sessions:" not in str(form.knee.render())
