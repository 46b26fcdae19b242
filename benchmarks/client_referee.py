"""Both clients against the server's own truth (run: make bench, or python
benchmarks/client_referee.py [CONCURRENCY] [SECONDS]).

Where spoc and `vllm bench serve` disagree (benchmarks/vs_vllm_bench.py: TTFT at 32 streams),
which one is right? The simulator logs every request's server-side truth: when it arrived and when
each token left the engine, on this machine's monotonic clock, which `vllm bench serve` also stamps
its requests with. So `spoc sim` runs pinned to one core, and `vllm bench serve` and `spoc ramp`
load it back to back from the other (the same shape as vs_vllm_bench: 200-token prompts, 128-token
answers, ignore_eos, C streams); for each client, its TTFT and ITL p50/p90/p99 are set against the
truth's over the requests it sent, twice: against the engine's token times (the client's error
plus the HTTP front end's time, which the engine's clock does not see) and against when each
token's event was written to the socket ("wire": the client's own error, its sending, reading
and event loop, plus the kernel's loopback).
Needs the real-engine tier's venv for `vllm bench serve` (scripts/realengine_setup.sh).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import numpy as np  # noqa: E402
from vs_vllm_bench import ENV, MODEL, OUT_TOKENS, VENV, bench_argv, spoc  # noqa: E402

from spoc_tui.procs.ports import free_ports  # noqa: E402
from spoc_tui.sim.process import start_sim  # noqa: E402

CONC = int(sys.argv[1]) if len(sys.argv) > 1 else 32
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 40.0
PCTS = (50, 90, 99)


def truth_in(
    truth: list[dict[str, Any]], ids: set[str] | None, w0: float, w1: float, key: str = "tokens"
) -> tuple[Any, Any]:
    """The truth's TTFTs and token gaps (ms) of the requests a client sent: by response id where it
    has them (spoc), else by arrival inside the client's window (vllm bench keeps no ids). ``key``:
    "tokens", when each token left the engine, or "sent", when its event went to the socket."""
    sel = [t for t in truth if t.get(key) and (t["id"] in ids if ids is not None else w0 <= t["arrival"] <= w1)]
    ttft = np.array([t[key][0] - t["arrival"] for t in sel]) * 1000
    itl = np.concatenate([np.diff(t[key]) for t in sel]) * 1000
    return ttft, itl


def row(name: str, ttft: Any, itl: Any, truth: tuple[Any, Any], wire: tuple[Any, Any]) -> None:
    for metric, ours, true, sent in (("TTFT", ttft, truth[0], wire[0]), ("ITL", itl, truth[1], wire[1])):
        c, t, w = np.percentile(ours, PCTS), np.percentile(true, PCTS), np.percentile(sent, PCTS)
        cells = "  ".join(
            f"p{p} {a:7.2f} vs {b:7.2f} ({a - b:+6.2f}) wire {d:7.2f} ({a - d:+6.2f})"
            for p, a, b, d in zip(PCTS, c, t, w, strict=True)
        )
        print(f"{name:<18}{metric:<6}{cells}")


def main() -> None:
    if not (VENV / ".ready").exists() or not (MODEL / ".ready").exists():
        raise SystemExit("the real-engine tier is not set up: run bash scripts/realengine_setup.sh")
    work = Path(tempfile.mkdtemp(prefix="spoc-referee-"))
    truth_path = work / "truth.jsonl"
    port, dport = free_ports(2)
    cores = sorted(os.sched_getaffinity(0))
    argv = ["--served-model-name", "tiny", "--dcgm-port", str(dport), "--truth-log", str(truth_path)]
    pin = len(cores) >= 2
    if pin:  # the simulator on one core (it inherits this affinity), the clients on the rest
        os.sched_setaffinity(0, {cores[0]})
    proc = start_sim(argv, port)
    try:
        if pin:
            os.sched_setaffinity(0, set(cores[1:]))
        url = f"http://127.0.0.1:{port}"
        clock = time.time() - time.perf_counter()  # spoc stamps wall time, the truth perf_counter's clock
        warm = work / "warm"
        subprocess.run(bench_argv(url, CONC, CONC * 4, warm), capture_output=True, env={**os.environ, **ENV})
        rate = json.loads((warm / "bench.json").read_text())["output_throughput"]
        prompts = max(CONC * 8, int(rate * (SECONDS - 5) / OUT_TOKENS))
        out = work / "bench"
        r = subprocess.run(
            bench_argv(url, CONC, prompts, out), capture_output=True, text=True, env={**os.environ, **ENV}
        )
        if r.returncode != 0:
            raise SystemExit(f"vllm bench serve failed:\n{r.stderr[-3000:]}")
        asyncio.run(spoc(url, CONC, work / "spoc", tokenizer=False, spawn_rate=1000.0))
        truth = [json.loads(x) for x in truth_path.read_text().splitlines()]
        b = json.loads((out / "bench.json").read_text())
        w0 = min(b["start_times"])
        w1 = max(s + lat for s, lat in zip(b["start_times"], b["latencies"], strict=True))
        rows = [json.loads(x) for x in (work / "spoc" / "ramp" / "requests.jsonl").read_text().splitlines()]
        mine = [x for x in rows if x["ok"] and x["step"] == 1 and x["ttft"] is not None]
        print(
            f"spoc sim (pinned to core {cores[0]}) at {CONC} streams, 200-token prompts, {OUT_TOKENS}-token answers; "
            "each client's figure vs the server's truth for its own requests (ms; client - truth): the engine's "
            f"token times, and (wire) when each token's event was written to the socket. Results in {work}"
        )
        row(
            "vllm bench serve",
            np.array(b["ttfts"]) * 1000,
            np.concatenate([np.array(x) for x in b["itls"] if x]) * 1000,
            truth_in(truth, None, w0, w1),
            truth_in(truth, None, w0, w1, "sent"),
        )
        row(
            "spoc ramp",
            np.array([x["ttft"] for x in mine]) * 1000,
            np.concatenate([np.array(x["itl"]) for x in mine if x["itl"]]) * 1000,
            truth_in(truth, {x["request_id"] for x in mine}, clock, clock),
            truth_in(truth, {x["request_id"] for x in mine}, clock, clock, "sent"),
        )
        print(f"(requests: vllm bench {len(b['ttfts'])}, spoc {len(mine)})")
    finally:
        proc.stop()


if __name__ == "__main__":
    main()
