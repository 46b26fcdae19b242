"""How long ``spoc --help`` takes, beside a bare ``python -c pass``, in one run.

Target (issue 35): under 0.25 s (it took 0.4-0.7 s when the CLI imported the ramp, Optuna,
numpy and httpx to show its options). Median of N runs each; ``--smoke`` (make test): 3 runs.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOKE = "--smoke" in sys.argv
RUNS = 3 if SMOKE else 15
TARGET_S = 0.25


def timed(argv: list[str]) -> float:
    times = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True, cwd=ROOT)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    bare = timed([sys.executable, "-c", "pass"])
    helped = timed([sys.executable, "-m", "spoc_tui.cli", "--help"])
    ramp = timed([sys.executable, "-m", "spoc_tui.cli", "ramp", "--help"])
    print(f"median of {RUNS} runs: python -c pass {bare * 1000:.0f} ms")
    print(f"  spoc --help {helped * 1000:.0f} ms ({(helped - bare) * 1000:.0f} ms over bare Python)")
    print(f"  spoc ramp --help {ramp * 1000:.0f} ms")
    verdict = "meets" if helped <= TARGET_S else "MISSES"
    print(f"spoc --help {helped:.3f} s: {verdict} the {TARGET_S} s target")
    return 0 if SMOKE or helped <= TARGET_S else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from spoc_tui.procs.supervise import supervise

    supervise()  # whatever stops this script stops what it started
    sys.exit(main())
