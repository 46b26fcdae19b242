"""The headroom's ledger on the simulator, in simulated time (issue 76, point 4).

The monitor's passive learner reads the simulated A100 (max-num-seqs 48, untold) every 5 s, as
``spoc monitor`` would, while open-loop chatbot-like traffic swings between x0.5 and x2 of its
mean rate (1.5 requests/s) every ten minutes. Every minute the learner closes is graded as soon
as it closes (the monitor grades the newest within a CPU share; here every one): its traffic
replayed on a fit of the windows before it, each SLA figure and the mean gap predicted with a
95 % interval, beside the server's own histogram (``spoc_tui.twin.ledger``).

Cases (``--cases=swing,throttle,seats,slower``; all by default):

- ``swing``: 40 minutes. Targets: at least 30 windows graded, the intervals holding the server's
  figures in at least 90 % of them.
- ``throttle``: after 20 minutes the GPU's clocks fall to 60 % and stay there (a failed fan, a
  power cap; the server does not restart, its counters go on): the change flagged within 3 windows
  (the ledger's drift), the fit learned again from the windows since, and the estimate at 40
  minutes holding the knee measured on a server throttled the same way (the window's requests
  sent again as their users would, ``benchmarks/headroom.py``'s truth).
- ``seats``: after 20 minutes the server restarts with half its seats (24), ``slower``: as an
  L40S; their counters go back, so the change is said at once; the estimate at 40 minutes beside
  the knee measured on the new server.

Printed per case and seed: the windows graded and held, the median point error per figure, the
CPU a graded window took; for the changes, the windows until flagged and until re-learned, and
the headroom beside the measured knee. The full run exits 1 where a target is missed.

``--real [--minutes=20] [--base=5]``: the real-engine tier's vLLM CPU server (tiny Llama, 8 seats,
on core 0) under ``benchmarks/headroom.py``'s real traffic (a swell every two minutes between 35 %
and 100 % of ``--base`` requests a second; at 1 a second the batch never passed one request, and
the fit of 41 windows could not say the step time: nothing graded) replayed at x1 by
``spoc ramp --trace T --speed 1`` (on core 1), its ``/metrics`` read every 5 s and kept; then the
kept scrapes read again in order by a fresh learner that grades each minute as it closes (as the
monitor would, each on a fit of the minutes before it; done after the run so that the grading's
CPU does not slow the load generator beside it), by the windows alone and with the twin
``spoc twin calibrate`` (180 s, on the server after the load) makes as the learner's prior, as an
operator gives the monitor ``--twin``. The host's own drift beside it: one fixed request's decode
gap before, halfway, after the load and after the calibration.

``--again=DIR``: a real run's kept scrapes (``DIR/scrapes.jsonl``, and ``DIR/twin.json`` where the
calibration made one) graded again, without the half hour of the real server.

Usage: python benchmarks/ledger.py [--seeds=N] [--cases=swing,throttle,seats,slower] | --real
[--minutes=M] [--base=R] | --again=DIR; ``--smoke``:
the swing for 8 minutes (that it runs).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import headroom as hb  # noqa: E402

from spoc_tui.core.ramp.sla import parse_sla  # noqa: E402
from spoc_tui.sim.virtual import VirtualServer  # noqa: E402
from spoc_tui.sim.watch import VirtualWatch  # noqa: E402
from spoc_tui.twin.headroom import HeadroomLearner  # noqa: E402
from spoc_tui.twin.ledger import Graded, Seen  # noqa: E402

MEAN = 1.5
"""The traffic's mean rate, requests/s (its swing: x0.5 to x2 of it every ten minutes)."""
RUN_S = 2400.0
CHANGE_S = 1200.0
CLOCK = 0.6
"""The throttled GPU's clocks, of their maximum."""
TARGET_WINDOWS, TARGET_HELD, TARGET_FLAGGED = 30, 0.90, 3


def rate(t: float) -> float:
    return MEAN * 2 ** math.sin(2 * math.pi * t / 600.0)


def throttle(vs: VirtualServer) -> VirtualServer:
    """Its GPUs held at :data:`CLOCK` of their clocks from now on (thermal slowdown's reason bit set)."""
    for g in vs.engine.gpus:
        g.reasons = 0x20
        g.sm_clock_mhz = CLOCK * g.spec.sm_clock_max_mhz
    return vs


