"""spoc's load generator against vLLM's own benchmark client, on one real vLLM CPU server (run:
make bench, or python benchmarks/vs_vllm_bench.py [CONCURRENCIES] [SECONDS]).

The real-engine tier's vLLM 0.32 CPU build and tiny Llama (scripts/realengine_setup.sh) serve on
127.0.0.1. At each concurrency (default 8 and 32), back to back: `vllm bench serve` (openai-chat
backend, random dataset, 200-token prompts, 128-token answers, --max-concurrency C) and `spoc
ramp` with a flat profile (one turn, no think time, 200-token prompts, 128-token answers, C
users), without and with --tokenizer. Printed: TTFT, ITL and TPOT p50/p90/p99 and output tokens/s
from each, and spoc's figure over vLLM's (target: every percentile within max(5 %, 1 ms), output
tokens/s within 3 %). Both clients are run on the same 2 shared cores as the server, so the
server's own speed moves between runs too; the table says how far apart two runs of vLLM's own
client are (its repeat) so the differences can be read against that.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spoc_tui.core.loadmath import parse_sla  # noqa: E402
from spoc_tui.load.profiles import load_profile  # noqa: E402
from spoc_tui.load.ramp import RampConfig, run_ramp  # noqa: E402
from spoc_tui.procs.ports import free_ports  # noqa: E402
from spoc_tui.procs.server import ServerProcess  # noqa: E402

DIR = Path(os.environ.get("SPOC_REALENGINE_DIR", Path.home() / ".cache" / "spoc-tui"))
VENV = DIR / "vllm-0.32.0"
MODEL = DIR / "tiny-llama"
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
CONC = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [8, 32]
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 40.0
IN_TOKENS, OUT_TOKENS = 200, 128
PROFILE = (
    f'name = "flat"\nsystem_tokens = 0\nturns = 1\nuser_tokens = {IN_TOKENS}\n'
    f"output_tokens = {OUT_TOKENS}\nthink_s = 0\nignore_eos = true\n"
)
KEYS = [(m, p) for m in ("ttft", "itl", "tpot") for p in ("p50", "p90", "p99")]


def vllm_bench(url: str, conc: int, prompts: int, out: Path) -> dict[str, float]:
    """vLLM's own client; its result JSON in ms, reduced to our keys (seconds)."""
    out.mkdir(parents=True, exist_ok=True)
    argv = [
        str(VENV / "bin" / "vllm"), "bench", "serve", "--backend", "openai-chat", "--base-url", url,
        "--endpoint", "/v1/chat/completions", "--model", "tiny", "--tokenizer", str(MODEL),
        "--dataset-name", "random", "--random-input-len", str(IN_TOKENS), "--random-output-len", str(OUT_TOKENS),
        "--max-concurrency", str(conc), "--num-prompts", str(prompts), "--percentile-metrics", "ttft,tpot,itl",
        "--metric-percentiles", "50,90,99", "--save-result", "--result-dir", str(out), "--result-filename",
        "bench.json", "--seed", "1",
    ]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **ENV}, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"vllm bench serve failed:\n{r.stderr[-3000:]}")
    d = json.loads((out / "bench.json").read_text())
    res = {f"{m}_{p}": float(d[f"{p}_{m}_ms"]) / 1000 for m, p in KEYS}
    res["out_tok_s"] = float(d["output_throughput"])
    res["n"] = float(d["completed"])
    res["in_tok"] = float(d["total_input_tokens"]) / max(1.0, float(d["completed"]))
    res["out_tok"] = float(d["total_output_tokens"]) / max(1.0, float(d["completed"]))
    return res


async def spoc(url: str, conc: int, out: Path, tokenizer: bool, spawn_rate: float | None = None) -> dict[str, float]:
    prof_path = out / "flat.toml"
    out.mkdir(parents=True, exist_ok=True)
    prof_path.write_text(PROFILE)
    cfg = RampConfig(
        url=url,
        profile=load_profile(str(prof_path)),
        users=[conc],
        limits=parse_sla("ttft_p99<=60s"),
        out_dir=out / "ramp",
        step_s=SECONDS,
        warmup_s=5.0,
        max_step_s=SECONDS,
        tokenizer=str(MODEL) if tokenizer else None,
        spawn_rate=spawn_rate,
    )
    result = await run_ramp(cfg)
    s = result.steps[-1]
    res = {f"{m}_{p}": float(s.latency[m][p]) for m, p in KEYS if s.latency[m][p] is not None}
    res["out_tok_s"] = s.output_tokens_per_s
    res["n"] = float(s.requests)
    rows = [json.loads(x) for x in (out / "ramp" / "requests.jsonl").read_text().splitlines()]
    mine = [r for r in rows if r["ok"] and r["step"] == s.step]
    res["in_tok"] = sum(r["prompt_tokens"] or 0 for r in mine) / max(1, len(mine))
    res["out_tok"] = sum(r["output_tokens"] or 0 for r in mine) / max(1, len(mine))
    res["client_saturated"] = float(bool((s.client or {}).get("saturated")))
    return res


