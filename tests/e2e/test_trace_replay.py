"""`spoc ramp --trace` end to end against the simulator: every row sent once per step on its
schedule, prompt lengths exact as the server counts them, shared hash ids served from the prefix
cache, follow-up turns held by their parents across two load generators, and bad traces refused
before any load. The schedule's rules on every format (Bailian's parents, WEKA's think time and
scopes, an agent's branches) are tests/unit/test_trace_replay_virtual.py's, on the virtual clock."""

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


def write_bailian(path, n=30, rate=10.0, seed=5):
    """A Bailian trace of ``n`` first turns, each third one followed up 0.05 s later by a turn
    that waits for its long answer (the parent holds it), sharing its parent's prompt blocks."""
    rng = np.random.default_rng(seed)
    t, rows = 0.0, []
    for i in range(n):
        t += rng.exponential(1 / rate)
        ids = [10_000 + 100 * i + k for k in range(8)]
        first = i % 3 == 0
        rows.append({"chat_id": 2 * i, "parent_chat_id": -1, "timestamp": round(t, 4), "input_length": 128,
                     "output_length": 120 if first else 6, "type": "text", "turn": 1, "hash_ids": ids})  # fmt: skip
        if first:
            rows.append({"chat_id": 2 * i + 1, "parent_chat_id": 2 * i, "timestamp": round(t + 0.05, 4),
                         "input_length": 160, "output_length": 4, "type": "text", "turn": 2,
                         "hash_ids": [*ids, 20_000 + i, 30_000 + i]})  # fmt: skip
    rows.sort(key=lambda r: r["timestamp"])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


def test_two_load_generators_split_the_rows_on_one_clock(sim, tmp_path):
    """Each row sent once, by one of two processes, on one schedule; a follow-up turn goes to the
    process that sent the turn it follows, and waits for that turn's answer there (were it sent by
    the other, nothing would hold it and it would leave 0.05 s after its parent, mid-answer). The
    release rule itself, and the other formats' turns, are tests/unit/test_trace_replay_virtual.py's."""
    trace = tmp_path / "bailian.jsonl"
    rows = write_bailian(trace)
    out = tmp_path / "out"
    r = ramp("--url", sim, "--trace", str(trace), "--speed", "1", "--workers", "2", "--sla", "ttft_p90<=5s",
             "--out", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = {x["trace_index"]: x for x in requests_of(out)}
    assert sorted(got) == list(range(len(rows)))  # each row once, by one of the two
    assert all(x["ok"] for x in got.values())
    t = {i: rows[i]["timestamp"] for i in range(len(rows))}
    first = got[0]
    for i, x in got.items():  # one schedule across both processes (a held turn's is its own time)
        assert abs((x["scheduled"] - first["scheduled"]) - (t[i] - t[0])) <= 0.002
    by_chat = {rows[i]["chat_id"]: got[i] for i in got}
    children = [(by_chat[r["parent_chat_id"]], got[i]) for i, r in enumerate(rows) if r["parent_chat_id"] >= 0]
    assert len(children) == 10
    for parent, child in children:  # held until the parent's answer ended: in the parent's process
        assert child["start"] >= parent["end"] - 0.005, (parent, child)
        assert child["held_s"] and child["held_s"] > 0, child
    tr = json.loads((out / "ramp.json").read_text())["steps"][0]["trace"]
    assert tr["rows"] == tr["sent"] == 40 and tr["held_back_by_parent"] == 10
    assert 0 <= tr["send_lag_ms"]["p99"] < float("inf")
