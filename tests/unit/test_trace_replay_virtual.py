"""A trace replay's schedule on the virtual clock: ``spoc ramp --trace``'s driver and writer over
a twin of known coefficients, each step a replay in virtual time (deterministic, a second each).

What the schedule is: a row is sent at its timestamp over the speed, or, where the turn it follows
is in the replay, after that turn's answer plus its think time (:func:`release`, the one rule the
live replay and the twin's keep); hash ids shared within their scope are served from the prefix
cache. That the live load generator sends by the same rule, on its own clock and across two
processes, is tests/e2e/test_trace_replay.py's (its two-generator test replays parents and
children); these ran there against a live simulator in real time, and moved here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
from pathlib import Path

from spoc_tui.core.ramp.knee import parse_speed_plan
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import RequestSample
from spoc_tui.core.traces.read import trace_source
from spoc_tui.core.traces.replay import release
from spoc_tui.load.ramp import RampConfig
from spoc_tui.twin.predict import read_rows
from spoc_tui.workload import load_workload
from tests.unit.test_ramp_virtual import on_twin
from tests.unit.test_twin_fit import twin


def replay(tmp_path: Path, trace: Path, speed: str = "1") -> tuple[dict, dict[int, RequestSample], str]:
    """``spoc ramp --trace TRACE --speed SPEED`` on a twin of known coefficients without step noise
    (tests/unit/test_ramp_virtual.py's ``on_twin``): its ramp.json, its requests by row and what
    it printed."""
    from spoc_tui.cli.ramp import run

    cfg = RampConfig("http://127.0.0.1:1", load_workload("chatbot"), parse_speed_plan(speed),
                     tuple(parse_sla("ttft_p90<=5s")), tmp_path / "out", trace=trace_source(str(trace)))  # fmt: skip
    cfg.validate()
    sent: list[RequestSample] = []
    tw = twin(0.0)  # the simulator's context, as the live tests' (the test twin's is 2,048)
    tw = dataclasses.replace(tw, server=dataclasses.replace(tw.server, max_model_len=8192))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run(cfg, functools.partial(on_twin, tw=tw, sent=sent)) == 0
    d = json.loads((cfg.out_dir / "ramp.json").read_text())
    by = {s.trace_index: s for s in sent if s.trace_index is not None}
    assert len(by) == len(sent)  # each row once
    return d, by, buf.getvalue()


def end(s: RequestSample) -> float:
    assert s.end is not None
    return s.end


def test_the_release_rule():
    assert release(2.0, None, 5.0) == release(2.0, None) and release(2.0, None).held_s == 0  # nothing holds it
    assert release(2.0, 1.0, 0.5).at == 2.0  # its parent ended and was thought about in time
    r = release(2.0, 1.8, 0.5)
    assert r.at == 2.3 and abs(r.held_s - 0.3) < 1e-12


def test_a_bailian_turn_waits_for_its_parent(tmp_path):
    trace = tmp_path / "bailian.jsonl"
    ids = list(range(1, 40))
    rows = [
        # a long first answer (300 tokens); its follow-up is due 0.1 s later, so the parent holds it
        {"chat_id": 7, "parent_chat_id": -1, "timestamp": 0.0, "input_length": 600, "output_length": 300,
         "type": "text", "turn": 1, "hash_ids": ids[:38]},
        {"chat_id": 8, "parent_chat_id": -1, "timestamp": 0.05, "input_length": 200, "output_length": 5,
         "type": "text", "turn": 1, "hash_ids": list(range(500, 513))},
        {"chat_id": 9, "parent_chat_id": 7, "timestamp": 0.1, "input_length": 800, "output_length": 5,
         "type": "text", "turn": 2, "hash_ids": ids[:38] + list(range(600, 612))},
    ]  # fmt: skip
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    d, by, _ = replay(tmp_path, trace)
    parent, other, child = by[0], by[1], by[2]
    assert child.scheduled is not None and abs(child.scheduled - (parent.scheduled or 0) - 0.1) < 1e-9  # its due time
    assert child.held_s is not None and child.held_s > 0.1  # sent when the parent ended, not at its timestamp
    assert abs(child.start - end(parent)) < 1e-9 and abs(child.start - child.scheduled - child.held_s) < 1e-9
    assert other.held_s is None and parent.held_s is None  # first turns: nothing holds them
    assert (child.cached_tokens or 0) >= 592  # the 37 whole 16-token blocks of the 600 it shares
    tr = d["steps"][0]["trace"]
    assert tr["held_back_by_parent"] == 1 and tr["sent"] == 3


def test_weka_conversations_replay_with_think_time(tmp_path):
    trace = tmp_path / "weka.jsonl"
    convs = [
        {"id": "a", "requests": [{"t": 0.0, "in": 300, "out": 5, "hash_ids": [1, 2, 3, 4]},
                                 {"t": 0.2, "in": 400, "out": 5, "hash_ids": [1, 2, 3, 4, 5, 6], "think_time": 0.3}]},
        {"id": "b", "requests": [{"t": 0.1, "in": 300, "out": 5, "hash_ids": [1, 2, 3, 4]}]},
    ]  # fmt: skip
    trace.write_text("".join(json.dumps(c) + "\n" for c in convs))
    _, by, out = replay(tmp_path, trace)
    assert "plus the recorded time between them at every speed (--trace-think scaled divides it too)" in out
    assert sorted(by) == [0, 1, 2]
    # the second turn of "a" waits for its parent's end plus 0.3 s of thinking
    assert abs(by[1].start - (end(by[0]) + 0.3)) < 1e-9 and by[1].held_s
    assert (by[1].cached_tokens or 0) > 0  # its own conversation's first turn is cached
    # WEKA's hash ids are per conversation: "b" shares none of "a"'s text though its ids match
    assert by[2].cached_tokens == 0


def test_weka_think_time_scales_with_the_speed_when_asked(tmp_path):
    """--trace-think scaled: the wait after an answer is divided by the speed, as start times are."""
    trace = tmp_path / "weka.jsonl"
    trace.write_text(json.dumps({"id": "a", "requests": [{"t": 0.0, "in": 300, "out": 5},
                                 {"t": 0.2, "in": 400, "out": 5, "think_time": 0.4}]}) + "\n")  # fmt: skip
    from spoc_tui.core.traces.read import trace_source as source

    scaled = source(str(trace), think="scaled")
    rows = read_rows(scaled, 4096)
    assert [r.think_s for r in rows.at(2.0)] == [None, 0.2] and [r.think_s for r in rows.at(1.0)] == [None, 0.4]
    assert all(scaled.think_s(r, 2.0) == (r2.think_s or 0.0) for r, r2 in zip(rows.rows, rows.at(2.0), strict=True))


def test_an_agent_trace_replays_as_sessions_with_branches_in_parallel(tmp_path):
    """Issue 53: an OTLP export of one agent session (tools between calls, two sub-agents in
    parallel), replayed: each call after the one it follows plus the recorded tool time, the
    sub-agents' calls side by side, each prompt extending the one before (the prefix cache serves it)."""
    from tests.unit.test_otel import SESSION, export

    trace = tmp_path / "agent.jsonl"
    trace.write_text(json.dumps(export(SESSION)) + "\n")
    d, by, out = replay(tmp_path, trace)
    assert "plus the recorded time between them at every speed (--trace-think scaled divides it too)" in out
    assert sorted(by) == [0, 1, 2, 3, 4, 5]  # c1, c2, s1a, s2a, s1b, c3
    c1, c2, s1a, s2a, s1b, c3 = (by[i] for i in range(6))
    assert c2.start >= end(c1) + 3.0 - 1e-9  # the tool's 3 s after c1
    for sub in (s1a, s2a):
        assert sub.start >= end(c2) - 1e-9  # each sub-agent after the call that invoked it
    assert s2a.start < s1b.start  # the second sub-agent waits for c2 alone, not for the first's chain
    assert s1b.start >= end(s1a) + 2.0 - 1e-9 and c3.start >= end(c2) + 15.0 - 1e-9
    assert (c2.cached_tokens or 0) >= 900  # c1's whole blocks: the prompt grew from c1's
    # every continued call hit the prefix cache, the first calls of the session and of each
    # sub-agent did not
    assert (s1b.cached_tokens or 0) > 0 and (c3.cached_tokens or 0) >= 18 * 64, (s1b, c3)
    assert not c1.cached_tokens and not s1a.cached_tokens and not s2a.cached_tokens
    assert d["trace"]["format"] == "otel" and d["steps"][0]["trace"]["sent"] == 6
    assert d["steps"][0]["server"]["prefix_cache_hit_rate"] > 0
    # the session, whole in the step: its six calls, judged together, its time split
    ss = d["steps"][0]["sessions"]
    assert (ss["active"], ss["started"], ss["finished"], ss["whole"], ss["calls"]) == (1, 1, 1, 1, 6.0), ss
    assert ss["between_s"] >= 3.0 - 1e-9 and ss["engine_s"] > 0  # at least c1 -> c2's tool


def test_the_replay_is_the_same_for_a_seed(tmp_path):
    trace = tmp_path / "weka.jsonl"
    trace.write_text(json.dumps({"id": "a", "requests": [{"t": 0.0, "in": 300, "out": 9},
                                 {"t": 0.2, "in": 400, "out": 5, "think_time": 0.3}]}) + "\n")  # fmt: skip
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, one, _ = replay(tmp_path / "a", trace)
    _, two, _ = replay(tmp_path / "b", trace)
    assert [(s.start, s.end, s.ttft) for s in one.values()] == [(s.start, s.end, s.ttft) for s in two.values()]
