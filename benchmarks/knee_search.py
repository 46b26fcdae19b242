"""The knee search against the truth, on the simulator in simulated time (make bench; smoke:
python benchmarks/knee_search.py --smoke).

For each case (a workload profile and a TTFT limit at p50, p90 or p99) and each seed, the ramp
is replayed exactly as ``spoc ramp`` runs it, in simulated time (spoc_tui.sim.virtual: the
simulator's engine, closed-loop users of the profile, users added between steps on the same
warm server, 40 s steps with a 10 s warm-up):

- **inference** (``--users auto:256``, today): the knee inferred across steps with its 95 %
  interval, the next level chosen inside it, an inconclusive step measured on (to 160 s) only
  near a limit, stopping at a 5 % interval, adjacent counts, or the 10-minute budget;
- **bisection** (the search before it): double until a step does not meet the SLA, then bisect
  between counts, an inconclusive step measured on to 160 s whatever its figures.

The truth comes from long reference runs at every user count of the case's range: four
independent seeds of 1,500 s each (after a 120 s warm-up), their requests pooled, so a count's
p99 rests on about 8,000 requests rather than one run's 2,000 (one seed a count put the coding
p99 curve at 0.47, 0.62, 0.68, 0.53 s for 27-30 users: its own noise was a user or two of the
knee). The pooled curve is fitted non-decreasing over the counts (steady-state latency does not
fall as users are added), and the true knee is where that fit crosses the limit (interpolated on
the log of the figure between the last count within it and the next). Reported per case: how often each
search's interval holds the truth (inference: its ci95, a one-sided bound counted on its side;
bisection: the bracket from the last count that met to the first that did not), and the median
load-minutes to the answer. The reference curves are cached in knee_truth.json beside this file
with a fingerprint of the simulator's and the workloads' sources and of the reference settings;
a cache from another simulator is recomputed (--fresh recomputes it anyway).

Then (b), the coverage of one step's own 95 % intervals (--only=a or --only=b runs one part):
for 8, 20 and 24 users of the chat profile, the true TTFT p50/p90/p99, ITL p50/p90/p99, output
tokens/s and requests/s from a 3,000 s run; then 100 independent steps (50 s measured after a
30 s warm-up: multi-turn conversations take about that long to reach their steady mix), and the
share of their intervals that hold the truth (target 93-97 %).
"""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spoc_tui.core.hardware.presets import gpu_preset, model_preset  # noqa: E402
from spoc_tui.core.ramp.experiment import Driver, Experiment, run_now  # noqa: E402
from spoc_tui.core.ramp.inference import isotonic  # noqa: E402
from spoc_tui.core.ramp.knee import (  # noqa: E402
    BisectSearch,
    Knee,
    KneeSearch,
)
from spoc_tui.core.ramp.rules import StepRules  # noqa: E402
from spoc_tui.core.ramp.sla import Limit, parse_sla  # noqa: E402
from spoc_tui.core.ramp.steps import RequestSample, StepSummary, summarize_step  # noqa: E402
from spoc_tui.sim.backend import VirtualBackend  # noqa: E402
from spoc_tui.sim.engine import EngineConfig, SimEngine  # noqa: E402
from spoc_tui.sim.virtual import VirtualServer  # noqa: E402
from spoc_tui.workload import Workload, load_workload  # noqa: E402

SMOKE = "--smoke" in sys.argv
SEEDS = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--seeds=")), "1" if SMOKE else "20"))
FRESH = "--fresh" in sys.argv
SETTLE = "--no-settle" not in sys.argv
"""A knee search's step ends once its next level is plain, as spoc ramp's does (``--no-settle``:
every step runs its window, the search before that rule)."""
ONLY = next((a.split("=")[1] for a in sys.argv if a.startswith("--only=")), "ab")
COVERAGE_STEPS = 2 if SMOKE else 100
COVERAGE_USERS = (8,) if SMOKE else (8, 20, 24)
COVERAGE_WARMUP_S, COVERAGE_S = 30.0, 50.0
TRUTH_FILE = Path(__file__).with_name("knee_truth.json")
STEP_S, WARMUP_S, MAX_STEP_S, BUDGET_S = 40.0, 10.0, 160.0, 600.0
TRUTH_WARMUP_S, TRUTH_S, TRUTH_SEEDS = 120.0, 1500.0, 4

