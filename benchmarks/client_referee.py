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
import truthlog  # noqa: E402
from realengine import NOT_SET_UP, VLLM_ENV, ready, vllm_server  # noqa: E402
from vs_vllm_bench import OUT_TOKENS, bench_argv, spoc  # noqa: E402
from wiretap import Response, Tap  # noqa: E402

from spoc_tui.procs.ports import free_ports  # noqa: E402
from spoc_tui.sim.process import start_sim  # noqa: E402

SMOKE = "--smoke" in sys.argv
"""make test runs it so (that the script runs, not its figures): 4 streams for 8 s on the simulator,
without the warm-up run."""
_ARGS = ["4", "8", "sim"] if SMOKE else [a for a in sys.argv[1:] if not a.startswith("--")]
CONC = int(_ARGS[0]) if _ARGS else 32
SECONDS = float(_ARGS[1]) if len(_ARGS) > 1 else 40.0
ENGINE = _ARGS[2] if len(_ARGS) > 2 else "sim"
PCTS = (50, 90, 99)


def truth_in(
    truth: list[dict[str, Any]], ids: set[str] | None, w0: float, w1: float, key: str = "tokens"
) -> tuple[Any, Any]:
    """The truth's TTFTs and token gaps (ms) of the requests a client sent (:func:`truthlog.sent_by`).
    ``key``: "tokens", when each token left the engine, or "sent", when its event went to the socket."""
    sel = truthlog.sent_by(truth, ids, w0, w1)
    return truthlog.ttft_ms(sel, key), truthlog.gaps_ms(sel, key)


def row(name: str, ttft: Any, itl: Any, label: str, truth: tuple[Any, Any]) -> None:
    for metric, ours, true in (("TTFT", ttft, truth[0]), ("ITL", itl, truth[1])):
        c, t = np.percentile(ours, PCTS), np.percentile(true, PCTS)
        cells = "  ".join(f"p{p} {a:7.2f} vs {b:7.2f} ({a - b:+6.2f})" for p, a, b in zip(PCTS, c, t, strict=True))
        print(f"{name:<18}{label:<8}{metric:<6}{cells}")


def wire_in(resps: list[Response], ids: set[str] | None, w0: float, w1: float) -> tuple[Any, Any]:
    """The wire's TTFTs and event gaps (ms) of a client's requests: by response id (spoc), else by
    when they were sent (vllm bench). Kernel times are wall-clock: ``w0``/``w1`` are too."""
    sel = [r for r in resps if (r.id in ids if ids is not None else w0 <= r.sent <= w1)]
    ttft = np.array([r.ttft for r in sel]) * 1000
    itl = np.concatenate([np.diff(r.events) for r in sel]) * 1000
    return ttft, itl


def start_server(work: Path, engine: str, port: int, core: int | None) -> Any:
    """The simulator (with its truth log) or the real-engine tier's vLLM, on ``core`` if given."""
    if engine == "sim":
        argv = ["--served-model-name", "tiny", "--dcgm-port", str(free_ports(1)[0])]
        argv += ["--truth-log", str(work / "truth.jsonl")]
        return start_sim(argv, port, core=core)
    server = vllm_server(work / "vllm.log", port, core=core)
    server.start(timeout=300)
    return server


