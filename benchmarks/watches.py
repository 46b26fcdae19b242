"""One server, one load, two watches (issue 76): does the headroom agree with itself?

``make demo``'s server and load, in simulated time: the simulated H100 (Llama-3.1-8B, vLLM's 256
seats, untold) under its 48 background chatbot users. Two watches read it in the same run, as
the two ways spoc watches a server do: the monitor (a scrape every second; its estimate replays
60 s of traffic at x1, 4 draws: ``twin.live.LiveHeadroom``'s) and ``spoc inspect --headroom`` (a
scrape every 5 s; 120 s, 4 draws), each after 5 and after 10 minutes. On 2026-12-06 the monitor
said x4.9 (95 %: 3.2-6.9) after 9 minutes and a 300 s inspect x1.44 (95 %: 1.31-1.58): disjoint.

The truth: the users' knee measured on a fresh server of the same preset (ten minutes at each
multiple of the 48 users, the worse of TTFT p99 and ITL p99 over its limit crossing 1; doubling,
then bisecting to 3 %), and the requests a second those users sent against the 48's: the
headroom's own unit (a closed loop's users slow as the server does, so x users is less than x of
the requests).

Printed: each watch's line, whether each pair of intervals overlaps, and whether each holds the
knee in requests a second. Targets: every pair agrees (the intervals overlap) and every interval
holds the knee; the full run exits 1 where one is missed.

Usage: python benchmarks/watches.py [--seed=N]; ``--smoke``: one watch of 5 minutes, no truth.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import headroom as hb  # noqa: E402

from spoc_tui.core.ramp.sla import DEFAULT_SLA, parse_sla  # noqa: E402
from spoc_tui.sim.options import SimOptions  # noqa: E402
from spoc_tui.sim.run import build  # noqa: E402
from spoc_tui.sim.virtual import VirtualServer  # noqa: E402
from spoc_tui.sim.watch import VirtualWatch  # noqa: E402
from spoc_tui.twin.headroom import Headroom, HeadroomLearner  # noqa: E402
from spoc_tui.twin.live import LIVE_DRAWS, LIVE_REPLAY_S  # noqa: E402
from spoc_tui.twin.traffic import REPLAY_S  # noqa: E402
from spoc_tui.workload import load_workload  # noqa: E402

USERS = 48
"""``make demo``'s background users (``spoc demo``: ``spoc sim --load-users 48``)."""
TRUTH_S = 600.0
WATCHES = {"monitor": (1.0, LIVE_REPLAY_S), "inspect": (5.0, REPLAY_S)}
"""Each watch: seconds between its scrapes, and the traffic its estimate replays at x1."""


def demo_server(seed: int, users: int) -> VirtualServer:
    engine, _ = build(SimOptions(dcgm_port=None, seed=seed))  # spoc sim's defaults: the H100, 256 seats
    vs = VirtualServer(engine, load_workload("chatbot"), 0, seed=seed)
    vs.set_users(users)
    return vs


def watched(seed: int, minutes: list[float], smoke: bool) -> dict[tuple[str, float], Headroom]:
    """Both watches of one run of the server, each estimate at each of ``minutes``."""
    limits = tuple(parse_sla(DEFAULT_SLA))
    vs = demo_server(seed, USERS)
    watch = VirtualWatch([vs], window_s=60.0, interval_s=1.0)
    # (the smoke tells the seats: one search where untold is two; that it runs is its subject)
    learners = {
        name: HeadroomLearner(limits, seats=256 if smoke else None) for name in (("monitor",) if smoke else WATCHES)
    }
    last = dict.fromkeys(learners, -math.inf)
    out: dict[tuple[str, float], Headroom] = {}
    for _ in watch.run(max(minutes) * 60.0):
        for name, learner in learners.items():
            every = WATCHES[name][0]
            if watch.now - last[name] >= every - 1e-6:
                last[name] = watch.now
                learner.add(watch.now, watch.expositions[0])
        for m in minutes:
            if abs(watch.now - m * 60.0) < 0.5:
                for name, learner in learners.items():
                    c = time.process_time()
                    h = learner.estimate(seed=seed, draws=0 if smoke else LIVE_DRAWS,
                                         replay_s=20.0 if smoke else WATCHES[name][1])  # fmt: skip
                    out[(name, m)] = h
                    print(f"  {name}, {m:.0f} min: {h.line()} ({time.process_time() - c:.1f} s of CPU)", flush=True)
    return out


def truth(seed: int) -> tuple[float, float]:
    """The users' knee (a multiple of the 48), and the requests a second it sent over the 48's."""

    def at(k: float) -> tuple[float, float]:
        vs = demo_server(seed + 7919, max(1, round(USERS * k)))
        vs.advance(TRUTH_S)
        window = vs.window(60.0, TRUTH_S)
        return hb.worst_of(window, TRUTH_S - 60.0), len(window) / (TRUTH_S - 60.0)

    seen: dict[float, tuple[float, float]] = {}

    def ratio(k: float) -> float:
        seen[k] = seen.get(k) or at(k)
        return seen[k][0]

    knee = hb.knee_of(ratio)
    base = seen.get(1.0) or at(1.0)
    return knee, (at(knee)[1] / base[1] if math.isfinite(knee) else math.inf)


def overlap(a: Headroom, b: Headroom) -> bool:
    (alo, ahi), (blo, bhi) = a.ci95, b.ci95
    if not (a.identified and b.identified):
        return False
    return (alo or 0.0) <= (bhi if bhi is not None else math.inf) and (blo or 0.0) <= (
        ahi if ahi is not None else math.inf
    )


def main() -> int:
    smoke = "--smoke" in sys.argv
    seed = next((int(a.split("=")[1]) for a in sys.argv if a.startswith("--seed=")), 1)
    t0 = time.process_time()
    print(f"one server, two watches: the simulated H100 under {USERS} chatbot users (make demo's), SLA {DEFAULT_SLA}")
    found = watched(seed, [5.0] if smoke else [5.0, 10.0], smoke)
    if smoke:
        return 0
    users, rate = truth(seed)
    print(f"  measured knee: x{users:.3g} of the users, who sent x{rate:.3g} of the requests a second")
    missed = []
    keys = sorted(found)
    for i, a in enumerate(keys):
        held = hb.judged(found[a], rate)[0]
        print(f"  {a[0]} at {a[1]:.0f} min holds the knee: {held}")
        if not held:
            missed.append(f"{a[0]} at {a[1]:.0f} min: its interval does not hold x{rate:.3g}")
        for b in keys[i + 1 :]:
            agree = overlap(found[a], found[b])
            print(f"    beside {b[0]} at {b[1]:.0f} min: intervals overlap: {agree}")
            if not agree:
                missed.append(f"{a[0]} at {a[1]:.0f} min and {b[0]} at {b[1]:.0f} min disagree")
    print(f"({time.process_time() - t0:.0f} s of CPU)")
    if missed:
        print("targets missed:\n  " + "\n  ".join(missed))
        return 1
    print("targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
