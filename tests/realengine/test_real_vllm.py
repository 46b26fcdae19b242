"""spoc-tui against a real vLLM 0.32 CPU server and a real Prometheus."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time

import httpx
import pytest

from spoc_tui.collectors.poller import VllmPoller
from spoc_tui.collectors.promql import VLLM_SELECTOR, PromQLCollector
from spoc_tui.collectors.scrape import SourceError
from spoc_tui.core.metrics.promparse import Exposition, parse_text
from spoc_tui.core.metrics.vllm import Scrape, server_view

from .conftest import KV_GIB, MODEL

WORDS = "server queue cache token latency model request batch prefill decode gpu memory kernel throughput".split()


async def _chat(client: httpx.AsyncClient, url: str, rng: random.Random, samples: dict[str, list[float]]) -> None:
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(200, 600)))
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 96,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    last = None
    async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("choices") and ev["choices"][0].get("delta", {}).get("content"):
                now = time.perf_counter()
                if last is None:
                    samples["ttft"].append(now - t0)
                else:
                    samples["itl"].append(now - last)
                last = now
            if ev.get("usage"):
                samples["out"].append(ev["usage"]["completion_tokens"])


async def _load(url: str, users: int, requests_each: int, seed: int) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"ttft": [], "itl": [], "out": []}
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=120) as client:

        async def user() -> None:
            for _ in range(requests_each):
                await _chat(client, url, rng, samples)

        await asyncio.gather(*(user() for _ in range(users)))
    return samples


def _client_quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _scrape(url: str) -> Exposition:
    async with httpx.AsyncClient(timeout=30) as c:
        return parse_text((await c.get(url + "/metrics")).text)


def _window_buckets(before: Exposition, after: Exposition, name: str) -> dict[float, float]:
    """Cumulative bucket counts of a histogram between two scrapes, summed over label sets, by ``le``."""

    def cum(exp: Exposition) -> dict[float, float]:
        out: dict[float, float] = {}
        for labels, v in exp.get(name).items():
            le = float(dict(labels)["le"])
            out[le] = out.get(le, 0.0) + v
        return out

    a, b = cum(before), cum(after)
    return {le: b[le] - a.get(le, 0.0) for le in sorted(b)}


def _bucket_of(value: float, bounds: tuple[float, ...]) -> tuple[float, float]:
    lower = 0.0
    for b in bounds:
        if value <= b:
            return lower, b
        lower = b
    return lower, float("inf")


async def test_monitor_collectors_during_load_agree_with_the_client(vllm_server):
    url = vllm_server.url
    poller = VllmPoller([url], window_s=600)
    before = await _scrape(url)
    first = await poller.poll()
    assert first.servers and first.servers[0].engine_version == "v1"
    seen_running, seen_kv = 0.0, 0.0
    # 8 streams, not 16: on 2 shared cores the HTTP front end then queues less (it is in the
    # client's TTFT, not in the engine's histogram)
    load = asyncio.create_task(_load(url, users=8, requests_each=6, seed=1))
    while not load.done():
        tick = await poller.poll()
        v = tick.servers[0].total
        seen_running = max(seen_running, v.running or 0)
        seen_kv = max(seen_kv, v.kv_cache_usage or 0)
        await asyncio.sleep(0.25)
    samples = await load
    await asyncio.sleep(1.5)  # let vLLM publish its last stats
    final = (await poller.poll()).servers[0]
    await poller.aclose()

    assert seen_running >= 2, "running never moved"
    assert seen_kv > 0, "KV cache use never moved"
    assert final.total.running == 0
    ttft = final.total.latency["ttft"]
    assert ttft.window != "lifetime"
    assert ttft.count == len(samples["ttft"]) == 48
    assert sum(samples["out"]) == 48 * 96

    # The server's histogram against the client's own timings of the same 48 requests, at the
    # histogram's own resolution (its `le` bounds, read from the two scrapes around the load) and
    # whatever the machine's load: the engine's TTFT of a request never exceeds the client's (the
    # client's also holds the HTTP front end and the network, which on 2 busy cores can be most of
    # it), so at every bound at least as many server observations lie below it as client ones.
    # The interpolated percentiles are never above the client's own bucket; a wrong unit (x1000)
    # or window (counts) is caught by the mean and the count.
    server_cum = _window_buckets(before, await _scrape(url), "vllm:time_to_first_token_seconds_bucket")
    assert server_cum[float("inf")] == 48
    client = sorted(samples["ttft"])
    for le, n in server_cum.items():
        below = sum(1 for x in client if x <= le)
        assert n >= below, f"TTFT: {n} server observations <= {le} s, but {below} of the client's"
    bounds = tuple(le for le in server_cum if le != float("inf"))
    for q, server_value in ((0.5, ttft.p50), (0.9, ttft.p90)):
        _, hi = _bucket_of(_client_quantile(client, q), bounds)
        assert server_value is not None and server_value <= hi, f"TTFT p{q * 100:.0f}: {server_value} above {hi}"
    client_mean = sum(client) / len(client)
    assert ttft.mean is not None and client_mean / 50 < ttft.mean <= client_mean, (ttft.mean, client_mean)
    itl = final.total.latency["itl"]
    # vLLM observes one gap per output token after the first; the client sees one per content
    # chunk, and this random model emits byte tokens that decode to no text, so it sees fewer.
    assert itl.count == sum(samples["out"]) - len(samples["ttft"])
    assert 0 < len(samples["itl"]) <= itl.count
    client_itl = _client_quantile(samples["itl"], 0.5)
    _, hi = _bucket_of(client_itl, (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5))
    assert itl.p50 <= max(hi, 0.025), f"ITL p50 server {itl.p50} vs client {client_itl}"


def test_spoc_inspect_json_on_the_real_server(vllm_server):
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "inspect", vllm_server.url, "--interval", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    (s,) = json.loads(r.stdout)["servers"]
    assert s["engine_version"] == "v1" and s["model_names"] == ["tiny"] and s["simulated"] is False
    assert s["latency"]["ttft"]["window"] == "1s"
    assert s["kv_cache_usage"] is not None and s["running"] is not None


def test_capacity_matches_the_servers_own_kv_tokens(vllm_server):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "spoc_tui.cli",
            "capacity",
            "--model",
            str(MODEL),
            "--kv-cache-gib",
            str(KV_GIB),
            "--max-model-len",
            "2048",
            "--server",
            vllm_server.url,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["server_cache_config"]["kv_cache_size_tokens"] == str(d["kv_cache_tokens"]) == "524288"
    assert str(d["num_blocks"]) == d["server_cache_config"]["num_gpu_blocks"]


async def test_prometheus_mode_reads_the_same_figures(vllm_server, prometheus):
    # a little traffic so there is something to compare
    await _load(vllm_server.url, users=4, requests_each=1, seed=2)
    await asyncio.sleep(3)  # two scrapes at 1 s after the load
    prom = PromQLCollector(prometheus)
    now = then = {}
    for _ in range(30):
        try:
            t = time.time()  # now, and 10 s ago
            now = await asyncio.to_thread(prom.query, VLLM_SELECTOR, t)
            then = await asyncio.to_thread(prom.query, VLLM_SELECTOR, t - 10.0)
        except SourceError:
            pass
        if len(now) >= 2:
            break
        await asyncio.sleep(1)
    inst = f"127.0.0.1:{vllm_server.port}"
    assert inst in now, f"instances seen: {list(now)}"
    assert len(now) == 2  # the real server and the simulator
    via_prom = server_view(inst, Scrape(now[inst], 10.0, then.get(inst), 0.0 if inst in then else None))
    async with httpx.AsyncClient() as c:
        body = (await c.get(vllm_server.url + "/metrics")).text
    from spoc_tui.core.metrics.promparse import parse_text

    direct = server_view(vllm_server.url, Scrape(parse_text(body), 1.0))
    assert via_prom.engine_version == "v1" and via_prom.model_names == ("tiny",)
    assert via_prom.total.generation_tokens_total == direct.total.generation_tokens_total
    assert via_prom.total.latency["ttft"].count is not None
    assert via_prom.total.running == direct.total.running == 0
    # and a PromQL quantile computed by Prometheus itself agrees with ours over the same data
    res = await asyncio.to_thread(
        prom.promql,
        f'histogram_quantile(0.9, sum by (le) ({{__name__=~"vllm[:_]time_to_first_token_seconds_bucket", instance="{inst}"}}))',
    )
    assert res and float(res[0]["value"][1]) == pytest.approx(
        server_view(inst, Scrape(now[inst], 1.0)).total.latency["ttft"].p90, rel=1e-6
    )


def test_launcher_refuses_a_port_already_served(vllm_server, tmp_path):
    from spoc_tui.procs.server import LaunchError, ServerProcess

    server = ServerProcess(["true"], vllm_server.port, tmp_path / "x.log")
    with pytest.raises(LaunchError, match="already served"):
        server.start()


def test_the_knee_search_answers_on_the_real_server_with_a_p99_limit(vllm_server, tmp_path):
    """`spoc ramp` with no --users searches for the knee; with a p99 limit and short steps no
    step can bound its own p99, and the search still answers within the budget: an estimate with
    its interval (one end open, and said so, where the steps near it could not bound it), or a
    bound, or (when no step could decide) that it is not bounded yet and why.

    It times the server against a 30 ms ITL limit, and a busy host breaks that at one user (the
    project's CI, stop 42, beside the other worker's tuning study: ITL p99 195 ms at one user, the
    client's event loop 25 ms late; this server's ITL at one user is ~5 ms). It used to hold
    ``cpu_lock`` for it, and then waited up to two minutes for the other worker's study; now
    either answer passes, the search going on or stopping at the first level and saying so."""
    profile = tmp_path / "p.toml"
    profile.write_text(
        'name = "short"\nsystem_tokens = 100\nturns = 2\n'
        'user_tokens = {dist = "uniform", min = 100, max = 400}\n'
        "output_tokens = 64\nthink_s = 0\n"
    )
    out = tmp_path / "ramp"
    r = subprocess.run(
        [
            sys.executable, "-m", "spoc_tui.cli", "ramp", "--url", vllm_server.url, "--profile", str(profile),
            "--step-seconds", "8", "--warmup-seconds", "2", "--budget", "40s", "--sla", "itl_p99<=30ms",
            "--out", str(out), "--tokenizer", str(MODEL),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    print(r.stdout)
    d = json.loads((out / "ramp.json").read_text())
    assert d["status"] == "complete" and d["model"] == "tiny" and d["users"] == "auto:1024"
    knee = d["knee"]
    assert knee["boundary"] in ("smooth", "cliff", "bound") and "knee across steps: " in r.stdout
    est, (lo, hi) = knee["estimate"], knee["ci95"]
    if knee["boundary"] != "bound":
        assert knee["binding_limit"] == "itl_p99" and est is not None
        assert (lo is None or lo <= est) and (hi is None or est <= hi), knee
        if lo is None or hi is None:
            # an estimate whose interval has an open end: the steps near the knee could not bound
            # it in the budget (the project's CI, stop 64: the client's loop 13-48 ms late, steps
            # at 1 and 2 users inconclusive, 4 and 3 breaking: 1.44 users, 95 %: ?-3). It passes
            # only as the product says it: the open end named, with what closes it, and the
            # budget spent.
            line = next(x for x in r.stdout.splitlines() if x.startswith("knee across steps: "))
            assert "an open end" in line and "--max-step-seconds" in line, line
            assert "stopped: the budget" in r.stdout, r.stdout
    elif lo is None and hi is None:
        # the third honest answer: no step decided either way in the budget (the project's CI,
        # stop 60: the client's event loop 27-58 ms late at one user beside the other worker's
        # tuning study, every step inconclusive, ITL p99 153 ms then 12 ms at one user). It is
        # accepted only as the product says it: steps left inconclusive with their reason, and the
        # knee's line saying the budget ran out before a bound.
        assert "inconclusive" in [s["verdict"]["decision"] for s in d["steps"]], d["steps"]
        assert "knee across steps: not bounded yet" in r.stdout and "inconclusive: itl_p99" in r.stdout, r.stdout
        assert "stopped: the budget" in r.stdout, r.stdout
    else:
        assert (lo is None) != (hi is None)  # one side: more than the highest level, or fewer than the lowest
    assert sum(s["duration_s"] + 2 for s in d["steps"]) <= 40 + 4 * 8
    levels = [s["users"] for s in d["steps"]]
    assert levels[0] == 1
    # the search doubles from 1 (it may measure 1 again first, when too few requests said what 1
    # did: stop 61's run 1, beside the other worker's study, read 2 requests, then 11, at 1 user)
    assert next((x for x in levels if x != 1), 2) == 2, levels
    if "stopped: even 1 user breaks the SLA" in r.stdout:
        # a host busy enough to break 30 ms at one user (a run beside a diagnostic read ITL p99
        # 181 ms, the client's loop 60 ms late): the search stops there and says so, once the fit
        # across steps bounds the knee under 1 user (it may have tried 2 on the way: stop 61's
        # run 3 read 1, 2, 1, 1 users)
        assert knee["boundary"] == "bound" and lo is None and hi is not None and hi <= 1, r.stdout
    elif 2 in levels:  # how much more the second level served is the host's to move (a run beside
        # the other worker's servers read 232 tok/s at 1 user and 21 at 2): not asserted
        assert all(s["server"]["running_max"] >= 1 for s in d["steps"])
    reqs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert all(q["ok"] for q in reqs)
    assert d["prompt_lengths"] == "exact: the local tokenizer"


def test_prompt_lengths_are_exact_without_a_local_tokenizer(vllm_server, tmp_path):
    """No --tokenizer: the runner learns each vocabulary word's token count from the server's own
    /tokenize before the first request, so a constant-length profile gives one prompt length."""
    profile = tmp_path / "p.toml"
    profile.write_text(
        'name = "flat"\nsystem_tokens = 0\nturns = 1\nuser_tokens = 150\noutput_tokens = 8\nthink_s = 0\n'
    )
    out = tmp_path / "ramp"
    argv = [sys.executable, "-m", "spoc_tui.cli", "ramp", "--url", vllm_server.url, "--profile", str(profile),
            "--users", "2", "--step-seconds", "6", "--warmup-seconds", "1", "--sla", "ttft_p99<=60s",
            "--out", str(out)]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    d = json.loads((out / "ramp.json").read_text())
    assert d["prompt_lengths"] == "exact: the server's /tokenize"
    reqs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    lengths = {q["prompt_tokens"] for q in reqs if q["ok"]}
    assert len(reqs) >= 10 and len(lengths) == 1, lengths
    # the server's count is the planned 150 plus its chat template's tokens around one message
    (n,) = lengths
    assert 150 < n <= 150 + 40


def test_a_trace_replays_on_the_real_server(vllm_server, tmp_path):
    """A short Bailian trace (16-token blocks) at x1 and x2: every row sent once per step on its
    schedule, prompt lengths as vLLM counts them (its BOS aside), a follow-up turn held until its
    parent ended, and rows that share hash ids served from vLLM's prefix cache."""
    rows, t = [], 0.0
    for i in range(16):
        t += 0.25
        shared = list(range(1, 13))  # 192 tokens every third row shares with the first
        own = list(range(1000 + 100 * i, 1000 + 100 * i + 10))
        rows.append({"chat_id": 100 + i, "parent_chat_id": -1, "timestamp": round(t, 3), "input_length": 350,
                     "output_length": 8, "type": "text", "turn": 1,
                     "hash_ids": (shared + own if i % 3 == 0 else own + list(range(5000 + 100 * i, 5000 + 100 * i + 12)))})  # fmt: skip
    # a follow-up of the first row, due before a 120-token answer can end
    rows.insert(1, {"chat_id": 999, "parent_chat_id": 100, "timestamp": 0.3, "input_length": 500,
                    "output_length": 4, "type": "text", "turn": 2, "hash_ids": rows[0]["hash_ids"] + [7, 8, 9, 10]})  # fmt: skip
    rows[0]["output_length"] = 120
    trace = tmp_path / "bailian.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ramp"
    argv = [sys.executable, "-m", "spoc_tui.cli", "ramp", "--url", vllm_server.url, "--trace", str(trace),
            "--speed", "1,2", "--sla", "ttft_p90<=60s", "--out", str(out)]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    print(r.stdout)
    d = json.loads((out / "ramp.json").read_text())
    reqs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    for step in (1, 2):
        tr = d["steps"][step - 1]["trace"]
        assert (tr["rows"], tr["sent"], tr["skipped"]) == (17, 17, {})
        mine = [q for q in reqs if q["step"] == step]
        assert sorted(q["trace_index"] for q in mine) == list(range(17)) and all(q["ok"] for q in mine)
        # sent on schedule, never early; how late a busy host sends is the host's (stop 60's CI,
        # beside my own test runs, read a p99 of 95 ms where 20 ms is usual): reported, not held
        lag = tr["send_lag_ms"]
        assert 0 <= lag["p50"] <= lag["p99"] <= lag["max"] < 60_000, lag
        assert all(q["start"] >= q["scheduled"] - 0.001 for q in mine)
        for q in mine:  # vLLM's completions count the BOS token the prompt text does not hold
            assert abs(q["prompt_tokens"] - q["planned_input"]) <= max(4, 0.01 * q["planned_input"]), q
        child = next(q for q in mine if q["trace_index"] == 1)
        parent = next(q for q in mine if q["trace_index"] == 0)
        assert child["held_s"] > 0 and child["start"] >= parent["end"] - 0.005
        # the rows made every third (index 0, then 4, 7, ... once the follow-up sits at 1) share 12 blocks
        sharing = [q for q in mine if q["trace_index"] > 1 and (q["trace_index"] - 1) % 3 == 0]
        # vLLM's CPU backend caches whole 128-token blocks: of the 193 shared (BOS included), one
        assert sharing and all((q["cached_tokens"] or 0) >= 128 for q in sharing), [q["cached_tokens"] for q in sharing]
        assert tr["prefix_share_implied"] > 0


