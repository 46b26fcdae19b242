"""Trace readers: each public format as published, written small by the test, with malformed rows."""

import io
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spoc_tui.core.traces.read import (
    TraceError,
    TraceRead,
    detect_format,
    parse_filters,
    parse_timestamp,
    read_trace,
    write_spoc,
)
from spoc_tui.core.traces.stats import trace_stats


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mooncake_rows_in_seconds_with_512_token_blocks(tmp_path):
    p = _jsonl(
        tmp_path / "mooncake_trace.jsonl",
        [
            {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": list(range(14))},
            {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": list(range(12)) + [46]},
            {"timestamp": 30535, "input_length": 100, "output_length": 1, "hash_ids": [99]},
        ],
    )
    assert detect_format(p) == "mooncake"
    rows = list(read_trace(p))
    assert [r.t for r in rows] == [0.0, pytest.approx(3.053), pytest.approx(3.053)]  # rebased, ms -> s
    assert rows[0].input_tokens == 6955 and rows[0].output_tokens == 52 and rows[0].block_tokens == 512
    assert rows[1].hash_ids[:12] == rows[0].hash_ids[:12] and rows[2].index == 2
    st = trace_stats(p)
    # 12 shared blocks of 512 of the second row's 6,472 tokens were in the first row
    assert st.prefix_share == pytest.approx(12 * 512 / (6955 + 6472 + 100))
    assert st.rows == 3 and st.span_s == pytest.approx(3.053) and st.input_tokens.max == 6955


def test_bailian_turns_keep_their_parent(tmp_path):
    p = _jsonl(
        tmp_path / "qwen_traceA.jsonl",
        [
            {"chat_id": 10, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 40, "output_length": 9,
             "type": "text", "turn": 1, "hash_ids": [1, 2, 3]},
            {"chat_id": 11, "parent_chat_id": 10, "timestamp": 3.25, "input_length": 70, "output_length": 12,
             "type": "text", "turn": 2, "hash_ids": [1, 2, 3, 4, 5]},
        ],
    )  # fmt: skip
    assert detect_format(p) == "bailian"
    first, second = read_trace(p)
    assert first.parent is None and second.parent == "10" and second.turn == 2
    assert second.t == pytest.approx(2.75) and second.block_tokens == 16


def test_burstgpt_skips_failed_requests_and_filters_by_model(tmp_path):
    p = tmp_path / "BurstGPT_1.csv"
    p.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,Conversation log\n"
        "140,ChatGPT,1360,357,1717,API log\n"
    )
    assert detect_format(p) == "burstgpt"
    read = TraceRead()
    rows = list(read_trace(p, read=read))
    assert [(r.index, r.t, r.input_tokens) for r in rows] == [(0, 0.0, 472), (2, 113.0, 417), (3, 135.0, 1360)]
    assert read.skipped == {"failed in the original (0 response tokens)": 1} and read.rows == 4
    read = TraceRead()
    gpt4 = list(read_trace(p, filters=parse_filters(["Model=GPT-4"]), read=read))
    assert [r.output_tokens for r in gpt4] == [276] and read.skipped["filtered out"] == 3
    with pytest.raises(TraceError, match="names 'Modle', a column the row does not have"):
        list(read_trace(p, filters=parse_filters(["Modle=GPT-4"])))
    with pytest.raises(TraceError, match="write COLUMN=VALUE"):
        parse_filters(["GPT-4"])


def test_azure_datetimes_with_seven_fractional_digits(tmp_path):
    p = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    assert detect_format(p) == "azure"
    rows = list(read_trace(p))
    assert rows[1].t == pytest.approx(4.314579, abs=1e-6) and rows[1].output_tokens == 109
    assert parse_timestamp("2024-05-10 00:00:00.009930+00:00") == pytest.approx(1715299200.00993)


def test_weka_conversations_start_at_zero_with_their_think_time(tmp_path):
    conv = {
        "id": "c1",
        "block_size": 64,
        "requests": [
            {"t": 0.0, "type": "s", "in": 1200, "out": 80, "hash_ids": list(range(18))},
            {"t": 9.5, "type": "n", "in": 1400, "out": 60, "hash_ids": list(range(21)), "think_time": 4.0},
        ],
    }
    p = tmp_path / "agentic.jsonl"
    p.write_text(json.dumps(conv) + "\n" + json.dumps({**conv, "id": "c2"}) + "\n")
    assert detect_format(p) == "weka"
    rows = list(read_trace(p))
    assert [(r.conversation, r.t, r.turn, r.parent) for r in rows] == [
        ("c1", 0.0, 0, None), ("c1", 9.5, 1, "c1#0"), ("c2", 0.0, 0, None), ("c2", 9.5, 1, "c2#0")
    ]  # fmt: skip
    assert rows[1].think_s == 4.0 and rows[1].block_tokens == 64
    array = tmp_path / "agentic.json"
    array.write_text(json.dumps([conv]))
    assert [r.input_tokens for r in read_trace(array)] == [1200, 1400]
    st = trace_stats(p)
    assert st.conversations == 2 and st.prefix_share == pytest.approx(18 * 64 * 2 / (2600 * 2))  # per conversation


def test_our_own_jsonl_round_trips_what_the_others_convert_to(tmp_path):
    src = _jsonl(
        tmp_path / "m.jsonl",
        [
            {"timestamp": 1000, "input_length": 600, "output_length": 20, "hash_ids": [7, 8]},
            {"timestamp": 1500, "input_length": 900, "output_length": 30, "hash_ids": [7, 9]},
        ],
    )
    out = io.StringIO()
    assert write_spoc(read_trace(src), out) == 2
    ours = tmp_path / "ours.jsonl"
    ours.write_text(out.getvalue())
    assert detect_format(ours) == "spoc"
    again = list(read_trace(ours))
    assert [(r.t, r.input_tokens, r.output_tokens, r.hash_ids, r.block_tokens) for r in again] == [
        (0.0, 600, 20, (7, 8), 512), (0.5, 900, 30, (7, 9), 512)
    ]  # fmt: skip
    future = tmp_path / "future.jsonl"
    future.write_text('{"spoc_trace": 9}\n')
    with pytest.raises(TraceError, match="version 9; this spoc-tui reads version 1: upgrade"):
        list(read_trace(future))


@pytest.mark.parametrize(
    ("fmt", "lines", "message"),
    [
        ("mooncake", ['{"timestamp": 0, "input_length": 10, "output_length": 2}', "{not json"], "line 2: not JSON"),
        ("mooncake", ['{"timestamp": 0, "output_length": 2}'], "line 1: missing 'input_length'"),
        ("mooncake", ['{"timestamp": 0, "input_length": "many", "output_length": 2}'], "input_length is 'many'"),
        ("mooncake", ['{"timestamp": 0, "input_length": 1000, "output_length": 2, "hash_ids": [1]}'],
         "1 hash_ids for 1000 input tokens: a Mooncake block is 512 tokens, so it takes 2"),
        ("mooncake", ['{"timestamp": 900, "input_length": 5, "output_length": 2}',
                      '{"timestamp": 100, "input_length": 5, "output_length": 2}'], "line 2: its timestamp goes back"),
        ("mooncake", ['{"timestamp": 0, "input_length": 5, "output_length": 0}'], "output_length is 0"),
        ("bailian", ['{"parent_chat_id": -1, "timestamp": 0, "input_length": 5, "output_length": 2}'],
         "missing 'chat_id'"),
        ("burstgpt", ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "1,GPT-4,abc,2,3,x"],
         "line 2: Request tokens is 'abc', not a number"),
        ("burstgpt", ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "1,GPT-4,2"],
         "line 2: 3 fields, the header has 6"),
        ("azure", ["TIMESTAMP,ContextTokens,GeneratedTokens", "yesterday,3,4"], "TIMESTAMP is 'yesterday'"),
        ("azure", ["TIMESTAMP,Tokens"], "needs the column(s) ContextTokens, GeneratedTokens"),
        ("weka", ['{"id": "c", "requests": [{"t": 0, "in": 5}]}'], "missing 'out' (conversation c, request 1)"),
        ("weka", ['{"id": "c"}'], "needs a 'requests' list"),
    ],
)  # fmt: skip
def test_a_malformed_row_is_named_by_line_and_field(tmp_path, fmt, lines, message):
    p = tmp_path / "t.txt"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        list(read_trace(p, fmt))