@dataclass
class Run:
    """One case on one seed, as it went."""

    graded: list[tuple[float, Graded]] = field(default_factory=list)
    skipped: list[tuple[float, str]] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    flagged_at: float | None = None
    """When the learner said the server changed (a restart said, or the ledger's drift)."""
    relearned_at: float | None = None
    """The first window graded on a fit of the windows since the change."""


def serve(learner: HeadroomLearner, vs: VirtualServer, offset: float, seconds: float, run: Run, seed: int) -> None:
    """``seconds`` more of ``vs`` (from where its clock is), read every 5 s into ``learner`` (whose
    clock is ``offset`` ahead of the server's: a restarted server's starts at 0), each window
    graded when it closes."""
    watch = VirtualWatch([vs], window_s=60.0, interval_s=5.0)

    def before(t: float) -> None:
        if round(t) % 10 == 0:
            vs.set_rate(rate(t + offset))

    for _ in watch.run(seconds, before=before):
        t = offset + watch.now
        was_restarted = learner.one.restarted(t)
        learner.add(t, watch.expositions[0])
        if run.flagged_at is None and learner.one.restarted(t) and not was_restarted:
            run.flagged_at = t
        drifted = learner.relearning
        done = grade_newest(learner, run, seed * 1000 + int(t))
        if done is None:
            continue
        if learner.relearning is not None and drifted is None and run.flagged_at is None:
            run.flagged_at = t
        seen, got = done
        if not isinstance(got, str) and run.flagged_at is not None and run.relearned_at is None and t > run.flagged_at:
            run.relearned_at = seen.t1  # the first graded on a fit of the windows since


def grade_newest(learner: HeadroomLearner, run: Run, seed: int) -> tuple[Seen, Graded | str] | None:
    """The learner's newest closed window graded (as the monitor grades it) and noted in ``run``
    (graded with its CPU, or skipped with why), the ledger told; None where none closed."""
    seen = learner.ledger.take_newest()
    if seen is None:
        return None
    c = time.process_time()
    got, fit = learner.grade(seen, seed=seed)
    if isinstance(got, str):
        run.skipped.append((seen.t1, got))
    else:
        run.cpu.append(time.process_time() - c)
        run.graded.append((seen.t1, got))
    learner.graded(got, fit)
    return seen, got


def held_share(graded: list[tuple[float, Graded]]) -> tuple[int, int]:
    return sum(g.held for _, g in graded), len(graded)


def errors(graded: list[tuple[float, Graded]]) -> str:
    by: dict[str, list[float]] = {}
    for _, g in graded:
        for f in g.figures:
            by.setdefault(f.key, []).append(abs(f.error) * 100)
    return ", ".join(f"{k} {statistics.median(v):.0f} %" for k, v in by.items())


def report(name: str, seed: int, run: Run) -> tuple[int, int]:
    held, n = held_share(run.graded)
    cpu = statistics.median(run.cpu) if run.cpu else 0.0
    print(f"  {name} seed {seed}: predictions held {held} of {n} windows ({held / max(1, n):.0%}); "
          f"median point errors: {errors(run.graded)}; {len(run.skipped)} not graded "
          f"({run.skipped[0][1] if run.skipped else '-'}); a graded window's CPU {cpu:.2f} s")  # fmt: skip
    for t, g in run.graded:
        missed = [f"{f.key} {f.observed * 1000:.1f} ms, predicted {f.predicted * 1000:.1f} "
                  f"({f.lo_edge * 1000:.1f}-{f.hi_edge * 1000:.1f})" for f in g.figures if not f.held]  # fmt: skip
        if missed:
            print(f"    missed at {t / 60:.0f} min: {'; '.join(missed)}")
    return held, n


def swing(seed: int, smoke: bool) -> list[str]:
    learner = HeadroomLearner(tuple(parse_sla(hb.SLA)))
    run = Run()
    serve(learner, hb.server("a100-80gb", seed, hb.workload()), 0.0, 480.0 if smoke else RUN_S, run, seed)
    held, n = report("swing", seed, run)
    if smoke:
        return []
    missed = []
    if n < TARGET_WINDOWS:
        missed.append(f"swing seed {seed}: {n} windows graded (target {TARGET_WINDOWS})")
    if held < TARGET_HELD * n:
        missed.append(f"swing seed {seed}: held {held} of {n} (target {TARGET_HELD:.0%})")
    return missed


