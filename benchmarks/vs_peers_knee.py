"""The knee beside AIPerf's and GuideLLM's, on one simulated server (run: python
benchmarks/vs_peers_knee.py [--peers DIR] [--only=spoc,aiperf,guidellm]; --smoke: ours only,
two short steps, and the peers' command lines checked, not run; --prefix-caching: the server's
prefix cache on; --pin: the simulator on one core, the clients on the others).

Issue 31's comparison: `spoc sim` (Llama-3.1-8B on an H100, its defaults) on 127.0.0.1, a flat
workload of 1000-token prompts and 200-token answers (``ignore_eos``, one turn, no think time, no
shared prefix), and one SLA, TTFT p99 <= 400 ms. Each tool searches for the most concurrent
streams within it, one after the other on the same server:

- AIPerf 0.13: ``--search-recipe max-concurrency-under-sla`` (its isotonic search, the default
  style), 30 s a probe after its own warm-up, ``--ttft-sla-ms 400`` (the recipe wants one of its own flags; it judges p95) and
  ``--search-sla time_to_first_token:p99:le:400`` (the p99 filter, the binding one).
- GuideLLM 0.8.1: ``--profile kind=goodput,target_attainment=0.99`` (doubling from 4 streams,
  then bisection, until the bracket is within 10 %) with ``slo.ttft_ms = 400``: 99 % of requests
  within 400 ms is TTFT p99 <= 400 ms. Its probes run 30 s each (``max_duration``).
- spoc: ``spoc ramp --arrivals lockstep`` (every stream started at once, as the peers start
  theirs) with no ``--users`` (the knee search) and its default steps and budget.

The peers count prompt tokens with a Hugging Face tokenizer; no model hub is reachable here, so
they are given the real-engine tier's tiny Llama tokenizer, whose tokens are shorter than the
simulator's (words and punctuation): ``PEER_ISL`` (3330) of AIPerf's reach the server as about
1000 tokens, and ``GUIDELLM_ISL`` (4040) of GuideLLM's synthetic text; each tool's own record of
what the server counted (its ``usage.prompt_tokens``) is printed beside its answer. Printed per tool: the knee (streams or users) and its interval where
the tool gives one, the probes it ran, and the wall minutes it took.

``--referee`` (``--referee-only``: it alone) then sets our client and AIPerf's against the
server's own record at one load, 15 streams in lockstep for 60 s each, on a simulator with its
truth log (:func:`referee`): whether the figures differ in the clients or at the server.

The peers run from their own virtual environments under ``--peers`` (default
``~/.cache/spoc-tui/peers``), made there from the package index on first use, each pinned.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import truthlog  # noqa: E402

from spoc_tui.core.results import read_ramp  # noqa: E402
from spoc_tui.procs.ports import free_ports  # noqa: E402
from spoc_tui.sim.process import start_sim  # noqa: E402

SMOKE = "--smoke" in sys.argv
REFEREE_ONLY = "--referee-only" in sys.argv
REFEREE = "--referee" in sys.argv or REFEREE_ONLY or SMOKE
"""Also set each client against the server's own record at one load (:func:`referee`)."""
PIN = "--pin" in sys.argv
"""The simulator on the first core, every client on the others (as benchmarks/vs_vllm_bench.py
pins its server): a client's own CPU then cannot slow the server it measures, so the three
searches meet the same server."""
CACHING = "--prefix-caching" in sys.argv
"""Off by default: AIPerf's search sends the same prompts at every probe (its common random
numbers), so with the server's prefix cache on, from its second probe the cache serves nearly
all of every prompt and its knee measures decode alone (measured: 112 streams against GuideLLM's
16 on the same server). ``--prefix-caching`` runs that case."""
ONLY = next(
    (a.split("=", 1)[1].split(",") for a in sys.argv if a.startswith("--only=")), ["spoc", "aiperf", "guidellm"]
)
PEERS = Path(
    next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--peers=")), "")
    or os.environ.get("SPOC_PEERS", "")
    or Path.home() / ".cache" / "spoc-tui" / "peers"
)
PINS = {"aiperf": "aiperf==0.13.0", "guidellm": "guidellm==0.8.1"}
TOKENIZER = Path.home() / ".cache" / "spoc-tui" / "tiny-llama"
"""The real-engine tier's tiny Llama (scripts/realengine_setup.sh): a tokenizer the peers can load
without a model hub."""
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
IN_TOKENS, OUT_TOKENS = 1000, 200
PEER_ISL = 3330
"""Tiny-Llama tokens per prompt that reach the simulator as about IN_TOKENS (measured: 986 mean,
AIPerf's prompts reached it as 1005)."""
GUIDELLM_ISL = 4040
"""GuideLLM's synthetic text of PEER_ISL tokens reached the simulator as 824 tokens (two runs: 824
and 825), not 1000: its text tokenizes differently there. 4040 (3330 x 1000 / 824) makes it 1000."""
TTFT_P99_MS = 400
PROBE_S = 30
"""Each peer probe measures 30 s. GuideLLM's run until a constraint stops them (its goodput search
says when a probe was too short to decide). AIPerf's search otherwise sends max(10, 2 x the
first probe's concurrency) requests at *every* probe: 10 requests at 64 streams never hold 64 in
flight, and its search passed every level up to 64 (TTFT p99 33 ms there) before it was stopped."""
SPOC = [sys.executable, "-m", "spoc_tui.cli"]
FIXTURES = ROOT / "tests" / "fixtures" / "peers"
FLAT = f'name = "flat"\nuser_tokens = {IN_TOKENS}\noutput_tokens = {OUT_TOKENS}\nignore_eos = true\n'


