"""Live headroom against the knee measured on the same server, in simulated time (issue 52).

For each GPU preset and seed, the simulator (``max-num-seqs`` 48, which the monitor is not told)
serves ten minutes of open-loop traffic whose rate wanders between 35 % and 100 % of a base rate
(a five-minute swell: the windows must differ for the passive fit to identify the step time).
The monitor's passive learner (``spoc_tui.twin.headroom``) reads the simulator's ``/metrics``
every 5 s as ``spoc monitor`` would (``spoc_tui.sim.watch``) and then says its headroom: the
speed multiple of that traffic where the first SLA limit breaks, with its 95 % interval.

The truth is measured on the simulator itself, not on any twin: the same traffic process at s
times its rate, ten minutes on a fresh server for each s tried (doubling from x1, then bisecting
to 3 %), its whole window's TTFT p99 and ITL p99 judged against the SLA; the knee is where the
worse of the two ratios (figure over limit) crosses 1, interpolated between the last speed within
and the first past it.

Printed per case and seed: the headroom, its interval, the measured knee, whether the interval
holds it and the point's error; then per preset the share held and the median error (targets:
the knee inside the interval, the point within 15 %). Then the flat case (a constant rate): the
learner must say it cannot identify the step time yet, or give an interval that holds the knee.

Usage: python benchmarks/headroom.py [--seeds N] (make bench: 5 seeds, two presets);
``--smoke``: one preset, one seed, a shorter observation (checks that it runs).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spoc_tui.core.ramp.sla import parse_sla  # noqa: E402
from spoc_tui.core.ramp.steps import summarize_step  # noqa: E402
from spoc_tui.sim.options import SimOptions  # noqa: E402
from spoc_tui.sim.run import build  # noqa: E402
from spoc_tui.sim.virtual import VirtualServer  # noqa: E402
from spoc_tui.sim.watch import VirtualWatch  # noqa: E402
from spoc_tui.twin.headroom import HeadroomLearner  # noqa: E402
from spoc_tui.twin.predict import figure  # noqa: E402
from spoc_tui.workload import Workload, load_workload  # noqa: E402

SLA = "ttft_p99<=2s,itl_p99<=100ms"
SEATS = 48
PRESETS = {"a100-80gb": 2.0, "l40s": 1.0}
"""GPU preset -> base rate (requests/s) of the observed traffic."""
OBSERVE_S = 600.0
TRUTH_S = 600.0
PROFILE = """
name = "headroom"
system_tokens = 300
turns = {dist = "uniform", min = 1, max = 3}
user_tokens = {dist = "lognormal", median = 300, sigma = 0.8, max = 3000}
output_tokens = {dist = "lognormal", median = 150, sigma = 0.6, max = 1000}
think_s = 0
"""


def workload() -> Workload:
    path = Path(__file__).with_name(".headroom_profile.toml")
    path.write_text(PROFILE)
    try:
        return load_workload(str(path))
    finally:
        path.unlink()


def server(gpu: str, seed: int, work: Workload) -> VirtualServer:
    engine, _ = build(SimOptions(gpu=gpu, max_num_seqs=SEATS, dcgm_port=None, seed=seed))
    return VirtualServer(engine, work, 0, seed=seed)


def swell(base: float, flat: bool) -> Callable[[float], float]:
    if flat:
        return lambda t: base
    return lambda t: base * (0.35 + 0.65 * (0.5 + 0.5 * math.sin(2 * math.pi * t / 300.0)))


def drive(vs: VirtualServer, rate: Callable[[float], float], seconds: float, every: float = 10.0) -> None:
    """The rate set every ``every`` seconds as the process says (no scrape)."""
    t = vs.now
    while t < seconds - 1e-9:
        vs.set_rate(rate(t))
        t = min(seconds, t + every)
        vs.advance(t)


def observe(gpu: str, seed: int, base: float, flat: bool, seconds: float, work: Workload) -> HeadroomLearner:
    vs = server(gpu, seed, work)
    watch = VirtualWatch([vs], window_s=60.0, interval_s=5.0)
    learner = HeadroomLearner(tuple(parse_sla(SLA)))
    rate = swell(base, flat)
    for _ in watch.run(seconds, before=lambda t: vs.set_rate(rate(t)) if round(t) % 10 == 0 else None):
        learner.add(watch.now, watch.expositions[0])
    return learner


def worst_ratio(gpu: str, seed: int, base: float, flat: bool, speed: float, work: Workload) -> float:
    """The traffic at ``speed`` times its rate on a fresh server: the worse of TTFT p99 and ITL
    p99 over their limits, over the window after the first minute."""
    vs = server(gpu, seed + 7919, work)
    rate = swell(base, flat)
    drive(vs, lambda t: speed * rate(t), TRUTH_S)
    window = vs.window(60.0, TRUTH_S)
    limits = tuple(parse_sla(SLA))
    step = summarize_step(1, 1, window, TRUTH_S - 60.0, limits, open_loop=True)
    ratios = []
    for lim in limits:
        v = figure(step, lim.metric, lim.stat)
        # a server that did not finish what it was sent is past its knee
        ratios.append(math.inf if v is None else v / lim.value)
    sent = sum(1 for s in vs.samples if s.start >= 60.0)
    done = len(window)
    if sent and done < 0.9 * sent:
        return math.inf
    return max(ratios)


def measured_knee(gpu: str, seed: int, base: float, flat: bool, work: Workload) -> float:
    lo, hi = None, None
    s = 1.0
    while s <= 64:
        if worst_ratio(gpu, seed, base, flat, s, work) <= 1.0:
            lo = s
            s *= 2
        else:
            hi = s
            break
    if hi is None:
        return math.inf
    if lo is None:
        lo = hi / 2
        while lo > 1 / 64 and worst_ratio(gpu, seed, base, flat, lo, work) > 1.0:
            hi, lo = lo, lo / 2
    while hi / lo > 1.03:
        mid = math.sqrt(lo * hi)
        if worst_ratio(gpu, seed, base, flat, mid, work) <= 1.0:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def main() -> int:
    smoke = "--smoke" in sys.argv
    seeds = 1 if smoke else next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--seeds=")), 5)
    presets = dict(list(PRESETS.items())[:1]) if smoke else PRESETS
    observe_s = 330.0 if smoke else OBSERVE_S
    work = workload()
    print(f"live headroom vs the measured knee: SLA {SLA}, max-num-seqs {SEATS} (not told), {observe_s:.0f} s observed")
    summary: dict[str, list[tuple[bool, float]]] = {}
    for gpu, base in presets.items():
        for seed in range(1, seeds + 1):
            t0 = time.process_time()
            learner = observe(gpu, seed, base, False, observe_s, work)
            fed = time.process_time() - t0
            t0 = time.process_time()
            h = learner.estimate(seed=seed, draws=1 if smoke else 4, replay_s=30.0 if smoke else 120.0)
            cost = time.process_time() - t0
            truth = measured_knee(gpu, seed, base, False, work) if not smoke else math.nan
            lo, hi = h.ci95
            inside = h.identified and (lo is None or lo <= truth) and (hi is None or truth <= hi)
            err = abs(h.estimate - truth) / truth * 100 if h.estimate and truth and math.isfinite(truth) else math.nan
            summary.setdefault(gpu, []).append((inside, err))
            print(f"  {gpu} seed {seed}: {h.line()}")
            print(f"    measured knee x{truth:.3g}; inside: {inside}; error {err:.0f} %; seats seen {learner.seats}; "
                  f"CPU: {fed:.1f} s to read {observe_s:.0f} s of scrapes, {cost:.1f} s for the headroom")  # fmt: skip
    if not smoke:
        for gpu, rows in summary.items():
            held = sum(1 for ok, _ in rows if ok)
            errs = [e for _, e in rows if math.isfinite(e)]
            med = statistics.median(errs) if errs else math.nan
            print(f"{gpu}: interval holds the measured knee {held}/{len(rows)}; median point error {med:.0f} %")
        gpu, base = next(iter(PRESETS.items()))
        learner = observe(gpu, 1, base, True, OBSERVE_S, work)
        h = learner.estimate(seed=1)
        truth = measured_knee(gpu, 1, base, True, work)
        print(f"flat traffic ({gpu}): {h.line()}; measured knee x{truth:.3g}")
    return 0


if __name__ == "__main__":
    from spoc_tui.procs.supervise import supervise

    supervise()
    sys.exit(main())
