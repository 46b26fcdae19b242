"""The benchmarks that need the real vLLM run their smoke modes on the tier's server:
vs_vllm_bench.py (with `vllm bench serve`) here, twin_accuracy.py in test_twin_real.py."""

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
