"""The benchmarks run in a short smoke mode, so none can rot unnoticed (their figures: make bench)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_knee_search_benchmark_smoke():
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "knee_search.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all cases: inference holds the truth" in r.stdout and "bisection" in r.stdout


def test_replay_memory_benchmark_smoke():
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "replay_memory.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "a load generator's replay share" in r.stdout and "meets the 300 MB target" in r.stdout