def changed(case: str, seed: int) -> list[str]:
    """The server changed at :data:`CHANGE_S`: throttled in place, or restarted with half its seats
    or as an L40S; flagged, re-learned, and the estimate at the end beside the knee measured on the
    changed server."""
    work = hb.workload()
    learner = HeadroomLearner(tuple(parse_sla(hb.SLA)))
    run = Run()
    first = hb.server("a100-80gb", seed, work, record=True)
    serve(learner, first, 0.0, CHANGE_S, run, seed)
    make: Callable[[], VirtualServer]
    gpu = "l40s" if case == "slower" else "a100-80gb"
    if case == "throttle":  # the same server, its clock and counters going on
        then, offset = throttle(first), 0.0
        make = lambda: throttle(hb.server(gpu, seed + 7919, work))  # noqa: E731
    else:  # restarted: a server of its own, its clock from 0
        hb.CASE["seats"] = hb.SEATS // 2 if case == "seats" else hb.SEATS
        then, offset = hb.server(gpu, seed + 1, work, record=True), CHANGE_S
        make = lambda: hb.server(gpu, seed + 7919, work)  # noqa: E731
    try:
        serve(learner, then, offset, RUN_S - CHANGE_S, run, seed)
        report(case, seed, run)
        after = [(t, g) for t, g in run.graded if run.relearned_at is not None and t >= run.relearned_at]
        flag_w = math.inf if run.flagged_at is None else math.ceil((run.flagged_at - CHANGE_S) / 60.0 - 1e-9)
        relearn = "never" if run.relearned_at is None else f"{(run.relearned_at - CHANGE_S) / 60:.0f} min after it"
        held_after, n_after = held_share(after)
        print(f"    the change: flagged {flag_w} window(s) after it ({learner.relearning[1] if learner.relearning else 'its counters went back'}); "
              f"predictions graded again {relearn}; held since: {held_after} of {n_after}")  # fmt: skip
        c = time.process_time()
        h = learner.estimate(seed=seed)
        cost = time.process_time() - c
        # the requests the changed server was sent (the throttled one's since the change), those
        # before the headroom's window warming the server the knee is measured on
        since = RUN_S - offset - (h.traffic.seconds if h.traffic is not None else 0.0)
        sent = [r for r in (then.sent or []) if r.at >= CHANGE_S - offset]
        knee = hb.users_knee(gpu, seed, sent, since, make)
        inside, err = hb.judged(h, knee)
        print(f"    at {RUN_S / 60:.0f} min: {h.line()}")
        print(f"    measured knee on the changed server x{knee:.3g}; inside: {inside}; error {err:.0f} %; "
              f"the estimate's CPU {cost:.1f} s")  # fmt: skip
    finally:
        hb.CASE["seats"] = hb.SEATS
    missed = []
    if flag_w > TARGET_FLAGGED:
        missed.append(f"{case} seed {seed}: flagged {flag_w} windows after the change (target {TARGET_FLAGGED})")
    if not inside:
        missed.append(f"{case} seed {seed}: the interval does not hold the knee x{knee:.3g}")
    return missed


