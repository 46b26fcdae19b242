"""The benchmarks that need the real vLLM run their smoke modes here, on the tier's server:
vs_vllm_bench.py (with `vllm bench serve`) and twin_accuracy.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_vs_vllm_bench_runs_in_its_smoke_mode(vllm_server):
    # on the tier's server (SPOC_BENCH_URL): a second vLLM of its own took 45 s to start
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "vs_vllm_bench.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SPOC_BENCH_URL": vllm_server.url},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "vllm bench" in r.stdout and "Traceback" not in r.stderr


def test_the_twin_predicts_a_held_out_shape_on_the_real_server(vllm_server):
    """benchmarks/twin_accuracy.py --smoke on the tier's server: calibrate with a short budget,
    measure a held-out shape (1 and 4 users of short prompts) with spoc ramp, check the twin's
    prediction of it. Unpinned (the load generator shares the cores), on a 25 s budget and two steps,
    the bound is a sanity bound (40 %), stated in benchmarks/README.md beside the full figures."""
    env = {**os.environ, "SPOC_BENCH_URL": vllm_server.url}
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "twin_accuracy.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    res = json.loads(line.removeprefix("RESULT "))
    assert max(res["e2e_p50"], res["itl_p50"], res["ttft_p50"]) <= 40, r.stdout[-2000:]
