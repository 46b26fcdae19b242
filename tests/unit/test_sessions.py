"""A step's sessions (issue 53) from its calls: which started, finished and were whole in the
window, whether every call of a whole session met the SLA, and its time in the engine against
between calls (parallel calls counted once)."""

from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import RequestSample, Sessions, sessions_of, summarize_step


def call(conv: str, turn: int, start: float, end: float, ok: bool = True, last: bool | None = False, ttft=0.1):
    return RequestSample(start=start, end=end, step=1, users=2, ok=ok, ttft=ttft if ok else None,
                         e2e=end - start, output_tokens=10, conversation=conv, turn=turn, last=last)  # fmt: skip


def fast(s: RequestSample) -> bool:
    return s.ok and s.ttft is not None and s.ttft <= 0.5


def test_whole_sessions_are_judged_on_every_call_and_split_their_time():
    calls = [
        # a: three calls, 1 s between each: whole, every call fast
        call("u1#a", 0, 0.0, 2.0), call("u1#a", 1, 3.0, 5.0), call("u1#a", 2, 6.0, 8.0, last=True),
        # b: two sub-agents' calls in parallel after the first (overlap counted once): whole, one slow call
        call("u2#b", 0, 0.0, 1.0), call("u2#b", 1, 2.0, 4.0), call("u2#b", 2, 3.0, 5.0, ttft=0.9),
        call("u2#b", 3, 6.0, 7.0, last=True),
        # c: began before the window (no first call here)
        call("u3#c", 4, 0.0, 1.0), call("u3#c", 5, 2.0, 3.0, last=True),
        # d: started here, not finished
        call("u4#d", 0, 5.0, 6.0),
        # e: ended by a failed call (the load generator ends a conversation there): whole, not met
        call("u5#e", 0, 0.0, 1.0), call("u5#e", 1, 2.0, 2.5, ok=False),
    ]  # fmt: skip
    ss = sessions_of(calls, fast)
    assert ss is not None
    assert (ss.active, ss.started, ss.finished, ss.whole, ss.all_met) == (5, 4, 4, 3, 1)
    assert ss.calls == (3 + 4 + 2) / 3
    # a: 6 s in flight of 8; b: 0-1, 2-5, 6-7 = 5 s of 7; e: 1.5 s of 2.5
    assert ss.engine_s == 6.0 + 5.0 + 1.5 and ss.between_s == 2.0 + 2.0 + 1.0
    lo, hi = ss.all_met_ci95
    assert lo is not None and hi is not None and lo < 1 / 3 < hi
    assert ss.line() == (
        "sessions: 5 active, 4 started, 4 finished; 3 whole: every call met the SLA in 1 (33 %, 95 %: 1 %-91 %); "
        "3.0 calls each, 71 % of their time in the engine, 29 % between calls"
    )
    assert Sessions.from_dict(ss.as_dict()) == ss


def test_a_session_missing_a_call_in_the_window_is_not_whole():
    # turn 1 finished before the window opened: 0 and 2 here are not the whole session
    ss = sessions_of([call("u#a", 0, 0.0, 0.5), call("u#a", 2, 3.0, 4.0, last=True)], fast)
    assert ss is not None and (ss.started, ss.finished, ss.whole) == (1, 1, 0)
    assert ss.line().endswith("none whole in the step: measure longer steps to judge whole sessions")


def test_single_calls_have_no_sessions_and_a_request_log_cannot_say_which_call_is_last():
    singles = [call(f"u#{i}", 0, float(i), i + 1.0, last=True) for i in range(5)]
    assert sessions_of(singles, fast) is None
    assert sessions_of([], fast) is None
    unknown = [call("u#a", 0, 0.0, 1.0, last=None), call("u#a", 1, 2.0, 3.0, last=None)]
    ss = sessions_of(unknown, fast)
    assert ss is not None and ss.finished is None and ss.whole == 0
    assert "the calls do not say which is a session's last" in ss.line()


def test_the_step_carries_its_sessions_through_ramp_json():
    calls = [call("u1#a", 0, 0.0, 2.0), call("u1#a", 1, 3.0, 5.0, last=True)]
    step = summarize_step(1, 1, calls, 10.0, parse_sla("ttft_p90<=1s"))
    assert step.sessions is not None and step.sessions.whole == 1 and step.sessions.all_met == 1
    assert step.as_dict()["sessions"] == step.sessions.as_dict()
    old = step.as_dict()
    del old["sessions"]  # a ramp.json written before sessions were figures
    assert type(step).from_dict(old).sessions is None
    assert RequestSample.from_dict(calls[1].as_dict()).last is True
    legacy = calls[0].as_dict()
    assert legacy["last"] is False
    del legacy["last"]
    assert RequestSample.from_dict(legacy).last is None
