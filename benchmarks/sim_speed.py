"""The engine's speed beside the engine as it was when issue 73 was filed (run: make bench).

Three cases, each run by the engine of this checkout and by the one at the base commit (default
a823390, the commit issue 73 was filed against: its ``spoc_tui`` taken out with ``git archive``),
in child processes of one run, with the same seeds:

 (a) the demo's traffic: ``spoc demo``'s simulated H100 with Llama-3.1-8B, 48 chatbot users
     (closed loop, their think time), in virtual time;
 (b) an H100 at 40 requests a second (open loop, chatbot), max-num-seqs 256;
 (c) a long-prompt coding trace: the coding profile's traffic (6,000 shared tokens of repository,
     a pasted file, growing history) at 1.5 requests a second.

For each: the simulated engine steps and virtual seconds per CPU-second, and the CPU time of one
``spoc twin predict`` of a ten-step ramp on a twin of that server (users 4-40; rates 4-40/s; the
coding trace, written as a spoc JSONL trace, at ten speeds), its figures beside the old engine's
(the predictions must agree within 1 %: every step's TTFT p99, ITL p99 and output tokens/s, and
the knee).

Targets (issue 73): at least 30 times faster on (a) and (c), at least 10 times on (b); the
predictions within 1 %. The full run exits 1 when a prediction moved more or a target is missed,
and says which. ``--smoke`` (make test): short runs of each case and small predictions, both
engines (the old one's prediction for (c) only); its figures say only that it runs. ``--base=COMMIT``: another engine to compare with.
Without git or the base commit (a copy of the source without its history) the old side is left
out and said so.
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

ROOT = Path(__file__).resolve().parents[1]
BASE = "a823390"
SMOKE = "--smoke" in sys.argv
CASES = ("a", "b", "c")
TARGET = {"a": 30.0, "b": 10.0, "c": 30.0}
WHAT = {
    "a": "(a) demo: H100, Llama-3.1-8B, 48 chatbot users",
    "b": "(b) H100 at 40 requests/s, max-num-seqs 256",
    "c": "(c) long-prompt coding traffic, 1.5 requests/s",
}
SECONDS = {"a": 600.0, "b": 240.0, "c": 600.0}
"""Virtual seconds of each case's engine run (a tenth in the smoke)."""


# -- the child: one measurement on whichever spoc_tui is first on its path ---------------------
def _server(case: str):  # type: ignore[no-untyped-def]
    from spoc_tui.core.hardware.presets import GPUS, MODELS
    from spoc_tui.sim.engine import EngineConfig
    from spoc_tui.sim.virtual import VirtualServer
    from spoc_tui.workload import load_workload

    seqs = 256
    cfg = EngineConfig(model=MODELS["llama-3.1-8b"], gpu=GPUS["h100-80gb"], served_model_name="m", max_num_seqs=seqs)
    if case == "a":
        return VirtualServer(cfg, load_workload("chatbot"), users=48, seed=1)
    vs = VirtualServer(cfg, load_workload("chatbot" if case == "b" else "coding"), users=0, seed=1)
    vs.set_rate(40.0 if case == "b" else 1.5)
    return vs


def child_engine(case: str, seconds: float) -> dict[str, object]:
    vs = _server(case)
    t0 = time.process_time()
    for k in range(1, 21):
        vs.advance(seconds * k / 20)
    cpu = time.process_time() - t0
    st = vs.engine.stats
    ok = [s for s in vs.samples if s.ok]
    return {
        "cpu": cpu,
        "steps": st.iterations,
        "virtual": vs.now,
        "requests": len(vs.samples),
        "tokens": st.generation_tokens,
        "ttft_sum": sum(s.ttft or 0.0 for s in ok),
    }


def child_predict(case: str, twin: str, trace: str, out: str) -> dict[str, object]:
    from spoc_tui.cli.main import cli

    step = "10" if SMOKE else "60"
    levels = "4,16" if SMOKE else ",".join(str(4 * k) for k in range(1, 11))
    args = ["twin", "predict", "--twin", twin, "--step-seconds", step, "--warmup-seconds", "2" if SMOKE else "10",
            "--draws", "1" if SMOKE else "12", "--out", out, "--seed", "3"]  # fmt: skip
    if case == "a":
        args += ["--profile", "chatbot", "--users", levels]
    elif case == "b":
        args += ["--profile", "chatbot", "--rate", levels]
    else:
        speeds = "0.5,2" if SMOKE else "0.25,0.5,0.75,1,1.5,2,3,4,6,8"
        args += ["--trace", trace, "--speed", speeds]
    t0 = time.process_time()
    try:
        cli.main(args, standalone_mode=False)
    except SystemExit as e:
        if e.code:
            raise
    return {"cpu": time.process_time() - t0}


