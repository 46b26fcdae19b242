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


MOVED_CAP = 60.0
"""The most the sanity bounds widen for the server's own movement (percentage points)."""


def _bounds(res: dict[str, float]) -> tuple[float, float]:
    """The sanity bounds of E2E and ITL, and of TTFT (median |error| %): 40 and 60, each widened
    by how far the server's own speed moved during the run (its reference gap, 4 streams decoding
    together, before and after calibration and around each held-out ramp: no twin can be nearer
    the server than the server is to itself), by at most ``MOVED_CAP``."""
    moved = min(res.get("server_moved_pct") or 0.0, MOVED_CAP)
    return 40 + moved, 60 + moved


def _sane(res: dict[str, float]) -> bool:
    flat, ttft = _bounds(res)
    return max(res["e2e_p50"], res["itl_p50"]) <= flat and res["ttft_p50"] <= ttft


def test_the_twin_predicts_a_held_out_shape_on_the_real_server(vllm_server, cpu_lock):
    """benchmarks/twin_accuracy.py --smoke on the tier's server: calibrate with a short budget,
    measure a held-out shape (1 and 4 users of short prompts) with spoc ramp, check the twin's
    prediction of it. Unpinned (the load generator shares the cores), on a 25 s budget and two steps,
    the bounds are sanity bounds (E2E and ITL 40 %, TTFT 60 %, each widened by the server's own
    movement over the run: :func:`_bounds`), stated in benchmarks/README.md beside the full figures.

    This server's own speed moves between minutes on a shared 2-core host: three smoke runs in a
    row here (2026-11-28) read its reference gap moving up to 71, 69 and 51 % from right after
    calibration within the run's 100 s, and the twin was off 31/32/15, 57/54/27 and 16/3/14 %
    (E2E/ITL/TTFT). CI31 failed at 54 %, CI78 at 69 % then 103 % TTFT, both before the movement
    was measured. One miss is measured again, as ``spoc twin check`` tells a user whose twin
    drifted (calibrate again); two misses in a row fail: a twin that is wrong (not unlucky) misses
    every time."""
    res, out = _smoke(vllm_server.url)
    if not _sane(res):
        print(f"first run outside the sanity bounds {_bounds(res)} (measured again):\n{out}")
        res, out = _smoke(vllm_server.url)
    assert _sane(res), f"outside the sanity bounds {_bounds(res)}:\n{out}"