CHAT = """
name = "chat"
system_tokens = 300
turns = 3
user_tokens = {dist = "uniform", min = 50, max = 400}
output_tokens = {dist = "uniform", min = 50, max = 250}
think_s = {dist = "uniform", min = 0.5, max = 2.0}
"""


@dataclass(frozen=True)
class Case:
    profile: str
    sla: str
    levels: tuple[int, int]
    """The user counts the reference runs cover (the truth lies inside)."""


CASES = [
    Case("chat", "ttft_p50<=100ms", (16, 32)),
    Case("chat", "ttft_p90<=200ms", (16, 32)),
    Case("chat", "ttft_p99<=300ms", (14, 28)),
    Case("coding", "ttft_p50<=100ms", (20, 40)),
    Case("coding", "ttft_p90<=300ms", (20, 40)),
    Case("coding", "ttft_p99<=500ms", (20, 40)),
    Case("logs", "ttft_p50<=500ms", (1, 16)),
    Case("logs", "ttft_p90<=3s", (1, 16)),
    Case("logs", "ttft_p99<=6s", (1, 16)),
]
if SMOKE:  # one case, short runs: that the script runs, not its figures
    CASES = [Case("chat", "ttft_p90<=200ms", (20, 22))]
    TRUTH_S, BUDGET_S, TRUTH_SEEDS = 100.0, 150.0, 1


def workload(name: str) -> Workload:
    if name != "chat":
        return load_workload(name)
    path = Path(tempfile.gettempdir()) / f"spoc-bench-chat-{os.getpid()}.toml"
    path.write_text(CHAT)
    try:
        return load_workload(str(path))
    finally:
        path.unlink()


def engine(seed: int) -> SimEngine:
    """The simulated Llama-3.1-8B on one A100-40GB, 16 seats (max-num-seqs)."""
    cfg = EngineConfig(
        model=model_preset("llama-3.1-8b"),
        gpu=gpu_preset("a100-40gb"),
        served_model_name="bench",
        max_num_seqs=16,
        seed=seed,
    )
    return SimEngine(cfg)


def reference(args: tuple[str, int, int]) -> tuple[str, int, list[float]]:
    """The TTFTs of one long run at ``users`` (seed ``k`` of the count)."""
    name, users, k = args
    seed = 90_000 + users + 1_000 * k
    vs = VirtualServer(engine(seed), workload(name), users, seed=seed)
    vs.advance(TRUTH_WARMUP_S + TRUTH_S)
    window = vs.window(TRUTH_WARMUP_S, TRUTH_WARMUP_S + TRUTH_S)
    return name, users, [float(s.ttft) for s in window if s.ok and s.ttft is not None]


def fingerprint() -> str:
    """What the reference curves depend on: the simulator's and the workloads' sources, the chat
    profile and the reference settings. A cache with another fingerprint is stale."""
    h = hashlib.sha256()
    for path in sorted(
        [
            *(p for p in (ROOT / "spoc_tui" / "sim").glob("*.py") if p.name != "backend.py"),  # the searches' only
            *(ROOT / "spoc_tui" / "workload" / "profiles").glob("*"),
        ]
    ):
        h.update(path.name.encode() + path.read_bytes())
    for mod in ("workload/__init__.py", "core/hardware/presets.py"):
        h.update((ROOT / "spoc_tui" / mod).read_bytes())
    h.update(f"{CHAT}|{TRUTH_WARMUP_S}|{TRUTH_S}|{TRUTH_SEEDS}".encode())
    return h.hexdigest()[:16]