# -- the parent --------------------------------------------------------------------------------
def old_tree(base: str, into: Path) -> Path | str:
    """The base commit's ``spoc_tui`` under ``into``, or why it cannot be had."""
    if shutil.which("git") is None:
        return "git is not installed"
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", base, "spoc_tui"], capture_output=True)
    if archive.returncode != 0:
        return f"git archive {base}: {archive.stderr.decode(errors='replace').strip() or 'failed'}"
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def run_child(root: Path, *args: str) -> dict[str, object]:
    # both sides with one BLAS thread (spoc sets it since issue 73; an idle OpenBLAS worker
    # spinning would count against whichever side called BLAS last)
    env = dict(os.environ, PYTHONPATH=str(root), OPENBLAS_NUM_THREADS="1")
    r = subprocess.run([sys.executable, __file__, *args, *(["--smoke"] if SMOKE else [])], capture_output=True,
                       text=True, env=env, timeout=3600, cwd=str(root))  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} under {root}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def write_twin_and_trace(folder: Path) -> tuple[Path, Path]:
    """A twin of the simulated H100 (its KV blocks, vLLM's defaults, a step model near the
    simulator's roofline) and the coding trace, in the forms both engines read."""
    import random

    from spoc_tui.core.hardware.presets import GPUS, MODELS
    from spoc_tui.sim.engine import EngineConfig, SimEngine
    from spoc_tui.twin.model import ServerConfig, StepModel, Twin, write_twin

    eng = SimEngine(EngineConfig(model=MODELS["llama-3.1-8b"], gpu=GPUS["h100-80gb"], served_model_name="m"))
    server = ServerConfig("m", eng.max_len, 16, eng.num_blocks, True, 0.9, 256, eng.budget, True)
    fit = StepModel(0.0060, 2.8e-5, 9e-4, 2e-5, 4.7e-5, 5e-4, 0.005, 0.0005, 4e-5)
    rng = random.Random(7)
    draws = tuple(StepModel(*(x * (1 + rng.gauss(0, 0.03)) for x in fit.vector())) for _ in range(16))
    lengths = tuple(max(1, int(rng.lognormvariate(5.2, 0.7))) for _ in range(200))
    twin = Twin(fit, StepModel(*(0.03 * x for x in fit.vector())), draws, 0.04, server, answer_lengths=lengths)
    write_twin(twin, folder / "twin.json")
    rows, t = [], 0.0
    for conv in range(40 if SMOKE else 200):
        t += rng.expovariate(1.0 / 1.2)
        history = 6000 + int(rng.lognormvariate(6.8, 0.7))
        at = t
        for _turn in range(rng.randint(2, 5)):
            out = min(1500, int(rng.lognormvariate(5.86, 0.5)))
            blocks = history // 16
            rows.append({"t": round(at, 3), "input_tokens": history, "output_tokens": out,
                         "hash_ids": [*range(375), *range(10_000 * (conv + 1), 10_000 * (conv + 1) + blocks - 375)],
                         "block_tokens": 16})  # fmt: skip
            history += out + int(rng.lognormvariate(4.8, 0.6))
            at += rng.uniform(20, 60)
    rows.sort(key=lambda r: r["t"])  # type: ignore[arg-type, return-value]
    trace = folder / "coding.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "twin.json", trace


def figures(out: Path) -> dict[str, float]:
    """A predicted ramp.json's deciding figures: each step's TTFT p99, ITL p99 and output
    tokens/s, and the knee."""
    doc = json.loads(next(out.glob("*.json")).read_text())
    got: dict[str, float] = {}
    for i, s in enumerate(doc.get("steps", [])):
        for key in ("ttft", "itl"):
            v = ((s.get("latency") or {}).get(key) or {}).get("p99")
            if isinstance(v, (int, float)):
                got[f"step {i + 1} {key} p99"] = float(v)
        v = s.get("output_tokens_per_s")
        if isinstance(v, (int, float)):
            got[f"step {i + 1} output tok/s"] = float(v)
    knee = doc.get("knee") or {}
    if isinstance(knee.get("estimate"), (int, float)):
        got["knee"] = float(knee["estimate"])
    return got


