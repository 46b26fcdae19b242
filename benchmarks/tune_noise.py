"""How much one tuning trial's figures move when nothing changes (issue 16; run: make bench, or
python benchmarks/tune_noise.py [sim|vllm|both] [REPEATS] [STEP_SECONDS] [--profile=NAME]).

`spoc tune` as a user runs it, with its defaults (the chatbot profile, `--users auto`: the first
trial's calibration picks the reference load near saturation), one trial (the server defaults)
and `--repeat-pareto REPEATS` (default 4): the same configuration run again that many times, each
on a freshly started server. Printed per target: the reference load, every run's output tokens/s
and ITL p99 (the objectives of benchmarks/tune_quality.py), and their coefficient of variation,
which `tune_quality.py --noise --cv=TOK,LAT` then injects into its virtual-time table.

Targets: `sim` is `spoc sim llama-3.1-8b` in real time on this machine; `vllm` is the real-engine
tier's vLLM 0.32 CPU build with the tiny Llama (scripts/realengine_setup.sh), which is skipped
when the tier is not set up.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from realengine import VLLM_ENV, ready, serve_command  # noqa: E402

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
SMOKE = "--smoke" in sys.argv
"""make test runs it so (that the script runs, not its figures): the simulator, 2 repeats of 4 s at 8 users."""
if SMOKE:
    ARGS = ["sim", "2", "4"]
TARGETS = ARGS[0] if ARGS else "both"
REPEATS = int(ARGS[1]) if len(ARGS) > 1 else 4
STEP_S = float(ARGS[2]) if len(ARGS) > 2 else 30.0
PROFILE = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--profile=")), None)
"""``--profile=NAME``: another load profile than spoc tune's default."""
OBJECTIVES = "max:out_tok_s,min:itl_p99"
SLA = "ttft_p99<=30s,itl_p99<=300ms"


def launch(target: str) -> tuple[str, list[str]] | None:
    if target == "sim":
        return f"{sys.executable} -m spoc_tui.cli sim llama-3.1-8b --port {{port}} --dcgm-port 0 {{flags}}", []
    if not ready():
        return None
    return f"{serve_command()} {{flags}}", [f"--env={k}={v}" for k, v in VLLM_ENV.items()]


def measure(target: str) -> dict[str, float] | None:
    found = launch(target)
    if found is None:
        print(f"{target}: the real-engine tier is not set up (bash scripts/realengine_setup.sh); skipped")
        return None
    template, extra = found
    out = Path(tempfile.mkdtemp(prefix=f"spoc-tune-noise-{target}-"))
    argv = [
        sys.executable, "-m", "spoc_tui.cli", "tune", "--launch", template, "--sla", SLA, "--objectives", OBJECTIVES,
        "--trials", "1", "--repeat-pareto", str(REPEATS), "--step-seconds", str(STEP_S), "--out", str(out),
        "--rerun-share", "0", *extra, *(["--profile", PROFILE] if PROFILE else []),
        *(["--warmup-seconds", "2", "--users", "8"] if SMOKE else []),
    ]  # fmt: skip
    r = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"{target}: spoc tune failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    rows = [json.loads(x) for x in (out / "trials.jsonl").read_text().splitlines() if x.strip()]
    runs = [x for x in rows if x.get("status") == "ok"]
    tok = [float(x["objectives"]["out_tok_s"]) for x in runs]
    itl = [float(x["objectives"]["itl_p99"]) for x in runs]
    ref = next((x.get("reference", {}).get("users") for x in runs if x.get("reference")), None)
    n = [x.get("n", {}).get("out_tok_s") for x in runs]
    prof = PROFILE or "spoc tune's default"
    print(
        f"\n{target}, profile {prof}: reference load {ref} users (the calibration's); {len(runs)} runs of the defaults"
    )
    print(f"{'run':<6}{'out tok/s':>12}{'ITL p99 ms':>12}{'requests':>10}")
    for i, (a, b, k) in enumerate(zip(tok, itl, n, strict=True)):
        print(f"{i + 1:<6}{a:>12,.1f}{b * 1000:>12.1f}{k if k is not None else '?':>10}")
    cv = {
        "out_tok_s": statistics.stdev(tok) / statistics.mean(tok) if len(tok) > 1 else float("nan"),
        "itl_p99": statistics.stdev(itl) / statistics.mean(itl) if len(itl) > 1 else float("nan"),
    }
    print(f"coefficient of variation: out tok/s {cv['out_tok_s']:.3f}, ITL p99 {cv['itl_p99']:.3f}")
    print(f"-> python benchmarks/tune_quality.py --noise --cv={cv['out_tok_s']:.3f},{cv['itl_p99']:.3f}")
    if SMOKE:
        shutil.rmtree(out, ignore_errors=True)
    else:
        print(f"(study in {out})")
    return cv


def main() -> None:
    targets = ["sim", "vllm"] if TARGETS == "both" else [TARGETS]
    if not set(targets) <= {"sim", "vllm"}:
        raise SystemExit("usage: tune_noise.py [sim|vllm|both] [REPEATS] [STEP_SECONDS] [--profile=NAME]")
    for t in targets:
        measure(t)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from spoc_tui.procs.supervise import supervise

    supervise()  # whatever stops this script stops what it started
    main()
