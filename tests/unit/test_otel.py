"""Agent traces as OpenTelemetry exports them (issue 53, item 1): OTLP JSON with the GenAI
semantic conventions, written small by the test as the collector's file exporter writes them,
with older attribute spellings and malformed spans."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spoc_tui.core.traces.read import TraceError, TraceRead, TraceSource, detect_format, read_trace
from spoc_tui.core.traces.stats import trace_stats

NS = 1_000_000_000
T0 = 1_764_300_000 * NS


def attr(key, value):
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}  # int64 as a string, as OTLP JSON has it
    return {"key": key, "value": {"stringValue": value}}


def span(sid, parent, start, end, trace="t1", name="", **attrs):
    return {
        "traceId": trace,
        "spanId": sid,
        "parentSpanId": parent,
        "name": name or sid,
        "kind": 1,
        "startTimeUnixNano": str(T0 + int(start * NS)),
        "endTimeUnixNano": str(T0 + int(end * NS)),
        "attributes": [attr(k.replace("__", "."), v) for k, v in attrs.items()],
        "status": {},
    }


def chat(sid, parent, start, end, n_in, n_out, **kw):
    return span(sid, parent, start, end, gen_ai__operation__name="chat", gen_ai__usage__input_tokens=n_in,
                gen_ai__usage__output_tokens=n_out, gen_ai__request__model="m", gen_ai__provider__name="openai",
                gen_ai__conversation__id="conv-1", **kw)  # fmt: skip


def export(spans):
    return {
        "resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"scope": {"name": "x"}, "spans": spans}]}]
    }


SESSION = [
    span("A", "", 0.5, 100, gen_ai__operation__name="invoke_agent", gen_ai__agent__name="main"),
    chat("c1", "A", 1.0, 2.0, 1000, 50, gen_ai__usage__cache_read__input_tokens=600),
    span("t1", "A", 2.0, 5.0, gen_ai__operation__name="execute_tool", gen_ai__tool__name="grep"),
    chat("c2", "A", 5.0, 6.0, 1200, 40),
    span("sub1", "A", 6.5, 20, gen_ai__operation__name="invoke_agent"),
    span("sub2", "A", 6.5, 15, gen_ai__operation__name="invoke_agent"),
    chat("s1a", "sub1", 7.0, 8.0, 300, 20),
    chat("s2a", "sub2", 7.2, 8.5, 400, 25),
    chat("s1b", "sub1", 10.0, 11.0, 500, 30),
    chat("c3", "A", 21.0, 22.0, 2000, 60),
]


def write(path, *exports):
    path.write_text("".join(json.dumps(e) + "\n" for e in exports))
    return path


def test_a_session_reads_as_calls_that_follow_each_other_after_the_tools_time(tmp_path):
    # two export lines, as the file exporter batches: the spans of one trace split between them
    p = write(tmp_path / "agent.jsonl", export(SESSION[:5]), export(SESSION[5:]))
    assert detect_format(p) == "otel"
    rows = list(read_trace(p))
    by = {r.id: r for r in rows}
    assert [r.id for r in rows] == ["c1", "c2", "s1a", "s2a", "s1b", "c3"]  # in start order
    assert [r.t for r in rows] == pytest.approx([0.0, 4.0, 6.0, 6.2, 9.0, 20.0])
    assert by["c1"].parent is None and by["c2"].parent == "c1" and by["c2"].think_s == pytest.approx(3.0)
    # each sub-agent's first call follows the call that ended last before it was invoked: c2
    assert by["s1a"].parent == "c2" and by["s2a"].parent == "c2" and by["s1b"].parent == "s1a"
    assert (
        by["s1b"].think_s == pytest.approx(2.0) and by["c3"].parent == "c2" and by["c3"].think_s == pytest.approx(15.0)
    )
    assert {r.conversation for r in rows} == {"conv-1"}
    assert [r.turn for r in rows] == [0, 1, 2, 3, 4, 5]  # in the session, not in each agent's chain
    assert [r.last for r in rows] == [False] * 5 + [True]  # the session's last call: c3, the latest to start
    assert by["c3"].as_spoc()["last"] is True and "last" in by["c1"].as_spoc()
    # the prompt grows from the call it follows: its blocks first, then fresh ones
    assert by["c2"].hash_ids[:15] == by["c1"].hash_ids[:15] and len(by["c2"].hash_ids) == 19
    assert by["c3"].hash_ids[:18] == by["c2"].hash_ids[:18]
    assert not set(by["s1a"].hash_ids) & set(by["c2"].hash_ids)  # a sub-agent starts with its own instructions
    st = trace_stats(p)
    s = st.sessions
    assert s is not None and s.sessions == 1 and s.calls_max == 6 and s.tool_calls == 1 and s.agents == 3
    assert s.branches == 2 and s.cache_read_tokens == 600 and s.spellings == ()
    assert st.as_dict()["sessions"]["branches"] == 2 and st.prefix_share and st.prefix_share > 0.3


def test_older_releases_spellings_are_read_and_named_and_what_a_file_lacks_is_said(tmp_path):
    old = [
        span("x1", "", 0, 1, trace="t9", gen_ai__system="openai", gen_ai__usage__prompt_tokens=100,
             gen_ai__usage__completion_tokens=10),
        span("x2", "", 3, 4, trace="t9", gen_ai__system="openai", gen_ai__usage__prompt_tokens=150,
             gen_ai__usage__completion_tokens=12),
    ]  # fmt: skip
    p = write(tmp_path / "old.jsonl", export(old))
    rows = list(read_trace(p, "otel"))
    assert [(r.input_tokens, r.output_tokens) for r in rows] == [(100, 10), (150, 12)]
    assert rows[1].parent == "x1" and rows[0].conversation == "t9"  # no conversation id: the trace is the session
    s = trace_stats(p).sessions
    assert s is not None
    assert set(s.spellings) == {"gen_ai.system", "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens"}
    assert any("gen_ai.conversation.id" in x for x in s.lacks) and any("execute_tool" in x for x in s.lacks)
    assert any("gen_ai.operation.name" in x for x in s.lacks)


def test_a_pretty_printed_export_and_failed_calls(tmp_path):
    failed = chat("f1", "A", 3.0, 3.5, 10, 1)
    failed["status"] = {"code": 2, "message": "rate limited"}
    no_usage = span("u1", "A", 4.0, 4.5, gen_ai__operation__name="chat")
    p = tmp_path / "pretty.json"
    p.write_text(json.dumps(export([*SESSION[:2], failed, no_usage]), indent=2))
    assert detect_format(p) == "otel"
    read = TraceRead()
    assert [r.id for r in read_trace(p, None, (), read)] == ["c1"]
    assert read.skipped == {"failed in the original (status ERROR)": 1, "a model call with no token usage": 1}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda s: s.update(attributes={"a": 1}), "line 1: span 'c1': attributes must be a list"),
        (
            lambda s: s.update(startTimeUnixNano="soon"),
            "span 'c1': startTimeUnixNano and endTimeUnixNano must be whole",
        ),
        (lambda s: s.update(endTimeUnixNano=str(T0)), "span 'c1': it ends"),
        # issue 74: each of these was a traceback (rc 1), not the file, line and span
        *(
            (
                lambda s, v=v: s.update(startTimeUnixNano=v),
                "span 'c1': startTimeUnixNano and endTimeUnixNano must be whole",
            )
            for v in ("9" * 401, "9" * 5000, "\u00b2", 10**400, str(2**64), -5)
        ),
        (lambda s: s.update(spanId=7), "traceId and spanId must be strings"),
        (
            lambda s: s["attributes"].__setitem__(1, attr("gen_ai.usage.input_tokens", "many")),
            "its input tokens are 'many'",
        ),
        (
            lambda s: s["attributes"].__setitem__(1, attr("gen_ai.usage.input_tokens", 10**12)),
            "between 0 and 10,000,000",
        ),
    ],
)
def test_a_malformed_span_is_named_by_file_line_and_span(tmp_path, mutate, message):
    spans = json.loads(json.dumps(SESSION[:2]))
    mutate(spans[1])
    p = write(tmp_path / "bad.jsonl", export(spans))
    with pytest.raises(TraceError) as e:
        list(read_trace(p, "otel"))
    assert message in str(e.value) and str(e.value).startswith("bad.jsonl")


def test_a_loop_of_parent_span_ids_and_a_line_that_is_no_export(tmp_path):
    loop = [span("p", "q", 0, 9, gen_ai__operation__name="invoke_agent"),
            span("q", "p", 0, 9, gen_ai__operation__name="invoke_agent"), chat("c", "p", 1, 2, 10, 2)]  # fmt: skip
    with pytest.raises(TraceError, match="parentSpanId ids loop"):
        list(read_trace(write(tmp_path / "loop.jsonl", export(loop)), "otel"))
    with pytest.raises(TraceError, match="line 2: not an OTLP export"):
        list(read_trace(write(tmp_path / "mixed.jsonl", export(SESSION[:2]), {"spans": []}), "otel"))
    nested = tmp_path / "bomb.jsonl"
    nested.write_text('{"resourceSpans": ' + "[" * 100_000 + "\n")
    with pytest.raises(TraceError, match="not JSON"):
        list(read_trace(nested, "otel"))


def test_spoc_trace_stats_and_convert_read_an_agent_trace(tmp_path):
    p = write(tmp_path / "agent.jsonl", export(SESSION))
    r = subprocess.run([sys.executable, "-m", "spoc_tui.cli", "trace", "stats", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "otel trace, 6 rows" in r.stdout and "sessions 1: 6 model calls each" in r.stdout
    assert "2 parallel branches" in r.stdout and "1 tool calls" in r.stdout
    out = tmp_path / "agent.spoc.jsonl"
    r = subprocess.run([sys.executable, "-m", "spoc_tui.cli", "trace", "convert", str(p), "--out", str(out)],
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    back = list(read_trace(out))
    assert [(x.id, x.parent, x.last) for x in back] == [(x.id, x.parent, x.last) for x in read_trace(p)]


def test_a_replays_speed_scales_the_tools_time_only_when_asked(tmp_path):
    """Issue 53: a replay's --speed scales when calls are due, never by default the tool's time
    between a call's answer and the next call; --trace-think scaled divides that too. The session
    replayed on a twin in virtual time at x2: after s1a's answer, s1b waits the 2 s recorded
    (later than its due time, 9 s / 2), or (scaled) 1 s, or until it is due if that is later."""
    from spoc_tui.core.ramp.experiment import run_now
    from spoc_tui.core.traces.read import trace_source
    from spoc_tui.twin.predict import TraceBackend, read_rows
    from tests.unit.test_twin_fleet import _trace_prediction

    p = write(tmp_path / "agent.jsonl", export(SESSION))
    gaps = {}
    for think in ("recorded", "scaled"):
        src = trace_source(str(p), think=think)
        assert src.think_scaled == (think == "scaled") and TraceSource.from_dict(src.as_dict()) == src
        pred = _trace_prediction(p, "2")
        pred = replace(pred, trace=read_rows(src, pred.twin.server.max_model_len))
        backend = TraceBackend(pred, pred.twin.fit, 0)
        run_now(backend.start_replay(0, 2.0))
        run_now(backend.advance(1e9))
        by = {s.trace_index: s for s in backend.window(0, 0.0, 1e9, 0.0)}
        s1a, s1b = by[2], by[4]  # (c3's 2,000 tokens pass the test twin's max-model-len: skipped)
        assert s1a.end is not None
        gaps[think] = s1b.start - s1a.end
        if think == "scaled":
            assert s1b.start == pytest.approx(max(4.5, s1a.end + 1.0), abs=1e-6)
    assert gaps["recorded"] == pytest.approx(2.0, abs=1e-6) and 1.0 - 1e-6 <= gaps["scaled"] < 2.0
    with pytest.raises(TraceError, match="--trace-think 'faster': recorded or scaled"):
        trace_source(str(p), think="faster")


def test_calls_left_out_are_named_and_a_malformed_file_is_one_line_and_exit_2(tmp_path):
    """Issue 53: a model call without token counts is left out and named (its span and line, the
    first of each reason), by ``spoc trace stats`` too; a malformed file is one line on stderr and
    exit 2, never a traceback."""
    failed = chat("f1", "A", 3.0, 3.5, 10, 1)
    failed["status"] = {"code": 2, "message": "rate limited"}
    no_usage = span("u1", "A", 4.0, 4.5, gen_ai__operation__name="chat")
    p = write(tmp_path / "agent.jsonl", export([*SESSION[:2], failed, no_usage]))
    read = TraceRead()
    list(read_trace(p, None, (), read))
    assert read.otel is not None and read.otel.left_out == {
        "failed in the original (status ERROR)": "span 'f1' (line 1)",
        "a model call with no token usage": "span 'u1' (line 1)",
    }
    r = subprocess.run([sys.executable, "-m", "spoc_tui.cli", "trace", "stats", str(p)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "left out: a model call with no token usage, the first span 'u1' (line 1)" in r.stdout
    spans = json.loads(json.dumps(SESSION[:2]))
    spans[1]["attributes"] = {"a": 1}
    bad = write(tmp_path / "bad.jsonl", export(SESSION[:1]), export(spans))
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "trace", "stats", str(bad)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert "bad.jsonl line 2: span 'c1': attributes must be a list" in line, line


def test_a_session_cut_by_a_time_window(tmp_path):
    """--trace-window 5:20 keeps the calls that start from 5 s to 25 s: the session's first two
    calls are cut, the sub-agents' calls (which follow c2, outside) are first in the window and are
    held by nothing, their times rebased to the window's start, and the session's last call is still
    marked last."""
    from spoc_tui.core.traces.read import trace_source

    p = write(tmp_path / "agent.jsonl", export(SESSION))
    rows = list(trace_source(str(p), window="5:20").rows())
    assert [r.id for r in rows] == ["s1a", "s2a", "s1b", "c3"]
    assert [r.t for r in rows] == pytest.approx([1.0, 1.2, 4.0, 15.0])
    assert rows[0].parent == "c2" and rows[1].parent == "c2"  # outside: a replay holds them for nothing
    assert rows[2].parent == "s1a" and rows[3].parent == "c2" and [r.last for r in rows] == [False] * 3 + [True]
    assert [r.conversation for r in rows] == ["conv-1"] * 4
    assert [r.turn for r in rows] == [2, 3, 4, 5]  # turns in the session: its start (turn 0) was cut


def test_span_ids_another_trace_reuses_link_nothing_across_traces(tmp_path):
    """Issue 74: keyed by span id alone, two traces reusing span ids (generators that count from 1)
    were linked into each other's sessions, and their prefix share read 83 % for 50 %."""

    def call(sid: str, start: float, n_in: int, tid: str) -> dict:
        return span(sid, "", start, start + 1, trace=tid, gen_ai__operation__name="chat",
                    gen_ai__usage__input_tokens=n_in, gen_ai__usage__output_tokens=40)  # fmt: skip

    def trace(tid: str) -> list[dict]:  # no conversation id: each trace is its session
        return [call("c1", 1.0, 640, tid), call("c2", 5.0, 1280, tid)]

    p = write(tmp_path / "two.jsonl", export(trace("ta") + trace("tb")))
    rows = list(read_trace(p, "otel"))
    assert sorted(r.id for r in rows) == ["ta/c1", "ta/c2", "tb/c1", "tb/c2"]
    by = {r.id: r for r in rows}
    assert by["ta/c2"].parent == "ta/c1" and by["tb/c2"].parent == "tb/c1"
    assert by["ta/c1"].parent is None and by["tb/c1"].parent is None
    assert set(by["ta/c1"].hash_ids).isdisjoint(by["tb/c1"].hash_ids)  # each session its own prefix
    assert by["ta/c2"].hash_ids[:10] == by["ta/c1"].hash_ids
    # a span exported twice (a retried export) is one call, the second said
    read = TraceRead()
    again = list(read_trace(write(tmp_path / "twice.jsonl", export(trace("ta") + trace("ta")[:1])), "otel", (), read))
    assert [r.id for r in again] == ["c1", "c2"] and read.skipped["the same span exported twice"] == 1