def test_unknown_and_empty_files_are_refused(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(TraceError, match="a header like no known trace format"):
        detect_format(p)
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(TraceError, match="empty"):
        detect_format(tmp_path / "e.jsonl")
    with pytest.raises(TraceError, match="no such file"):
        list(read_trace(tmp_path / "missing.jsonl", "mooncake"))
    only_failed = tmp_path / "f.csv"
    only_failed.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n1,GPT-4,5,0,5,x\n")
    with pytest.raises(TraceError, match=r"no row to send \(1 failed in the original"):
        trace_stats(only_failed)


def test_stats_of_a_bursty_trace(tmp_path):
    rows = [{"timestamp": i * 1000, "input_length": 100, "output_length": 10} for i in range(60)]
    rows += [{"timestamp": 59_000 + k, "input_length": 100, "output_length": 10} for k in range(60)]  # a burst
    st = trace_stats(_jsonl(tmp_path / "m.jsonl", rows))
    assert st.rows == 120 and st.span_s == pytest.approx(59.059)
    assert st.rate_per_s == pytest.approx(120 / 59.059) and st.peak_to_mean > 20
    assert st.replay_s(2) == pytest.approx(59.059 / 2) and st.prefix_share is None
    assert sum(st.arrivals) == 120 and len(st.arrivals) == 60 and not math.isnan(st.peak_to_mean)


def test_spoc_trace_stats_and_convert_from_the_command_line(tmp_path):
    import subprocess
    import sys

    src = tmp_path / "BurstGPT_1.csv"
    src.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,Conversation log\n"
    )

    def spoc(*args):
        return subprocess.run([sys.executable, "-m", "spoc_tui.cli", "trace", *args], capture_output=True, text=True)

    r = spoc("stats", str(src), "--json", "--speed", "2")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["format"] == "burstgpt" and d["rows"] == 2 and d["replay_s"] == pytest.approx(56.5)
    assert d["skipped"] == {"failed in the original (0 response tokens)": 1}
    out = tmp_path / "ours.jsonl"
    r = spoc("convert", str(src), "--out", str(out))
    assert r.returncode == 0 and "wrote 2 rows" in r.stdout and len(out.read_text().splitlines()) == 3
    r = spoc("stats", str(src), "--trace-format", "azure")
    assert r.returncode == 2 and "line 1: the azure format needs the column(s) TIMESTAMP" in r.stderr
    r = spoc("convert", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "x.jsonl"))
    assert r.returncode == 2 and "no such file" in r.stderr and not (tmp_path / "x.jsonl").exists()
    assert not list(tmp_path.glob("*.part"))


