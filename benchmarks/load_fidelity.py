"""How exactly the load generator measures TTFT and ITL (run: make bench, or directly).

The simulator logs the server-side truth of every request (when it arrived, and when each token's
event was written to the socket, on the same monotonic clock of this machine), so the errors
are the client's own: its sending, reading and event loop. The ramp's Locust runner (one
process = one load-generator core) and, in the same run, a minimal asyncio + httpx client
load it at 16, 128 and 512 concurrent users; every client measurement is matched to the
truth by response id. Printed: error p50/p99 of TTFT and of ITL (client minus server), and
the largest user count per load-generator core whose p99 errors stay under 2 ms.

Usage: python benchmarks/load_fidelity.py [USERS,...] [SECONDS] (``--smoke``: 16 users, 5 s)
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from spoc_tui.core.ramp.knee import FixedUsers  # noqa: E402
from spoc_tui.core.ramp.sla import parse_sla  # noqa: E402
from spoc_tui.load.ramp import RampConfig, run_ramp  # noqa: E402
from spoc_tui.procs.ports import free_ports  # noqa: E402
from spoc_tui.sim.process import start_sim  # noqa: E402
from spoc_tui.workload import WORDS, load_workload  # noqa: E402

SMOKE = "--smoke" in sys.argv
_ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
USERS = [16] if SMOKE else [int(x) for x in _ARGS[0].split(",")] if _ARGS else [16, 128, 512]
SECONDS = 5.0 if SMOKE else float(_ARGS[1]) if len(_ARGS) > 1 else 20.0
PROFILE = 'name = "fidelity"\nsystem_tokens = 0\nturns = 1\nuser_tokens = 200\noutput_tokens = 64\nthink_s = 0\n'


def truth(path: Path) -> dict[str, dict[str, object]]:
    out = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        out[d["id"]] = d
    return out


def errors(
    samples: list[tuple[str, float, list[float]]], t: dict[str, dict[str, object]]
) -> tuple[list[float], list[float], int]:
    """(TTFT errors, ITL errors, matched requests) in seconds, client minus server."""
    e_ttft: list[float] = []
    e_itl: list[float] = []
    n = 0
    for rid, ttft, gaps in samples:
        tr = t.get(rid)
        if tr is None:
            continue
        tokens: list[float] = tr.get("sent") or tr.get("tokens")  # type: ignore[assignment]
        if not tokens:
            continue
        n += 1
        e_ttft.append(ttft - (tokens[0] - float(tr["arrival"])))  # type: ignore[arg-type]
        server_gaps = np.diff(tokens)
        if len(gaps) == len(server_gaps) + 1:
            # the runner counts the chat stream's role event (as vllm bench serve does), which
            # leaves with the first token: its first gap is that pair's, not one of the tokens'
            gaps = gaps[1:]
        for c, s in zip(gaps, server_gaps):
            e_itl.append(c - float(s))
    return e_ttft, e_itl, n


async def locust_run(url: str, users: int, out: Path, profile_path: Path) -> list[tuple[str, float, list[float]]]:
    cfg = RampConfig(
        url=url,
        workload=load_workload(str(profile_path)),
        plan=FixedUsers([users]),
        limits=parse_sla("ttft_p99<=1000s"),
        out_dir=out,
        step_s=SECONDS,
        warmup_s=min(5.0, SECONDS / 4),
    )
    await run_ramp(cfg)
    rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    return [
        (r["request_id"], r["ttft"], r["itl"]) for r in rows if r["ok"] and r["request_id"] and r["ttft"] is not None
    ]


async def httpx_run(url: str, users: int) -> list[tuple[str, float, list[float]]]:
    results: list[tuple[str, float, list[float]]] = []
    stop = time.monotonic() + SECONDS
    limits = httpx.Limits(max_connections=users, max_keepalive_connections=users)
    async with httpx.AsyncClient(timeout=600, limits=limits) as c:

        async def user(i: int) -> None:
            rng = random.Random(i)
            while time.monotonic() < stop:
                body = {
                    "messages": [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(200))}],
                    "max_tokens": 64,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                t0 = time.perf_counter()
                first = last = None
                gaps: list[float] = []
                rid = None
                async with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        now = time.perf_counter()
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        ev = json.loads(line[6:])
                        rid = rid or ev.get("id")
                        for ch in ev.get("choices") or []:
                            if (ch.get("delta") or {}).get("content"):
                                if first is None:
                                    first = now
                                else:
                                    gaps.append(now - last)  # type: ignore[operator]
                                last = now
                if rid and first is not None:
                    results.append((rid, first - t0, gaps))

        await asyncio.gather(*(user(i) for i in range(users)))
    return results


def pct(xs: list[float]) -> str:
    if not xs:
        return "       n/a        n/a"
    a = np.abs(np.asarray(xs)) * 1000
    return f"{np.percentile(a, 50):8.2f}ms {np.percentile(a, 99):8.2f}ms"


async def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="spoc-fidelity-"))
    truth_path = work / "truth.jsonl"
    profile_path = work / "fidelity.toml"
    profile_path.write_text(PROFILE)
    port, dport = free_ports(2)
    proc = start_sim(["--max-num-seqs", "512", "--dcgm-port", str(dport), "--truth-log", str(truth_path)], port)
    url = f"http://127.0.0.1:{port}"
    rows = []
    try:
        for users in USERS:
            loc = await locust_run(url, users, work / f"locust-{users}", profile_path)
            hx = await httpx_run(url, users)
            t = truth(truth_path)
            for name, samples in (("locust runner", loc), ("asyncio+httpx", hx)):
                et, ei, n = errors(samples, t)
                rows.append((users, name, n, et, ei))
    finally:
        proc.stop()
    print(
        f"{'users':>6}  {'client':<14}{'matched':>8}   {'TTFT err p50':>12} {'p99':>9}   {'ITL err p50':>11} {'p99':>9}"
    )
    for users, name, n, et, ei in rows:
        print(f"{users:>6}  {name:<14}{n:>8}   {pct(et)}   {pct(ei)}")
    good = [
        u
        for u, name, _, et, ei in rows
        if name == "locust runner"
        and et
        and ei
        and np.percentile(np.abs(et), 99) < 0.002
        and np.percentile(np.abs(ei), 99) < 0.002
    ]
    best = max(good) if good else None
    print(
        f"largest user count per load-generator core with p99 error < 2 ms (Locust runner, 1 core): {best if best else 'none of ' + str(USERS)}"
    )
    print(
        "(2-core machine shared by the simulator and the client; errors are |client - server| per request and per token gap)"
    )


if __name__ == "__main__":
    from spoc_tui.procs.supervise import supervise

    supervise()  # whatever stops this script stops what it started
    asyncio.run(main())
