"""`spoc ramp --trace` end to end against the simulator: every row sent once per step on its
schedule, prompt lengths exact as the server counts them, shared hash ids served from the prefix
cache, multi-turn parents holding their children back, and bad traces refused before any load."""

import json
import subprocess
import sys

import numpy as np
import pytest

from spoc_tui.procs.ports import free_ports
from spoc_tui.sim.process import start_sim


@pytest.fixture(scope="module")
def sim():
    port, dport = free_ports(2)
    proc = start_sim(["--gpu", "a100-40gb", "--max-model-len", "8192", "--dcgm-port", str(dport)], port)
    yield f"http://127.0.0.1:{port}"
    proc.stop()


def ramp(*args, timeout=150):
    return subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "ramp", *args], capture_output=True, text=True, timeout=timeout
    )


def write_mooncake(path, n=40, rate=8.0, seed=3):
    """A Mooncake trace: every third row shares its first two 512-token blocks with row 0."""
    rng = np.random.default_rng(seed)
    t = 0.0
    rows = []
    for i in range(n):
        t += rng.exponential(1 / rate)
        n_in = int(rng.integers(600, 2000))
        blocks = -(-n_in // 512)
        ids = (
            [1, 2] + [100 + 10 * i + k for k in range(blocks - 2)]
            if i % 3 == 0
            else [1000 + 10 * i + k for k in range(blocks)]
        )
        rows.append({"timestamp": round(t * 1000), "input_length": n_in, "output_length": int(rng.integers(4, 30)),
                     "hash_ids": ids})  # fmt: skip
    # one row too long for the server's 8192 tokens: skipped and counted
    rows.append({"timestamp": round(t * 1000) + 50, "input_length": 9000, "output_length": 10,
                 "hash_ids": list(range(5000, 5018))})  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def requests_of(out):
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def test_mooncake_replay_keeps_the_schedule_lengths_and_prefixes(sim, tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    rows = write_mooncake(trace)
    out = tmp_path / "out"
    r = ramp("--url", sim, "--trace", str(trace), "--speed", "1,2", "--sla", "ttft_p90<=2s", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "replaying the trace at x1" in r.stdout and "trace: sent 40/41" in r.stdout
    d = json.loads((out / "ramp.json").read_text())
    assert d["trace"]["format"] == "mooncake" and d["trace"]["rows"] == 41
    assert d["knee"]["unit"] == "x" and "max_speed_within_sla" in d["knee"]
    samples = requests_of(out)
    for step, speed in ((1, 1.0), (2, 2.0)):
        s = d["steps"][step - 1]
        assert s["speed"] == speed
        tr = s["trace"]
        assert (tr["rows"], tr["sent"], tr["skipped"]) == (41, 40, {"longer than max-model-len": 1})
        mine = sorted((x for x in samples if x["step"] == step), key=lambda x: x["trace_index"])
        # every row sent once, on its schedule: offsets are the trace's divided by the speed
        assert [x["trace_index"] for x in mine] == list(range(40))
        t_rows = [rows[i]["timestamp"] / 1000 for i in range(40)]
        for x in mine:
            want = (t_rows[x["trace_index"]] - t_rows[0]) / speed
            assert abs((x["scheduled"] - mine[0]["scheduled"]) - want) <= 0.002
        # never sent before its time; how late a loaded host sends is the send lag ramp.json
        # reports (a figure the host moves: not asserted here)
        lags = [x["start"] - x["scheduled"] for x in mine]
        assert min(lags) >= -0.001, lags
        assert 0 <= tr["send_lag_ms"]["p50"] <= tr["send_lag_ms"]["p99"] < float("inf")
        # prompt lengths exact as the server counts them (within 1 % or 4 tokens)
        for x in mine:
            assert x["ok"], x
            assert abs(x["prompt_tokens"] - x["planned_input"]) <= max(4, 0.01 * x["planned_input"])
            assert x["output_tokens"] == rows[x["trace_index"]]["output_length"]  # forced (ignore_eos)
        # rows sharing hash ids with an earlier row get cached tokens; the first of them does not
        sharing = [x for x in mine if x["trace_index"] % 3 == 0 and x["trace_index"] > 0]
        assert all(x["cached_tokens"] >= 512 for x in sharing), [x["cached_tokens"] for x in sharing]
        assert tr["prefix_share_implied"] > 0 and tr["prefix_cache_hit_rate_server"] > 0
        assert 0 < tr["achieved_rate"] < float("inf") and tr["trace_rate"] > 0
    # a new step's prompts share no text with the last step's (the cache sees each step afresh)
    first = next(x for x in samples if x["step"] == 2 and x["trace_index"] == 0)
    assert first["cached_tokens"] == 0


def test_bailian_turn_waits_for_its_parent(sim, tmp_path):
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
    out = tmp_path / "out"
    r = ramp("--url", sim, "--trace", str(trace), "--speed", "1", "--sla", "ttft_p90<=5s", "--out", str(out))
    assert r.returncode == 0, r.stderr
    samples = {x["trace_index"]: x for x in requests_of(out)}
    parent, child = samples[0], samples[2]
    assert child["held_s"] > 0.1  # sent when the parent ended, not at its timestamp
    assert child["start"] >= parent["end"] - 0.005
    assert child["cached_tokens"] >= 592  # the 37 whole 16-token blocks of the 600 it shares
    tr = json.loads((out / "ramp.json").read_text())["steps"][0]["trace"]
    assert tr["held_back_by_parent"] == 1 and tr["sent"] == 3


def test_weka_conversations_replay_with_think_time(sim, tmp_path):
    trace = tmp_path / "weka.jsonl"
    convs = [
        {"id": "a", "requests": [{"t": 0.0, "in": 300, "out": 5, "hash_ids": [1, 2, 3, 4]},
                                 {"t": 0.2, "in": 400, "out": 5, "hash_ids": [1, 2, 3, 4, 5, 6], "think_time": 0.3}]},
        {"id": "b", "requests": [{"t": 0.1, "in": 300, "out": 5, "hash_ids": [1, 2, 3, 4]}]},
    ]  # fmt: skip
    trace.write_text("".join(json.dumps(c) + "\n" for c in convs))
    out = tmp_path / "out"
    r = ramp("--url", sim, "--trace", str(trace), "--speed", "1", "--sla", "ttft_p90<=5s", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "plus the recorded time between them at every speed (--trace-think scaled divides it too)" in r.stdout
    by = {x["trace_index"]: x for x in requests_of(out)}
    assert sorted(by) == [0, 1, 2]
    # the second turn of "a" waits for its parent's end plus 0.3 s of thinking
    assert by[1]["start"] >= by[0]["end"] + 0.3 - 0.005
    # WEKA's hash ids are per conversation: "b" shares none of "a"'s text though its ids match
    assert by[2]["cached_tokens"] == 0


@pytest.mark.parametrize(
    ("body", "args", "needle"),
    [
        ('{"timestamp": 0, "input_length": 100, "output_length": 5}\n{"timestamp": 10, "input_length": "x"}\n', (),
         "line 2: input_length is 'x', not a number"),
        ('{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n', ("--users", "4"),
         "--trace replays at speed multiples"),
        ('{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n', ("--trace-window", "5"),
         "bad --trace-window '5'"),
        ('{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n', ("--speed", "2,1"),
         "speeds must be increasing"),
        ('{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1]}\n', ("--trace-window", "50:10"),
         "no row to send in the window"),
    ],
)  # fmt: skip
def test_bad_traces_and_flags_are_refused_before_any_load(tmp_path, body, args, needle):
    """Refused before the server is asked (it answers nothing here: asked, it would be 'cannot reach')."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(body)
    out = tmp_path / "out"
    (port,) = free_ports(1)
    r = ramp(
        "--url",
        f"http://127.0.0.1:{port}",
        "--trace",
        str(trace),
        "--sla",
        "ttft_p90<=5s",
        "--out",
        str(out),
        *args,
        timeout=60,
    )
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert not (out / "requests.jsonl").exists() or not (out / "requests.jsonl").read_text()


def test_speed_without_a_trace_is_refused(tmp_path):
    (port,) = free_ports(1)
    r = ramp("--url", f"http://127.0.0.1:{port}", "--speed", "2", "--out", str(tmp_path / "o"), timeout=30)
    assert r.returncode == 2 and "go with --trace FILE" in r.stderr


def test_two_load_generators_split_the_rows_on_one_clock(sim, tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    rows = write_mooncake(trace, n=30, rate=10)
    out = tmp_path / "out"
    r = ramp("--url", sim, "--trace", str(trace), "--speed", "1", "--workers", "2", "--sla", "ttft_p90<=5s",
             "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = requests_of(out)
    assert sorted(x["trace_index"] for x in got) == list(range(30))  # each row once, by one of the two
    t = {i: rows[i]["timestamp"] / 1000 for i in range(30)}
    first = min(got, key=lambda x: x["trace_index"])
    for x in got:  # one schedule across both processes
        assert abs((x["scheduled"] - first["scheduled"]) - (t[x["trace_index"]] - t[first["trace_index"]])) <= 0.002
    tr = json.loads((out / "ramp.json").read_text())["steps"][0]["trace"]
    assert tr["rows"] == 31 and tr["sent"] == 30 and 0 <= tr["send_lag_ms"]["p99"] < float("inf")


def test_an_agent_trace_replays_as_sessions_with_branches_in_parallel(sim, tmp_path):
    """Issue 53: an OTLP export of one agent session (tools between calls, two sub-agents in
    parallel), replayed: each call after the one it follows plus the recorded tool time, the
    sub-agents' calls side by side, each prompt extending the one before (the prefix cache serves it)."""
    from tests.unit.test_otel import SESSION, export

    def faster(s):  # a tenth of the recorded times: the session lasts about two seconds
        s = json.loads(json.dumps(s))
        for k in ("startTimeUnixNano", "endTimeUnixNano"):
            t = int(s[k])
            s[k] = str(t - (t - 1_764_300_000 * 10**9) * 9 // 10)
        return s

    trace = tmp_path / "agent.jsonl"
    trace.write_text(json.dumps(export([faster(s) for s in SESSION])) + "\n")
    out = tmp_path / "out"
    r = ramp("--url", sim, "--trace", str(trace), "--speed", "1", "--sla", "ttft_p90<=5s", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "plus the recorded time between them at every speed (--trace-think scaled divides it too)" in r.stdout
    by = {x["trace_index"]: x for x in requests_of(out)}
    assert sorted(by) == [0, 1, 2, 3, 4, 5]  # c1, c2, s1a, s2a, s1b, c3
    c1, c2, s1a, s2a, s1b, c3 = (by[i] for i in range(6))
    assert c2["start"] >= c1["end"] + 0.3 - 0.005  # the tool's 0.3 s after c1
    for sub in (s1a, s2a):
        assert sub["start"] >= c2["end"] - 0.005  # each sub-agent after the call that invoked it
    assert s2a["start"] < s1b["start"]  # the second sub-agent waits for c2 alone, not for the first's chain
    assert s1b["start"] >= s1a["end"] + 0.2 - 0.005 and c3["start"] >= c2["end"] + 1.5 - 0.005
    assert c2["cached_tokens"] >= 900  # c1's 15 whole 64-token blocks: the prompt grew from c1's
    # every continued call hit the prefix cache (c3 carries c2's 18 whole blocks), the first calls
    # of the session and of each sub-agent did not, and the server's own counters say so too
    assert s1b["cached_tokens"] > 0 and c3["cached_tokens"] >= 18 * 64, (s1b, c3)
    assert not c1["cached_tokens"] and not s1a["cached_tokens"] and not s2a["cached_tokens"]
    assert all(x["prompt_tokens"] == x["planned_input"] for x in by.values())  # every input length exact
    d = json.loads((out / "ramp.json").read_text())
    assert d["trace"]["format"] == "otel" and d["steps"][0]["trace"]["sent"] == 6
    assert d["steps"][0]["server"]["prefix_cache_hit_rate"] > 0
    # the session, whole in the step: its six calls, judged together, its time split
    ss = d["steps"][0]["sessions"]
    assert (ss["active"], ss["started"], ss["finished"], ss["whole"], ss["calls"]) == (1, 1, 1, 1, 6.0), ss
    assert (
        ss["between_s"] >= 0.3 - 0.005 and ss["engine_s"] > 0
    )  # at least c1 -> c2's tool; the sub-agents overlap c3's wait