# -- issue 56 item 2 and 6: parent links, bounds, BOM and gzip ---------------------------------


def _spoc(path, rows):
    return _jsonl(path, [{"spoc_trace": 1}, *rows])


def _row(t, id_=None, parent=None, **kw):
    d = {"t": t, "input_tokens": 10, "output_tokens": 5, **kw}
    if id_ is not None:
        d["id"] = id_
    if parent is not None:
        d["parent"] = parent
    return d


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([_row(0, "a"), _row(1, "b", parent="b")], "line 3: the row is its own parent ('b')"),
        (
            [_row(0, "a", parent="c"), _row(1, "c", parent="b"), _row(2, "b", parent="a")],
            "line 3: row 'c' is the parent of line 2",
        ),
        ([_row(0, "x", parent="y"), _row(5, "y")], "line 3: row 'y' is the parent of line 2"),
        ([_row(0, "a"), _row(1e300, "b")], "line 3: timestamp lies"),
        ([_row(0, "a"), _row(1, "b", parent="a", think_s=1e300)], "think_s is 1e+300: it must be at most 86,400"),
        ([_row(0, output_tokens=10**12)], "line 2: output_tokens is 1000000000000: it must be at most 10,000,000"),
        ([_row(0, input_tokens=2e7)], "input_tokens is 20000000.0: it must be at most 10,000,000"),
    ],
)
def test_parent_loops_and_unbounded_times_and_lengths_are_refused_when_read(tmp_path, rows, message):
    p = _spoc(tmp_path / "t.jsonl", rows)
    with pytest.raises(TraceError) as e:
        list(read_trace(p))
    assert message.replace("timestamp", "t") in str(e.value) and str(e.value).startswith("t.jsonl line ")
    with pytest.raises(TraceError):
        trace_stats(p)


def test_bailian_parent_loops_and_a_parent_cut_off_before_the_trace(tmp_path):
    def turn(chat, parent, t):
        return {"chat_id": chat, "parent_chat_id": parent, "timestamp": t, "input_length": 40, "output_length": 9}

    loop = _jsonl(tmp_path / "loop.jsonl", [turn(1, 3, 0.0), turn(2, 1, 1.0), turn(3, 2, 2.0)])
    with pytest.raises(TraceError, match="line 3: row '3' is the parent of line 1"):
        list(read_trace(loop))
    # a follow-up whose first turn was before the capture: allowed, it starts as a first turn
    cut = _jsonl(tmp_path / "cut.jsonl", [turn(7, 5, 0.0), turn(8, 7, 1.0)])
    assert [r.parent for r in read_trace(cut)] == ["5", "7"]