def real(minutes: float, base: float) -> int:
    """The ledger over ``minutes`` of the real vLLM CPU server (module docstring)."""
    import json
    import os
    import subprocess
    import tempfile

    import httpx
    from realengine import NOT_SET_UP, ready, vllm_server

    from spoc_tui.procs.ports import free_ports

    if not ready():
        print(NOT_SET_UP, file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="ledger-real-"))
    (port,) = free_ports(1)
    server = vllm_server(work / "vllm.log", port, "--max-num-seqs", str(hb.REAL_SEATS), core=0, guard=True)
    server.start(timeout=300)
    os.sched_setaffinity(0, {1})
    url = f"http://127.0.0.1:{port}"
    seconds = minutes * 60.0
    spoc = ["taskset", "-c", "1", sys.executable, "-m", "spoc_tui.cli"]
    try:
        trace = hb.real_trace(work / "traffic.jsonl", base, seconds + 60.0, 1)
        drift = [hb.reference(url)]
        load = subprocess.Popen(
            [*spoc, "ramp", "--url", url, "--trace", str(trace), "--speed", "1", "--step-seconds", str(seconds),
             "--warmup-seconds", "10", "--sla", hb.REAL_SLA, "--out", str(work / "load")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        t0 = time.monotonic()
        halfway = False
        with httpx.Client(timeout=5.0) as client, (work / "scrapes.jsonl").open("w") as kept:
            while load.poll() is None:
                t = time.monotonic() - t0
                try:
                    kept.write(json.dumps({"t": round(t, 3), "text": client.get(f"{url}/metrics").text}) + "\n")
                except httpx.TransportError:
                    pass  # uvicorn closes a connection idle 5 s: the next scrape takes a new one
                if not halfway and t >= seconds / 2:
                    halfway = True
                    drift.append(hb.reference(url))
                time.sleep(max(0.0, 5.0 - (time.monotonic() - t0 - t)))
        drift.append(hb.reference(url))
        if load.returncode not in (0, 1):
            print(f"spoc ramp --speed 1 failed:\n{(load.stderr.read() if load.stderr else '')[-2000:]}")
            return 1
        # the operator's twin.json, as `spoc monitor --twin` takes it: on this host the tiny model's
        # batch stays small, and the windows alone never said the step time (0 of 21 graded)
        cal = hb.calibrate(spoc, url, work / "twin.json")
        drift.append(hb.reference(url))
        if cal.returncode:
            print(f"spoc twin calibrate failed (the ledger graded without a prior):\n{cal.stderr[-2000:]}")
        (work / "drift.json").write_text(json.dumps(drift))
    finally:
        server.stop()
    return again(work, minutes)


def again(work: Path, minutes: float | None = None) -> int:
    """A real run's kept scrapes (``work/scrapes.jsonl``) read again in order by a fresh learner
    that grades each minute as it closes, with the run's calibrated twin (``work/twin.json``) as its
    prior where there is one, and without: what a change to the ledger does to the same inputs."""
    import json

    from spoc_tui.twin.model import TwinError, read_twin

    kept = work / "scrapes.jsonl"
    if not kept.exists():
        print(f"--again: {kept}: no such file (a run of --real keeps its scrapes there)", file=sys.stderr)
        return 2
    rows = hb.kept_scrapes(kept)
    if isinstance(rows, str):
        print(f"--again: {rows}", file=sys.stderr)
        return 2
    minutes = minutes if minutes is not None else (rows[-1][0] - rows[0][0]) / 60.0 if rows else 0.0
    twin = work / "twin.json"
    try:
        priors = [("windows alone", None)] + (
            [("calibrated twin as the prior", read_twin(twin))] if twin.exists() else []
        )
    except TwinError as e:
        print(f"--again: {twin}: {e}", file=sys.stderr)
        return 2
    print(f"the headroom's ledger on the real vLLM CPU server ({minutes:.0f} min, SLA {hb.REAL_SLA}), from {work}:")
    for name, prior in priors:
        learner = HeadroomLearner(tuple(parse_sla(hb.REAL_SLA)), max_model_len=2048, prior=prior)
        run = Run()
        for t, exp in rows:
            learner.add(t, exp)
            grade_newest(learner, run, int(t))
        report(f"real vLLM CPU, {name},", 1, run)
        print(f"    {learner.ledger_summary().line()}; re-learning: {learner.relearning}")
    if (work / "drift.json").exists():
        drift = json.loads((work / "drift.json").read_text())
        print(f"  the host's drift (one request's decode gap, {drift[0] * 1e3:.2f} ms before): "
              f"{', '.join(f'{100 * (d / drift[0] - 1):+.0f} %' for d in drift[1:])} halfway, after the load "
              "and after the calibration")  # fmt: skip
    return 0


def main() -> int:
    again_dir = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--again=")), None)
    if again_dir is not None:
        return again(Path(again_dir))
    if "--real" in sys.argv:
        minutes = next((float(a.split("=")[1]) for a in sys.argv if a.startswith("--minutes=")), 20.0)
        return real(minutes, next((float(a.split("=")[1]) for a in sys.argv if a.startswith("--base=")), 5.0))
    smoke = "--smoke" in sys.argv
    seeds = next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--seeds=")), 1)
    cases = next((a.split("=")[1].split(",") for a in sys.argv if a.startswith("--cases=")),
                 ["swing", "throttle", "seats", "slower"])  # fmt: skip
    t0 = time.process_time()
    print(f"the headroom's ledger on the simulated A100 (48 seats, untold), traffic x0.5-x2 of {MEAN}/s; "
          f"SLA {hb.SLA}")  # fmt: skip
    missed: list[str] = []
    for seed in range(1, (1 if smoke else seeds) + 1):
        if "swing" in cases:
            missed += swing(seed, smoke)
        if smoke:
            continue
        for case in ("throttle", "seats", "slower"):
            if case in cases:
                missed += changed(case, seed)
    print(f"({time.process_time() - t0:.0f} s of CPU)")
    if smoke:
        return 0
    if missed:
        print("targets missed:\n  " + "\n  ".join(missed))
        return 1
    print("targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