def main() -> None:
    if not ready():
        raise SystemExit(NOT_SET_UP)
    if ENGINE not in ("sim", "vllm"):
        raise SystemExit(f"engine must be sim or vllm, not {ENGINE!r}")
    if os.geteuid() != 0:
        raise SystemExit("the wire tap (an AF_PACKET socket on lo) needs root")
    work = Path(tempfile.mkdtemp(prefix="spoc-referee-"))
    (port,) = free_ports(1)
    cores = sorted(os.sched_getaffinity(0))
    pin = len(cores) >= 2
    proc = start_server(work, ENGINE, port, cores[0] if pin else None)
    try:
        if pin:  # the clients (and the tap, which wakes 20 times a second) on the other cores
            os.sched_setaffinity(0, set(cores[1:]))
        url = f"http://127.0.0.1:{port}"
        prompts = CONC * 8
        if not SMOKE:  # a warm-up run, whose rate sizes the measured one (the smoke takes the floor)
            warm = work / "warm"
            subprocess.run(bench_argv(url, CONC, CONC * 4, warm), capture_output=True, env={**os.environ, **VLLM_ENV})
            rate = json.loads((warm / "bench.json").read_text())["output_throughput"]
            prompts = max(prompts, int(rate * (SECONDS - 5) / OUT_TOKENS))
        truth_path = work / "truth.jsonl"
        clock = time.time() - time.perf_counter()  # spoc stamps wall time, the truth perf_counter's clock
        out = work / "bench"
        with Tap(port, work / "wire.bin") as tap:
            if not tap.ok:
                raise SystemExit("the wire tap did not start")
            r = subprocess.run(
                bench_argv(url, CONC, prompts, out), capture_output=True, text=True, env={**os.environ, **VLLM_ENV}
            )
            if r.returncode != 0:
                raise SystemExit(f"vllm bench serve failed:\n{r.stderr[-3000:]}")
            t_spoc = time.time()
            asyncio.run(spoc(url, CONC, work / "spoc", tokenizer=False, spawn_rate=1000.0))
        wire = tap.responses()
        b = json.loads((out / "bench.json").read_text())
        w0 = min(b["start_times"])
        w1 = max(s + lat for s, lat in zip(b["start_times"], b["latencies"], strict=True))
        rows = [json.loads(x) for x in (work / "spoc" / "ramp" / "requests.jsonl").read_text().splitlines()]
        mine = [x for x in rows if x["ok"] and x["step"] == 1 and x["ttft"] is not None]
        ids = {x["request_id"] for x in mine}
        where = f"pinned to core {cores[0]}" if pin else "unpinned"
        server = "spoc sim" if ENGINE == "sim" else "vLLM 0.32 CPU (tiny Llama)"
        print(
            f"{server} ({where}) at {CONC} streams, 200-token prompts, {OUT_TOKENS}-token answers; each client's "
            "figure vs the truth for its own requests (ms; client - truth). kernel: when each event's packet "
            "left the server and the request's last packet left the client, as the kernel stamped them on lo"
            + (
                "; engine: the simulator's token times; sent: when the simulator wrote each event to the socket"
                if ENGINE == "sim"
                else ""
            )
            + f". Results in {work}"
        )
        bench_ttft = np.array(b["ttfts"]) * 1000
        bench_itl = np.concatenate([np.array(x) for x in b["itls"] if x]) * 1000
        spoc_ttft = np.array([x["ttft"] for x in mine]) * 1000
        spoc_itl = np.concatenate([np.array(x["itl"]) for x in mine if x["itl"]]) * 1000
        # vllm bench's start_times are perf_counter's; the kernel stamps wall time
        bench_wire = wire_in(wire, None, w0 + clock, w1 + clock)
        spoc_wire = wire_in(wire, ids, 0, 0)
        row("vllm bench serve", bench_ttft, bench_itl, "kernel", bench_wire)
        row("spoc ramp", spoc_ttft, spoc_itl, "kernel", spoc_wire)
        if ENGINE == "sim":
            truth = truthlog.read(truth_path)
            row("vllm bench serve", bench_ttft, bench_itl, "engine", truth_in(truth, None, w0, w1))
            row("spoc ramp", spoc_ttft, spoc_itl, "engine", truth_in(truth, ids, 0, 0))
            row("vllm bench serve", bench_ttft, bench_itl, "sent", truth_in(truth, None, w0, w1, "sent"))
            row("spoc ramp", spoc_ttft, spoc_itl, "sent", truth_in(truth, ids, 0, 0, "sent"))
            # the tap against the simulator's own record of its writes: how good a referee it is
            sent = {t["id"]: t["sent"] for t in truth if t.get("sent")}
            # (the wire has one event more: the role's, before the first token)
            d = [
                (np.diff(r.events[-len(sent[r.id]) :]) - np.diff(sent[r.id])) * 1000
                for r in wire
                if r.id in sent and len(r.events) - len(sent[r.id]) in (0, 1)
            ]
            if d:
                dd = np.concatenate(d)
                print(
                    f"(the tap vs the simulator's own write times, per gap, {len(d)} requests: "
                    f"p50 {np.percentile(dd, 50):+.3f} ms, |p99| {np.percentile(np.abs(dd), 99):.3f} ms)"
                )
        print(
            f"(requests: vllm bench {len(b['ttfts'])} (on the wire {len(bench_wire[0])}), "
            f"spoc {len(mine)} (on the wire {len(spoc_wire[0])}); spoc's step began {time.time() - t_spoc:.0f} s ago)"
        )
    finally:
        proc.stop()


if __name__ == "__main__":
    from spoc_tui.procs.supervise import supervise

    supervise()  # whatever stops this script stops what it started
    main()