def spoc_run(url: str, work: Path) -> dict[str, Any]:
    (work / "flat.toml").write_text(FLAT)
    out = work / "spoc"
    steps = ["--users", "1,2", "--step-seconds", "3", "--warmup-seconds", "1"] if SMOKE else []
    argv = [
        *SPOC, "ramp", "--url", url, "--profile", str(work / "flat.toml"), "--sla", f"ttft_p99<={TTFT_P99_MS}ms",
        "--arrivals", "lockstep", "--out", str(out), *steps,
    ]  # fmt: skip
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"spoc ramp failed ({r.returncode}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    doc = read_ramp(out)
    inferred = doc.knee.inferred
    reqs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    counted = [q["prompt_tokens"] for q in reqs if isinstance(q.get("prompt_tokens"), int | float)]
    cached = [q.get("cached_tokens") or 0 for q in reqs if isinstance(q.get("prompt_tokens"), int | float)]
    return {
        "tool": "spoc ramp --arrivals lockstep",
        "knee": inferred.estimate if inferred else None,
        "interval": list(inferred.ci95) if inferred else None,
        "shown": inferred.text if inferred else "none",
        "detail": doc.stop_reason,
        "probes": len(doc.steps),
        "levels": [st.users for st in doc.steps],
        "wall_min": wall / 60,
        "server_prompt_tokens": sum(counted) / len(counted) if counted else None,
        "cached_share": sum(cached) / sum(counted) if counted else None,
    }


def ensure_venv(tool: str) -> Path:
    venv = PEERS / tool
    exe = venv / "bin" / tool
    if exe.exists():
        return exe
    print(f"installing {PINS[tool]} into {venv} (once)...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", PINS[tool]], check=True)
    return exe


def aiperf_argv(exe: Path, url: str, out: Path) -> list[str]:
    return [
        str(exe), "profile", "-m", MODEL, "--url", url, "--endpoint-type", "chat", "--streaming",
        "--tokenizer", str(TOKENIZER), "--isl", str(PEER_ISL), "--isl-stddev", "0", "--osl", str(OUT_TOKENS),
        "--osl-stddev", "0", "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{OUT_TOKENS}",
        "--search-recipe", "max-concurrency-under-sla", "--ttft-sla-ms", str(TTFT_P99_MS),
        "--search-sla", f"time_to_first_token:p99:le:{TTFT_P99_MS}", "--benchmark-duration", str(PROBE_S), "--artifact-dir", str(out), "--ui-type", "none",
    ]  # fmt: skip