def true_knee(curve: dict[int, list[float]], lim: Limit) -> float:
    """Where the reference curve, fitted non-decreasing over the counts, crosses the limit
    (log-interpolated between counts)."""
    col = {"p50": 0, "p90": 1, "p99": 2}[lim.stat]
    xs = sorted(curve)
    fit = [math.exp(m) for m in isotonic([math.log(curve[x][col]) for x in xs], [1.0] * len(xs))]
    for (a, fa), (b, fb) in zip(zip(xs, fit, strict=True), zip(xs[1:], fit[1:], strict=True), strict=True):
        if fa <= lim.value < fb:
            t = (math.log(lim.value) - math.log(fa)) / (math.log(fb) - math.log(fa))
            return a + t * (b - a)
    raise SystemExit(f"the reference range {xs[0]}-{xs[-1]} does not hold the knee of {lim}: widen it")


def replay(
    plan: Any, name: str, limits: tuple[Limit, ...], seed: int, budget: float | None
) -> tuple[Knee, float, list[StepSummary]]:
    """The ramp as spoc ramp runs it (the experiment driver's own loop), in simulated time: (the
    knee, load-minutes, the steps)."""
    vs = VirtualServer(engine(seed), workload(name), 0, seed=seed, spread_s=WARMUP_S / 2)
    exp = Experiment(
        plan=plan,
        limits=limits,
        unit="users",
        rules=StepRules(step_s=STEP_S, warmup_s=WARMUP_S, max_step_s=MAX_STEP_S, budget_s=budget, seed=seed),
        settle=SETTLE,
    )
    backend = VirtualBackend(vs)
    driver = Driver(exp, backend, knee_each_step=False)
    run_now(driver.run())
    return driver.knee(), backend.now() / 60, driver.steps


def search_case(args: tuple[int, int]) -> dict[str, Any]:
    ci, seed = args
    case = CASES[ci]
    limits = parse_sla(case.sla)
    new, new_min, new_steps = replay(KneeSearch(max_users=256), case.profile, limits, seed, BUDGET_S)
    old, old_min, old_steps = replay(BisectSearch(max_users=256), case.profile, limits, seed, None)
    inf = new.inferred
    assert inf is not None
    # the bisection's answer: the bracket from the last count that met the SLA to the first that
    # did not (broke, or stayed inconclusive); no count met it: no answer
    not_met = min((s.users for s in old_steps if s.decision != "meets"), default=None)
    old_answer = (old.meets_level, not_met) if old.meets_level is not None else None
    return {
        "case": ci,
        "seed": seed,
        "new": (inf.ci95, inf.estimate, inf.boundary, new_min, len(new_steps)),
        "settled": (
            sum(1 for s in new_steps if s.settled_early),
            sum(s.settled_early.saved_s for s in new_steps if s.settled_early),
        ),
        "old": (old_answer, old_min, len(old_steps)),
    }


def steady(users: int, seed: int, warmup: float, seconds: float) -> list[RequestSample]:
    vs = VirtualServer(engine(seed), workload("chat"), users, seed=seed, spread_s=1.0)
    vs.advance(warmup + seconds)
    return vs.window(warmup, warmup + seconds)


def coverage_step(args: tuple[int, int]) -> tuple[int, StepSummary]:
    users, seed = args
    window = steady(users, seed, COVERAGE_WARMUP_S, COVERAGE_S)
    return users, summarize_step(1, users, window, COVERAGE_S, parse_sla("ttft_p90<=200ms"))


def coverage_truth(users: int) -> dict[tuple[str, str], float]:
    span = 150.0 if SMOKE else 3000.0
    long = steady(users, 77_000 + users, 60.0, span)
    ok = [s for s in long if s.ok]
    ttft = [s.ttft for s in ok if s.ttft is not None]
    itl = [g for s in ok for g in s.itl]
    out = {(m, f"p{q}"): float(np.percentile(v, q)) for m, v in (("ttft", ttft), ("itl", itl)) for q in (50, 90, 99)}
    out[("rate", "output_tokens_per_s")] = sum(s.output_tokens or 0 for s in ok) / span
    out[("rate", "request_rate")] = len(long) / span
    return out