AGENT_SMALL = """
name = "agent-small"
description = "agent sessions sized for the tiny model's 2,048 tokens"
system_tokens = 200
turns = {dist = "uniform", min = 3, max = 5}
first_user_tokens = 100
user_tokens = 60
output_tokens = 32
ignore_eos = true
think_s = 0.3
"""


def test_agent_sessions_search_their_knee_on_the_real_server(vllm_server, tmp_path):
    """Issue 53 on the real engine: agent sessions (the agent profile's form, sized for the tiny
    model's context) searched for their knee in concurrent sessions. Each step says its sessions:
    how many started and finished, whole ones judged on every call, their time in the engine
    against between calls (the tool's 0.3 s); the knee is in users, one session each. Where the
    knee falls is the host's to move (a busy CI host breaks a limit at fewer users), so what is
    asserted is that the search answers within its budget, with its interval or a bound, and
    that the session figures are the calls' own."""
    profile = tmp_path / "agent-small.toml"
    profile.write_text(AGENT_SMALL)
    out = tmp_path / "ramp"
    r = subprocess.run(
        [
            sys.executable, "-m", "spoc_tui.cli", "ramp", "--url", vllm_server.url, "--profile", str(profile),
            "--users", "auto:64", "--step-seconds", "8", "--warmup-seconds", "2", "--budget", "45s",
            "--sla", "ttft_p90<=80ms", "--out", str(out), "--tokenizer", str(MODEL),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    print(r.stdout)
    assert "users are concurrent sessions" in r.stdout and "  sessions: " in r.stdout
    d = json.loads((out / "ramp.json").read_text())
    knee = d["knee"]
    assert knee["boundary"] in ("smooth", "cliff", "bound") and "knee across steps: " in r.stdout
    # (a step whose window saw no session's calls, as a very busy host might leave, has none)
    steps = [s for s in d["steps"] if "sessions" in s]
    assert steps, d["steps"]
    for s in steps:
        ss = s["sessions"]
        assert ss["finished"] is not None and ss["whole"] <= min(ss["started"], ss["finished"]) <= ss["active"]
        if ss["whole"]:
            assert 3 <= ss["calls"] <= 5 and ss["between_s"] > 0 and ss["engine_s"] > 0
            lo, hi = ss["all_met_ci95"]
            assert lo <= ss["all_met_share"] <= hi
    if not any(s["sessions"]["whole"] for s in steps):
        # a host too busy for a whole session in any step (stop 61's run 1, beside the other
        # worker's study: 4 calls in the one step before 1 user broke the limit) says so
        assert r.stdout.count("none whole in the step") == len(steps), r.stdout
    # every call of a session carries the one before: the server's prefix cache served them
    reqs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    later = [q for q in reqs if q["ok"] and q["turn"] > 0]
    assert later and sum(1 for q in later if (q["cached_tokens"] or 0) > 0) >= 0.9 * len(later)
    assert all(isinstance(q.get("last"), bool) for q in reqs)