def aiperf_result(out: Path, wall: float) -> dict[str, Any]:
    h = json.loads((out / "search_history.json").read_text())
    b = h.get("boundary_summary") or {}
    feas, infeas = (b.get("feasible_max") or {}).get("value"), (b.get("infeasible_min") or {}).get("value")
    prompt = count = cached = 0.0
    for f in out.glob("search_iter_*/profile_runs/*/profile_export_aiperf.json"):
        run = json.loads(f.read_text())
        u, c = run.get("usage_prompt_tokens") or {}, run.get("usage_prompt_cache_read_tokens") or {}
        if "sum" in u:
            prompt, count, cached = prompt + u["sum"], count + u.get("count", 0), cached + c.get("sum", 0.0)
    return {
        "tool": "AIPerf 0.13 max-concurrency-under-sla",
        "knee": feas,
        "interval": None,
        "shown": str(feas),
        "detail": f"first failing {infeas}; boundary {b.get('boundary_type', '?')}; {h.get('convergence_reason')}",
        "probes": len(h.get("iterations", [])),
        "levels": [it["variation_values"].get("phases.profiling.concurrency") for it in h.get("iterations", [])],
        "wall_min": wall / 60,
        "server_prompt_tokens": prompt / count if count else None,
        "cached_share": cached / prompt if prompt else None,
    }


def guidellm_argv(exe: Path, url: str, out: Path) -> list[str]:
    return [
        str(exe), "run", "--backend", f"kind=openai_http,target={url},model={MODEL}",
        "--profile", "kind=goodput,target_attainment=0.99", "--constraint", f"kind=max_duration,seconds={PROBE_S}",
        "--data", f"kind=synthetic_text,prompt_tokens={GUIDELLM_ISL},output_tokens={OUT_TOKENS}",
        "--tokenizer", f"kind=hf_auto,model={TOKENIZER}",
        "--metrics", json.dumps({"kind": "generative", "slo": {"ttft_ms": TTFT_P99_MS}}),
        "--output", f"kind=json,path={out / 'benchmarks.json'}", "--disable-console-interactive",
    ]  # fmt: skip


def guidellm_result(out: Path, wall: float) -> dict[str, Any]:
    """The goodput search's own record (its probes, best passing and lowest failing streams)."""
    d = json.loads((out / "benchmarks.json").read_text())
    search = next((c for c in d.get("conclusions") or [] if "best_passing_streams" in c), None)
    if search is None:
        raise SystemExit(f"{out / 'benchmarks.json'} holds no goodput search record")
    probes = search["probes"]
    served = [r for b in d.get("benchmarks", []) for r in b.get("requests", {}).get("successful", [])]
    prompt = sum(r.get("prompt_tokens") or 0 for r in served)
    return {
        "tool": "GuideLLM 0.8.1 goodput",
        "knee": search["best_passing_streams"],
        "interval": None,
        "shown": str(search["best_passing_streams"]),
        "detail": f"first failing {search.get('lowest_failing_streams')}; {search.get('stop_reason')}; "
        + ", ".join(f"{p['streams']}:{p['attainment']:.3f}{'' if p.get('resolved', True) else '?'}" for p in probes),
        "probes": len(probes),
        "levels": [p["streams"] for p in probes],
        "wall_min": wall / 60,
        "server_prompt_tokens": prompt / len(served) if served else None,
        "cached_share": sum(r.get("cached_tokens") or 0 for r in served) / prompt if prompt else None,
    }


PEERS_RUN = {"aiperf": (aiperf_argv, aiperf_result), "guidellm": (guidellm_argv, guidellm_result)}
"""Each peer's command line and the reader of its records."""