def coverage_part(pool: Any) -> None:
    print(
        f"(b) coverage of one step's 95 % intervals, {COVERAGE_STEPS} steps of {COVERAGE_S:.0f} s "
        f"(after a {COVERAGE_WARMUP_S:.0f} s warm-up) per load, chat profile"
    )
    for users in COVERAGE_USERS:
        truth = coverage_truth(users)
        jobs = [(users, 500_000 + users * 1000 + i) for i in range(COVERAGE_STEPS)]
        hits: dict[tuple[str, str], list[bool]] = {key: [] for key in truth}
        for _, step in pool.imap_unordered(coverage_step, jobs):
            for (metric, stat), value in truth.items():
                if metric == "rate":
                    lo, hi = getattr(step.ci95, stat)
                else:
                    lo, hi = step.latency.of(metric).interval(stat)
                if lo is None or hi is None:
                    continue  # an interval the sample cannot close is not claimed
                hits[(metric, stat)].append(lo <= value <= hi)
        row = ", ".join(
            f"{m} {st}: {100 * sum(h) / len(h):.0f}% of {len(h)}" if h else f"{m} {st}: never bounded"
            for (m, st), h in hits.items()
        )
        print(f"    {users} users: {row}")


def holds(interval: tuple[float | None, float | None] | None, k: float) -> bool:
    """The interval holds the truth (an answer of None, or a bound with no end, holds nothing)."""
    if interval is None or interval == (None, None):
        return False
    lo, hi = interval
    return (lo is None or lo <= k) and (hi is None or k <= hi)


class Workers:
    """Two processes that fail loudly: a process that dies (the out-of-memory killer on a shared host)
    raises BrokenProcessPool, where multiprocessing.Pool waits for its results for ever."""

    def __init__(self, ex: ProcessPoolExecutor) -> None:
        self.ex = ex

    def imap_unordered(self, fn: Any, jobs: list[Any]) -> Any:
        return self.ex.map(fn, jobs)


def main() -> None:
    try:
        with ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as ex:
            pool = Workers(ex)
            if "a" in ONLY:
                knee_part(pool)
            if "b" in ONLY:
                coverage_part(pool)
    except BrokenProcessPool as e:
        raise SystemExit(f"knee_search: a worker process died ({e}): rerun on a host with memory to spare") from None