def test_a_call_without_its_output_tokens_is_skipped_and_counted_not_the_whole_file(tmp_path):
    no_out = span("c9", "", 3.0, 4.0, gen_ai__operation__name="chat", gen_ai__usage__input_tokens=100)
    read = TraceRead()
    rows = list(read_trace(write(tmp_path / "t.jsonl", export([*SESSION[:2], no_out])), "otel", (), read))
    assert [r.id for r in rows] == ["c1"] and read.skipped["a model call without its output tokens"] == 1


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(depth=st.integers(1, 5_000), width=st.integers(0, 5_000), shape=st.sampled_from(["chain", "agents"]))
@example(depth=20_000, width=0, shape="chain")  # the review's two cases, always run
@example(depth=1, width=20_000, shape="agents")
def test_deep_and_wide_span_trees_read_in_linear_time(tmp_path_factory, depth, width, shape):
    """Issue 74: a 20,000-deep chain of spans took over 120 s and 20,000 sub-agents of one agent
    62 s (walks from every call to the root, a scan of the invoking chain per sub-agent). Read in
    linear time, the largest take about a second of CPU; the bound is 20 s of this process's CPU
    on the read alone. (It was Hypothesis's 20 s deadline on the wall clock, building and writing
    the file included: 26 s for the three examples under the suite's four workers on two cores.)"""
    spans = [span("A", "", 0, 10**6, gen_ai__operation__name="invoke_agent")]
    if shape == "chain":  # every call nested in the span before it
        spans += [chat(f"d{i}", "A" if i == 0 else f"d{i - 1}", 1 + i, 1.5 + i, 64, 2) for i in range(depth)]
    else:  # one agent's calls, each invoking a sub-agent of one call
        for i in range(width):
            spans.append(chat(f"m{i}", "A", 1 + 2 * i, 1.5 + 2 * i, 64, 2))
            spans.append(span(f"s{i}", "A", 1.6 + 2 * i, 2.5 + 2 * i, gen_ai__operation__name="invoke_agent"))
            spans.append(chat(f"x{i}", f"s{i}", 1.7 + 2 * i, 2.4 + 2 * i, 128, 2))
    p = write(tmp_path_factory.mktemp("tree") / "tree.jsonl", export(spans))
    cpu = time.process_time()
    rows = list(read_trace(p, "otel"))
    cpu = time.process_time() - cpu
    assert cpu < 20.0, f"{cpu:.1f} s of CPU to read {len(spans):,} spans: not linear"
    assert len(rows) == (depth if shape == "chain" else 2 * width)
    if shape == "agents" and width:
        by = {r.id: r for r in rows}
        assert by[f"x{width - 1}"].parent == f"m{width - 1}"


def test_prompts_past_what_a_replay_holds_are_one_line_within_seconds(tmp_path):
    """Issue 74: 2,000 calls of 10M-token prompts took over 100 s (each prompt a tuple of its
    blocks' ids); past the bound the file is refused in one line, before any is built."""
    calls = [chat(f"c{i}", "", i, i + 0.5, 10_000_000, 1) for i in range(2000)]
    with pytest.raises(TraceError, match=r"its 2,000 calls' prompts come to 20,000,000,000 tokens, more than a replay"):
        list(read_trace(write(tmp_path / "big.jsonl", export(calls)), "otel"))