def peer_run(tool: str, url: str, work: Path) -> dict[str, Any]:
    out = work / tool
    make, read = PEERS_RUN[tool]
    if SMOKE:  # not run (no package index in the tests): its command line built, and its reader
        # fed the records of a real run (trimmed: tests/fixtures/peers, the prefix cache on)
        argv = make(PEERS / tool / "bin" / tool, url, out)
        assert argv[0].endswith(tool) and str(TTFT_P99_MS) in " ".join(argv)
        row = read(FIXTURES / tool, 0.0)
        assert row["knee"] == {"aiperf": 112, "guidellm": 16}[tool], row
        return {**row, "detail": "not run (--smoke); its reader on a recorded run: " + row["detail"]}
    exe = ensure_venv(tool)
    if not TOKENIZER.exists():
        raise SystemExit(f"{TOKENIZER} is missing: run `bash scripts/realengine_setup.sh` (it makes the tokenizer)")
    t0 = time.monotonic()
    with open(work / f"{tool}.log", "w") as log:
        r = subprocess.run(make(exe, url, out), stdout=log, stderr=subprocess.STDOUT, cwd=work)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{tool} failed ({r.returncode}): see {work / (tool + '.log')}")
    return read(out, wall)


REFEREE_STREAMS, REFEREE_S = 15, 60
"""``--referee``: the load (streams, seconds measured) at which each client is set against the
server's own record."""


def _pcts(values: Any) -> str:
    return " / ".join(f"{float(np.percentile(values, q)):.1f}" for q in (50, 90, 99))


def referee(work: Path) -> None:
    """At one load (15 streams in lockstep; --smoke: 2 for a few seconds, ours only), each client's
    TTFT against the server's own: the simulator's truth log (when each request arrived and each
    token left its engine, and when its event was written to the socket) over the requests that
    client sent (ours by response id, AIPerf's by arrival inside its run), and how bunched each
    client's arrivals reached the server (others arriving within 50 ms of each)."""
    streams, secs, warm = (2, 5, 1) if SMOKE else (REFEREE_STREAMS, REFEREE_S, 10)
    port, dport = free_ports(2)
    log = work / "truth.jsonl"
    proc = start_sim(["--dcgm-port", str(dport), "--no-enable-prefix-caching", "--truth-log", str(log)], port)
    url = f"http://127.0.0.1:{port}"
    ai_span: tuple[float, float] | None = None
    try:
        (work / "flat.toml").write_text(FLAT)
        out = work / "referee-spoc"
        r = subprocess.run(
            [*SPOC, "ramp", "--url", url, "--profile", str(work / "flat.toml"), "--users", str(streams),
             "--arrivals", "lockstep", "--step-seconds", str(secs + warm), "--warmup-seconds", str(warm),
             "--max-step-seconds", str(secs + warm), "--sla", f"ttft_p99<={TTFT_P99_MS}ms", "--out", str(out)],
            capture_output=True, text=True,
        )  # fmt: skip
        if r.returncode != 0:
            raise SystemExit(f"spoc ramp failed ({r.returncode}):\n{r.stderr[-2000:]}")
        if not SMOKE and "aiperf" in ONLY:
            exe = ensure_venv("aiperf")
            argv = list(aiperf_argv(exe, url, work / "referee-aiperf"))
            i = argv.index("--search-recipe")
            argv[i : i + 6] = ["--concurrency", str(streams)]  # one fixed load instead of the search
            argv[argv.index("--benchmark-duration") + 1] = str(secs)
            t0 = time.perf_counter()
            with open(work / "referee-aiperf.log", "w") as f:
                r = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, cwd=work)
            if r.returncode != 0:
                raise SystemExit(f"aiperf failed ({r.returncode}): see {work / 'referee-aiperf.log'}")
            ai_span = (t0, time.perf_counter())
    finally:
        proc.stop()
    truth = truthlog.read(log)
    reqs = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    ours = [q for q in reqs if q["ok"] and q["ttft"] is not None and q["step"] == 1]
    ids = {q["request_id"] for q in ours}

    def bunched(sel: list[dict[str, Any]]) -> str:
        a = np.sort([t["arrival"] for t in sel])
        near = [int(((a > x - 0.05) & (a < x + 0.05)).sum()) - 1 for x in a]
        return f"median {np.median(near):.0f}, p90 {np.percentile(near, 90):.0f}"

    mine = truthlog.sent_by(truth, ids)
    print(f"\nreferee at {streams} streams ({secs} s each, the simulator's truth log): TTFT p50 / p90 / p99, ms")
    print(f"  spoc ramp --arrivals lockstep: its client {_pcts(np.array([q['ttft'] for q in ours]) * 1000)} "
          f"({len(ours)} requests); the engine {_pcts(truthlog.ttft_ms(mine))}; written to the socket "
          f"{_pcts(truthlog.ttft_ms(mine, 'sent'))}; others arriving within 50 ms: {bunched(mine)}")  # fmt: skip
    if ai_span is not None:
        found = list((work / "referee-aiperf").glob("**/profile_export_aiperf.json"))
        t = json.loads(found[0].read_text())["time_to_first_token"] if found else {}
        theirs = truthlog.sent_by(truth, None, *ai_span)
        print(f"  AIPerf 0.13 --concurrency {streams}: its client "
              f"{' / '.join(f'{t[k]:.1f}' for k in ('p50', 'p90', 'p99'))} ({t.get('count', '?')} requests); the "
              f"engine {_pcts(truthlog.ttft_ms(theirs))}; written to the socket {_pcts(truthlog.ttft_ms(theirs, 'sent'))} "
              f"({len(theirs)} requests); others arriving within 50 ms: {bunched(theirs)}")  # fmt: skip


