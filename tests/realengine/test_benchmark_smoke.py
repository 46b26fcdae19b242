"""benchmarks/vs_vllm_bench.py needs the real vLLM and its `vllm bench serve`: its smoke mode runs here."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_vs_vllm_bench_runs_in_its_smoke_mode():
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "vs_vllm_bench.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "vllm bench" in r.stdout and "Traceback" not in r.stderr
