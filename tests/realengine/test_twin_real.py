"""benchmarks/twin_accuracy.py's smoke mode on the tier's server: the real-engine twin test.

It asserts no figure the host moves, so it runs beside the other worker's servers (it held
``cpu_lock`` while it asserted the twin's error, which put its 100 s on the tier's critical path)."""

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


def test_the_twin_predicts_a_held_out_shape_on_the_real_server(vllm_server):
    """benchmarks/twin_accuracy.py --smoke on the tier's server: calibrate with a short budget,
    measure a held-out shape (4 users of short prompts) with spoc ramp, and compare the
    twin's prediction of it. Asserted: every part ran and gave a figure (a finite error for E2E,
    ITL and TTFT, and the server's own movement over the run measured beside them).

    How close the twin comes is the benchmark's figure (benchmarks/README.md, Twin), not this
    test's: this server's own speed moves between minutes on a shared 2-core host (three smoke
    runs in a row on 2026-11-28 read its reference gap moving 71, 69 and 51 % within the run's
    100 s, and the twin off 31/32/15, 57/54/27 and 16/3/14 % E2E/ITL/TTFT). Bounds on those
    figures failed clean-clone runs, and a second try on a miss hid nothing but the host (issue 55:
    no retries as a fix)."""
    res, out = _smoke(vllm_server.url)
    for key in ("e2e_p50", "itl_p50", "ttft_p50"):
        assert 0 <= res[key] < float("inf"), f"{key}: {res.get(key)}\n{out}"
    assert res.get("server_moved_pct") is not None and res["server_moved_pct"] >= 0, out