def moved(old: dict[str, float], new: dict[str, float]) -> tuple[float, str]:
    """The largest relative difference between two predictions' figures, and where."""
    worst, where = 0.0, "none"
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a is None or b is None:
            return float("inf"), f"{k} in one only"
        d = abs(a - b) / max(abs(a), 1e-12)
        if d > worst:
            worst, where = d, k
    return worst, where


def main() -> int:
    for arg in sys.argv[1:]:
        if arg in ("-h", "--help"):
            print(__doc__)
            return 0
        if not (arg == "--smoke" or arg.startswith(("--base=", "--child"))):
            print(f"sim_speed.py: unknown option {arg!r} (--smoke, --base=COMMIT)", file=sys.stderr)
            return 2
    child = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--child=")), None)
    if child is not None:
        kind, case, *rest = child.split(",")
        if kind == "engines":  # every case's engine run in one process (a start is a second)
            print(json.dumps({c: child_engine(c, SECONDS[c] / (10 if SMOKE else 1)) for c in CASES}))
        else:
            print(json.dumps(child_predict(case, *rest)))
        return 0
    base = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--base=")), BASE)
    failed: list[str] = []
    """Speed targets missed (the full run's exit 1)."""
    broken: list[str] = []
    """The engines disagreeing (exit 1 in the smoke too)."""
    with tempfile.TemporaryDirectory(prefix="spoc-sim-speed-") as tmp:
        work = Path(tmp)
        (work / "old").mkdir()
        old = old_tree(base, work / "old")
        twin, trace = write_twin_and_trace(work)
        print(f"engine speed, this checkout beside {base}" + ("" if isinstance(old, Path) else f" (not run: {old})"))
        engines_new = run_child(ROOT, "--child=engines,all")
        engines_old = run_child(old, "--child=engines,all") if isinstance(old, Path) else {}
        for case in CASES:
            new = engines_new[case]  # type: ignore[assignment]
            line = (f"  {WHAT[case]}: {new['steps']:,} steps over {new['virtual']:.0f} virtual s in "
                    f"{new['cpu']:.2f} CPU s: {new['steps'] / new['cpu']:,.0f} steps and "
                    f"{new['virtual'] / new['cpu']:,.0f} virtual s per CPU s")  # fmt: skip
            outs = {}
            for side, root in (("new", ROOT), ("old", old)):
                if not isinstance(root, Path) or (SMOKE and case != "c"):
                    continue  # the smoke predicts once a side (the trace's, a fleet replay): one code path
                out = work / f"pred-{case}-{side}"
                outs[side] = (run_child(root, f"--child=predict,{case},{twin},{trace},{out}"), out)
            if isinstance(old, Path):
                was = engines_old[case]  # type: ignore[assignment]
                same = (was["requests"], was["tokens"]) == (new["requests"], new["tokens"])
                ratio = float(was["cpu"]) / max(float(new["cpu"]), 1e-9)  # type: ignore[arg-type]
                line += f"; the old engine {was['cpu']:.2f} CPU s: x{ratio:.1f} (target x{TARGET[case]:g})"
                line += "" if same else f"; RAN OTHER REQUESTS ({was['requests']} against {new['requests']})"
                if not same:
                    broken.append(f"{case}: the engines served other requests")
                if ratio < TARGET[case]:
                    failed.append(f"{case}: engine x{ratio:.1f}, under x{TARGET[case]:g}")
            print(line)
            if "new" not in outs:
                continue
            (pn, out_new) = outs["new"]
            said = f"    spoc twin predict, ten steps: {pn['cpu']:.1f} CPU s"
            if "old" in outs:
                (po, out_old) = outs["old"]
                ratio = float(po["cpu"]) / max(float(pn["cpu"]), 1e-9)  # type: ignore[arg-type]
                worst, where = moved(figures(out_old), figures(out_new))
                said += (f" against {po['cpu']:.1f} (x{ratio:.1f}); its figures moved {worst * 100:.3g} % at most"
                         f" ({where}; target 1 %)")  # fmt: skip
                if worst > 0.01:
                    broken.append(f"{case}: the prediction moved {worst * 100:.3g} % ({where})")
                if ratio < TARGET[case]:
                    failed.append(f"{case}: twin predict x{ratio:.1f}, under x{TARGET[case]:g}")
            print(said)
    if broken:
        print("the engines disagree: " + "; ".join(broken))
        return 1
    if failed and not SMOKE:
        print("targets missed: " + "; ".join(failed))
        return 1
    print("sim_speed: " + ("smoke run (figures say only that it runs)" if SMOKE else "every target met"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