def fmt(key: str, v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v:,.0f}" if key in ("out_tok_s", "n", "in_tok", "out_tok") else f"{v * 1000:.2f}"


def within(key: str, ours: float | None, theirs: float | None) -> bool:
    if ours is None or theirs is None:
        return False
    if key == "out_tok_s":
        return abs(ours / theirs - 1) <= 0.03
    return abs(ours - theirs) <= max(0.05 * theirs, 0.001)


def main() -> None:
    if not (VENV / ".ready").exists() or not (MODEL / ".ready").exists():
        raise SystemExit("the real-engine tier is not set up: run bash scripts/realengine_setup.sh")
    (port,) = free_ports(1)
    work = Path(tempfile.mkdtemp(prefix="spoc-vs-vllm-"))
    argv = [str(VENV / "bin" / "vllm"), "serve", str(MODEL), "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "2048", "--dtype", "float32", "--served-model-name", "tiny"]  # fmt: skip
    server = ServerProcess(argv, port, work / "vllm.log", ENV)
    took = server.start(timeout=300)
    url = f"http://127.0.0.1:{port}"
    print(f"vLLM 0.32 CPU (tiny Llama) ready in {took:.0f} s on {url}; {SECONDS:g} s steps; results in {work}")
    try:
        for conc in CONC:
            # as many prompts as spoc's step sees, about (a first run of vllm bench warms the server up)
            warm = vllm_bench(url, conc, conc * 4, work / f"warm-{conc}")
            prompts = max(conc * 8, int(warm["out_tok_s"] * (SECONDS - 5) / OUT_TOKENS))
            runs: dict[str, dict[str, float]] = {}
            runs["vllm bench serve"] = vllm_bench(url, conc, prompts, work / f"bench-{conc}")
            runs["spoc ramp"] = asyncio.run(spoc(url, conc, work / f"spoc-{conc}", False))
            runs["spoc ramp --tokenizer"] = asyncio.run(spoc(url, conc, work / f"spoc-tok-{conc}", True))
            # vllm bench starts all its streams at once, and with fixed lengths they stay in step:
            # the same arrival pattern from spoc (all users at once) separates workload from client
            runs["spoc --spawn-rate 1000"] = asyncio.run(
                spoc(url, conc, work / f"spoc-burst-{conc}", False, spawn_rate=1000.0)
            )
            runs["vllm bench serve (repeat)"] = vllm_bench(url, conc, prompts, work / f"bench2-{conc}")
            report(conc, runs)
    finally:
        server.stop()


def report(conc: int, runs: dict[str, dict[str, Any]]) -> None:
    ref = runs["vllm bench serve"]
    names = list(runs)
    print(
        f"\n{conc} concurrent streams, {IN_TOKENS}-token prompts, {OUT_TOKENS}-token answers (ms; ratio to vllm bench)"
    )
    print(f"{'':<12}" + "".join(f"{n:>28}" for n in names))
    ok = dict.fromkeys(names[1:], 0)
    for key in [f"{m}_{p}" for m, p in KEYS] + ["out_tok_s", "n", "in_tok", "out_tok"]:
        cells = []
        for n in names:
            v = runs[n].get(key)
            cell = fmt(key, v)
            if n != names[0] and key not in ("n", "in_tok", "out_tok") and v is not None and ref.get(key):
                cell += f" ({v / ref[key]:.2f}x)"
                ok[n] += within(key, v, ref.get(key))
            cells.append(cell)
        print(f"{key:<12}" + "".join(f"{c:>28}" for c in cells))
    targets = len(KEYS) + 1
    print("(n: requests measured; in_tok/out_tok: mean prompt/answer tokens per request, as the server counted)")
    print("within target (every percentile max(5 %, 1 ms), out tok/s 3 %): " + "; ".join(
        f"{n}: {k}/{targets}" for n, k in ok.items()
    ))  # fmt: skip
    if any(runs[n].get("client_saturated") for n in names):
        print("(a spoc step was flagged client-saturated: its timings are not trustworthy)")


if __name__ == "__main__":
    main()
