"""The benchmarks that need the real vLLM run their smoke modes: vs_vllm_bench.py (with `vllm
bench serve`) here, on a server of its own; twin_accuracy.py in test_twin_real.py, on the tier's."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_vs_vllm_bench_runs_in_its_smoke_mode():
    """With a vLLM server of its own (about 45 s to start) on the tier's second worker, whose
    tests start their own servers: on the tier's server it had made that worker's share 360 s
    against the other's 190 (2026-11-29)."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "vs_vllm_bench.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
        env={k: v for k, v in os.environ.items() if k != "SPOC_BENCH_URL"},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "vllm bench" in r.stdout and "Traceback" not in r.stderr