def knee_part(pool: Any) -> None:
    t0 = time.time()
    stored = json.loads(TRUTH_FILE.read_text()) if TRUTH_FILE.exists() and not FRESH and not SMOKE else {}
    fp = fingerprint()
    if stored and stored.get("fingerprint") != fp:
        print("knee_truth.json is from another simulator or settings: recomputing it", file=sys.stderr)
        stored = {}
    curves: dict[str, dict[int, list[float]]] = {
        n: {int(u): v for u, v in d.items()} for n, d in stored.get("curves", {}).items()
    }
    need = sorted({(c.profile, u) for c in CASES for u in range(c.levels[0], c.levels[1] + 1)})
    todo = [(n, u, k) for n, u in need if u not in curves.get(n, {}) for k in range(TRUTH_SEEDS)]
    pooled: dict[tuple[str, int], list[float]] = {}
    for k, (name, users, ttft) in enumerate(pool.imap_unordered(reference, todo), 1):
        pooled.setdefault((name, users), []).extend(ttft)
        print(f"\rreference runs: {k}/{len(todo)}", end="", file=sys.stderr, flush=True)
    for (name, users), ttft in pooled.items():
        curves.setdefault(name, {})[users] = [float(v) for v in np.percentile(ttft, [50, 90, 99])]
    if todo and not SMOKE:
        TRUTH_FILE.write_text(
            json.dumps(
                {
                    "fingerprint": fp,
                    "seeds": TRUTH_SEEDS,
                    "seconds": TRUTH_S,
                    "curves": {n: {str(u): v for u, v in sorted(d.items())} for n, d in curves.items()},
                }
            )
        )
    jobs = [(ci, 1000 + s) for ci in range(len(CASES)) for s in range(SEEDS)]
    results: list[dict[str, Any]] = []
    for k, r in enumerate(pool.imap_unordered(search_case, jobs), 1):
        results.append(r)
        print(f"\rsearches: {k}/{len(jobs)}  ", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(
        f"knee search on the simulator (Llama-3.1-8B, A100-40GB, 16 seats; 40 s steps, 10 s warm-up), "
        f"{SEEDS} seeds a case; truth: {TRUTH_SEEDS} x {TRUTH_S:.0f} s reference runs at every count"
    )
    print(
        f"{'profile':8} {'limit':18} {'truth':>6} | {'inference: holds':>17} {'median min':>10} {'steps':>5} "
        f"{'width':>6} | {'bisection: holds':>17} {'median min':>10} {'steps':>5}"
    )
    totals = {"new": [0, 0], "old": [0, 0]}
    wrong = unanswered_all = 0
    minutes: dict[str, list[float]] = {"new": [], "old": []}
    for ci, case in enumerate(CASES):
        lim = parse_sla(case.sla)[0]
        k = true_knee(curves[case.profile], lim)
        rows = [r for r in results if r["case"] == ci]
        new_hit = sum(holds(r["new"][0], k) for r in rows)
        old_hit = sum(holds(r["old"][0], k) for r in rows)
        widths = [(hi - lo) / est for r in rows for (lo, hi), est in [(r["new"][0], r["new"][1])] if lo and hi and est]
        new_min = statistics.median(r["new"][3] for r in rows)
        old_min = statistics.median(r["old"][1] for r in rows)
        minutes["new"] += [r["new"][3] for r in rows]
        minutes["old"] += [r["old"][1] for r in rows]
        totals["new"][0] += new_hit
        totals["old"][0] += old_hit
        totals["new"][1] += len(rows)
        totals["old"][1] += len(rows)
        width = f"{100 * statistics.median(widths):.0f}%" if widths else "-"
        print(
            f"{case.profile:8} {case.sla:18} {k:6.1f} | {new_hit:>8}/{len(rows):<8} {new_min:>10.1f} "
            f"{statistics.median(r['new'][4] for r in rows):>5.0f} {width:>6} | {old_hit:>8}/{len(rows):<8} "
            f"{old_min:>10.1f} {statistics.median(r['old'][2] for r in rows):>5.0f}"
        )
        misses = [r for r in rows if not holds(r["new"][0], k)]
        # a miss is a claim the truth lies outside of, or no answer at all (both ends open)
        unanswered = sum(1 for r in misses if r["new"][0] in (None, (None, None)))
        wrong += len(misses) - unanswered
        unanswered_all += unanswered
        if misses:
            print(
                f"    missed: {len(misses) - unanswered} claimed an interval without the truth, {unanswered} no interval"
            )
        for r in misses[:3]:
            print(f"    inference missed, seed {r['seed']}: {r['new'][0]} est {r['new'][1]} ({r['new'][2]})")
    n_new, n_old = totals["new"], totals["old"]
    print(
        f"all cases: inference holds the truth {100 * n_new[0] / n_new[1]:.0f}% ({n_new[0]}/{n_new[1]}), "
        f"median {statistics.median(minutes['new']):.1f} load-minutes; bisection {100 * n_old[0] / n_old[1]:.0f}% "
        f"({n_old[0]}/{n_old[1]}), median {statistics.median(minutes['old']):.1f} load-minutes "
        f"({time.time() - t0:.0f} s)"
    )
    settled = sum(r["settled"][0] for r in results)
    steps_all = sum(r["new"][4] for r in results)
    saved = sum(r["settled"][1] for r in results) / 60
    print(
        f"steps settled early (their next level plain): {settled} of {steps_all}, "
        f"{saved / len(results):.2f} load-minutes saved a search on average" + ("" if SETTLE else " (--no-settle)")
    )
    print(
        f"the inference's misses: {wrong} intervals that do not hold the truth, "
        f"{unanswered_all} searches that ended with no interval (both ends open: too few requests for the limit)"
    )


if __name__ == "__main__":
    from spoc_tui.procs.supervise import supervise

    supervise()  # whatever stops this script stops what it started
    main()
