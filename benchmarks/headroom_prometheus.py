"""The headroom learned through Prometheus against the knee measured on each replica (issue 75).

Two simulated replicas (the A100 preset, ``max-num-seqs`` 48, untold) serve fifteen minutes of
open-loop traffic that swells as benchmarks/headroom.py's does, one at its base rate, the other at
0.6 of it, scraped every 5 s. Their scrapes are loaded into a real Prometheus (``promtool tsdb
create-blocks-from openmetrics``: the history a fleet Prometheus holds, made on the virtual clock)
and ``spoc inspect --prometheus URL --headroom --since 15m --json`` is run against it, as a user
runs it, timed. Beside each replica's headroom: the same scrapes read directly
(``HeadroomLearner``, as ``spoc inspect --headroom`` watching the replica would), and the knee
measured on that replica: its window's requests sent again to a fresh server as their users would
send them, s times as often (headroom.py's truth). Printed per seed and replica: both headrooms,
the knee, whether each interval holds it and the point's error; then the share held and the
median error of each way.

Usage: python benchmarks/headroom_prometheus.py [--seeds=N] (make bench: 3); ``--smoke``: one
seed, five minutes, the estimate through Prometheus in-process and short, no direct estimate and no
knee (checks that the path runs).
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from headroom import PRESETS, SLA, judged, process, server, set_load, users_knee, workload  # noqa: E402
from realengine import start_prometheus  # noqa: E402

from spoc_tui.core.ramp.sla import parse_sla  # noqa: E402
from spoc_tui.procs.group import stop_process_group  # noqa: E402
from spoc_tui.sim.history import write_openmetrics  # noqa: E402
from spoc_tui.sim.watch import VirtualWatch  # noqa: E402
from spoc_tui.twin.headroom import HeadroomLearner  # noqa: E402

SMOKE = "--smoke" in sys.argv
GPU = "a100-80gb"
SHARES = {"replica-a:8000": 1.0, "replica-b:8000": 0.6}
OBSERVE_S = 300.0 if SMOKE else 900.0


def observed(seed: int, base: float):
    """Each replica's scrapes every 5 s (virtual time), the requests it was sent, its direct learner."""
    scrapes, sent, learners = {}, {}, {}
    for k, (name, share) in enumerate(SHARES.items()):
        vs = server(GPU, seed + 100 * k, workload(), record=True)
        watch = VirtualWatch([vs], window_s=60.0, interval_s=5.0)
        learner = HeadroomLearner(tuple(parse_sla(SLA)))
        load = process(base * share, False, False)
        rows = []
        for _ in watch.run(OBSERVE_S, before=lambda t: set_load(vs, False, load(t)) if round(t) % 10 == 0 else None):  # noqa: B023
            learner.add(watch.now, watch.expositions[0])
            rows.append((watch.now, watch.expositions[0]))
        scrapes[name], sent[name], learners[name] = rows, list(vs.sent or []), learner
    return scrapes, sent, learners


def backfilled(scrapes: dict, work: Path) -> Path:
    end = time.time() - 5.0
    wall = {name: [(end - OBSERVE_S + t, exp) for t, exp in rows] for name, rows in scrapes.items()}
    with (work / "history.om").open("w") as f:
        write_openmetrics(wall, f)
    promtool = shutil.which("promtool") or "/usr/bin/promtool"
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(work / "history.om"),
                    str(work / "blocks")], check=True, capture_output=True, timeout=300)  # fmt: skip
    return work / "blocks"


def through_prometheus(url: str) -> tuple[dict, float]:
    """``spoc inspect --prometheus --headroom`` (the smoke: the same path in-process, short)."""
    since = f"{OBSERVE_S / 60:.0f}m"
    t0 = time.monotonic()
    if SMOKE:
        from spoc_tui.twin.history import history_headroom
        from spoc_tui.twin.live import LiveHeadroom

        live = LiveHeadroom(tuple(parse_sla(SLA)), draws=1, replay_s=30.0, seats=48)  # told: one replay each
        doc = asyncio.run(history_headroom(url, OBSERVE_S, live)).as_dict()
    else:
        argv = [sys.executable, "-m", "spoc_tui.cli", "inspect", "--prometheus", url, "--headroom", "--since", since,
                "--sla", SLA, "--json"]  # fmt: skip
        r = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            raise SystemExit(f"spoc inspect failed ({r.returncode}): {r.stderr[-2000:]}")
        doc = json.loads(r.stdout)
    return doc, time.monotonic() - t0