def main() -> int:
    port, dport = free_ports(2)
    args = ["--dcgm-port", str(dport), *([] if CACHING else ["--no-enable-prefix-caching"])]
    cores = sorted(os.sched_getaffinity(0))
    pin = PIN and len(cores) >= 2
    proc = start_sim(args, port, core=cores[0] if pin else None)
    if pin:
        os.sched_setaffinity(0, set(cores[1:]))  # this process and every client it starts
    url = f"http://127.0.0.1:{port}"
    where = f"the simulator on core {cores[0]}, the clients on {','.join(map(str, cores[1:]))}" if pin else "unpinned"
    print(f"spoc sim on {url}, {where}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="vs-peers-"))
    rows: list[dict[str, Any]] = []
    try:
        for tool in [] if REFEREE_ONLY else ONLY:
            print(f"running {tool}...", flush=True)
            rows.append(spoc_run(url, work) if tool == "spoc" else peer_run(tool, url, work))
            print("  " + json.dumps(rows[-1]), flush=True)
    finally:
        proc.stop()
    cache = "on" if CACHING else "off"
    print(
        f"\nflat {IN_TOKENS} in / {OUT_TOKENS} out, TTFT p99 <= {TTFT_P99_MS} ms, spoc sim (Llama-3.1-8B, H100, "
        f"prefix caching {cache}):"
    )
    for r in rows:
        print(f"  {r['tool']:<40} knee {r['shown']:<26} probes {r['probes']:>2}  {r.get('wall_min', 0):5.1f} min")
        tokens, share = r.get("server_prompt_tokens"), r.get("cached_share")
        if tokens and share is not None:
            print(f"      prompts as the server counted them: {tokens:.0f} tokens, {100 * share:.0f} % from its cache")
        if r["detail"]:
            print(f"      {r['detail']}")
    if REFEREE:
        referee(work)
    if SMOKE:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"work folder (each tool's own records): {work}")
    return 0


if __name__ == "__main__":
    from spoc_tui.procs.supervise import supervise

    supervise()  # whatever stops this script stops what it started
    sys.exit(main())