def test_huge_lengths_and_spans_are_refused_in_every_format(tmp_path):
    burst = tmp_path / "b.csv"
    burst.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,m,10,1e12,1,x\n")
    with pytest.raises(TraceError, match="b.csv line 2: Response tokens is 1e12"):
        list(read_trace(burst))
    azure = tmp_path / "a.csv"
    azure.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,5\n2025-01-01 00:00:00,10,5\n")
    with pytest.raises(TraceError, match="a.csv line 3: TIMESTAMP lies 411 days after the first row"):
        list(read_trace(azure))
    moon = _jsonl(tmp_path / "m.jsonl", [{"timestamp": 0, "input_length": 5, "output_length": 1},
                                         {"timestamp": 1e300, "input_length": 5, "output_length": 1}])  # fmt: skip
    with pytest.raises(TraceError, match="m.jsonl line 2: timestamp lies"):
        list(read_trace(moon))
    weka = _jsonl(tmp_path / "w.jsonl", [{"id": "c", "requests": [{"t": 0, "in": 5, "out": 1, "think_time": 1e9}]}])
    with pytest.raises(TraceError, match="think_time is 1000000000.0: it must be at most 86,400"):
        list(read_trace(weka))


def test_a_byte_order_mark_and_gzip_are_read(tmp_path):
    import gzip

    rows = [
        {"timestamp": 0, "input_length": 5, "output_length": 1},
        {"timestamp": 10, "input_length": 6, "output_length": 2},
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    gz = tmp_path / "trace.jsonl.gz"
    gz.write_bytes(gzip.compress(("\ufeff" + text).encode()))
    csv_gz = tmp_path / "burst.csv"  # compressed whatever its name says
    csv_gz.write_bytes(
        gzip.compress(b"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,m,10,3,13,x\n")
    )
    for p in (bom, gz):
        assert detect_format(p) == "mooncake"
        assert [r.input_tokens for r in read_trace(p)] == [5, 6]
    assert detect_format(csv_gz) == "burstgpt" and [r.output_tokens for r in read_trace(csv_gz)] == [3]
    broken = tmp_path / "broken.gz"
    broken.write_bytes(gzip.compress(text.encode())[:-12])
    with pytest.raises(TraceError, match="broken.gz"):
        list(read_trace(broken, "mooncake"))


@settings(deadline=2000, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {
                "t": st.one_of(
                    st.floats(allow_nan=True, allow_infinity=True), st.integers(-5, 10**6), st.text(max_size=5)
                )
            },
            optional={
                "input_tokens": st.one_of(st.integers(-1, 10**13), st.floats(), st.none(), st.text(max_size=3)),
                "output_tokens": st.one_of(st.integers(-1, 10**13), st.floats()),
                "id": st.sampled_from(["a", "b", "c", "d"]),
                "parent": st.sampled_from(["a", "b", "c", "d", None]),
                "think_s": st.one_of(st.floats(), st.integers(-3, 10**9)),
                "hash_ids": st.one_of(st.lists(st.integers(0, 9), max_size=4), st.text(max_size=2)),
                "block_tokens": st.integers(-1, 600),
            },
        ),
        max_size=12,
    )
)
def test_any_spoc_trace_is_read_or_refused_with_a_named_line_quickly(tmp_path, rows):
    """Property: whatever the rows, reading ends (each example within the deadline) with rows
    whose links point back and whose times and lengths are bounded, or with a TraceError."""
    p = tmp_path / "h.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in [{"spoc_trace": 1}, *rows]))
    try:
        out = list(read_trace(p, "spoc"))
    except TraceError as e:
        assert str(e).startswith("h.jsonl")
        return
    seen = set()
    for r in out:
        assert r.parent is None or r.parent in seen or r.parent not in {x.id for x in out}
        assert 0 <= r.t <= 366 * 86400 and 1 <= r.input_tokens <= 10**7 and 1 <= r.output_tokens <= 10**7
        seen.add(r.id)


def test_a_file_of_one_endless_line_is_refused_once_a_line_is_read_not_held_whole(tmp_path):
    """Issue 74: a 400 KB gzip holding one 400 MB line took 866 MB for ``spoc trace stats``; a line
    is read at most MAX_LINE characters (detection included) and refused past it."""
    import gzip

    from spoc_tui.core.traces.read import MAX_LINE

    p = tmp_path / "one.jsonl.gz"
    with gzip.open(p, "wb") as f:
        f.write(b'{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1], "pad": "')
        f.write(b"x" * (MAX_LINE + 10))
        f.write(b'"}\n')
    with pytest.raises(TraceError, match=r"one.jsonl.gz line 1: longer than 16 MiB"):
        list(read_trace(p, "mooncake"))
    with pytest.raises(TraceError, match=r"line 1: longer than 16 MiB"):
        read_trace(p).__next__()  # the format's detection reads a line too