def one(seed: int, base: float, rows: dict[str, list[tuple[bool, float]]]) -> None:
    scrapes, sent, learners = observed(seed, base)
    work = Path(tempfile.mkdtemp(prefix="spoc-headroom-prom-"))
    url, proc, pwork = start_prometheus({}, backfilled(scrapes, work))
    try:
        doc, took = through_prometheus(url)
    finally:
        stop_process_group(proc)
        shutil.rmtree(pwork, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    got = {s["source"]: s.get("headroom") or {} for s in doc["servers"]}
    fleet = (doc.get("fleet") or {}).get("headroom") or {}
    print(f"seed {seed}: spoc inspect --prometheus --headroom --since {OBSERVE_S / 60:.0f}m answered in {took:.0f} s; "
          f"fleet x{fleet.get('estimate')} (its weakest replica, {(doc.get('fleet') or {}).get('replica')})")  # fmt: skip
    for name, learner in learners.items():
        h = got.get(name, {})
        if SMOKE:  # the path through Prometheus only (the direct estimate is headroom.py's smoke)
            print(f"  {name}: through Prometheus x{h.get('estimate')} (95 %: {h.get('ci95')}), identified "
                  f"{h.get('identified')}; {len(scrapes[name])} scrapes observed")  # fmt: skip
            continue
        direct = learner.estimate(seed=0, draws=4, replay_s=120.0)
        traffic = direct.traffic
        since = OBSERVE_S - (traffic.seconds if traffic is not None else OBSERVE_S)
        knee = users_knee(GPU, seed + 100 * list(SHARES).index(name), sent[name], since)
        lo, hi = h.get("ci95") or (None, None)
        via = h.get("estimate")
        inside = (
            bool(h.get("identified"))
            and math.isfinite(knee)
            and (lo is None or lo <= knee)
            and (hi is None or knee <= hi)
        )
        err = abs(via - knee) / knee * 100 if via and math.isfinite(knee) else math.nan
        rows.setdefault("through Prometheus", []).append((inside, err))
        rows.setdefault("direct scrapes", []).append(judged(direct, knee))
        print(f"  {name} (x{SHARES[name]:g} of the base rate): through Prometheus x{via} (95 %: {lo}-{hi}), "
              f"identified {h.get('identified')}; direct: {direct.line()}")  # fmt: skip
        print(f"    measured knee x{knee:.3g}; inside: Prometheus {inside}, direct {rows['direct scrapes'][-1][0]}; "
              f"errors {err:.0f} % and {rows['direct scrapes'][-1][1]:.0f} %")  # fmt: skip


def main() -> int:
    seeds = 1 if SMOKE else next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--seeds=")), 3)
    base = PRESETS[GPU]
    print(f"the headroom through a real Prometheus vs the knee measured on each replica: {GPU}, SLA {SLA}, "
          f"{OBSERVE_S / 60:.0f} min of two replicas' scrapes every 5 s")  # fmt: skip
    rows: dict[str, list[tuple[bool, float]]] = {}
    for seed in range(1, seeds + 1):
        one(seed, base, rows)
    if not SMOKE:
        for name, rs in rows.items():
            errs = [e for _, e in rs if math.isfinite(e)]
            med = statistics.median(errs) if errs else math.nan
            print(f"{name}: interval holds the measured knee {sum(ok for ok, _ in rs)}/{len(rs)}; "
                  f"median point error {med:.0f} %")  # fmt: skip
    return 0


if __name__ == "__main__":
    from spoc_tui.procs.supervise import supervise

    supervise()
    sys.exit(main())
