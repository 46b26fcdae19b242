"""Search quality of `spoc tune` (run: make bench, or python benchmarks/tune_quality.py).

On the simulator (Llama-3.1-8B on one H100, the "coding" profile at 128 users, 40 virtual
seconds per trial), the built-in search space (576 configurations; max-model-len fixed at
16384 so its condition applies) is first tried exhaustively in the simulator's fast mode
(virtual time). That gives the true Pareto front of output tokens/s against ITL p99 under the
SLA, and its hypervolume.

Then, with trials looked up in that table (same figures a real run would produce), it reports
the hypervolume reached after 10, 20, 30 and 40 trials by:
- spoc tune's study (Optuna NSGA-II, population 8, SBX crossover on ordered flags, seeded with the server defaults and the
  KV-derived configuration, duplicates skipped; each child picked by the surrogate pre-screening in
  `spoc_tui/tune/screening.py` out of 32 that NSGA-II breeds),
- the same study with plain NSGA-II (every child it breeds is run), to show what the screening adds,
- random search (uniform over the configurations that can start, no repeats),
- a grid in the order vLLM's `benchmarks/auto_tune` script walks it (nested loops, first flag
  outermost), skipping configurations that cannot start,
averaged over 20 seeds. Target: 95 % of the true hypervolume within 30 trials, ahead of
both baselines.

``--noise`` (issue 16): the same, with measurement noise. Every lookup multiplies the reference
step's output tokens/s and its latencies by (1 + CV x N(0, 1)), drawn afresh per run, and each run
reports the interval such a run would claim (+-1.96 CV; ``--within`` sets a narrower claim). ``make bench``
uses the noise benchmarks/tune_noise.py measured (simulator: ``--cv=0.008,0.020``; real vLLM CPU:
``--cv=0.104,0.077 --within=0.014,0.044``). ``--cv=0.16`` by default: the repeat
spread of one configuration measured on ``spoc sim`` in real time (16 chatbot users, 30 s steps:
181, 224 and 252 output tokens/s, CV 0.16). Each method is scored by the *true* hypervolume of the
front it reports (its configurations' noise-free values; a configuration that truly misses the SLA
adds nothing): spoc tune reports its pooled, noise-aware front (re-runs count towards the 30
trials); the baselines report the front of their single noisy runs. Also printed: the share of
spoc tune's front members whose reported intervals hold the true values (target 90 %), and the
noise-free figures beside them.
"""

from __future__ import annotations

import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spoc_tui.core.ramp.knee import FixedUsers  # noqa: E402
from spoc_tui.core.ramp.sla import parse_sla  # noqa: E402
from spoc_tui.core.tuning.pareto import hypervolume, pareto_indices  # noqa: E402
from spoc_tui.core.tuning.space import load_space, objective_value, parse_objectives  # noqa: E402
from spoc_tui.load.ramp import RampConfig  # noqa: E402
from spoc_tui.tune.evaluate import FastSimEvaluator, TrialOutcome, TrialRequest  # noqa: E402
from spoc_tui.tune.study import TuneConfig, TuneSession  # noqa: E402
from spoc_tui.workload import load_workload  # noqa: E402

KNOWN = {"max-model-len": 16384}
LIMITS = parse_sla("ttft_p99<=30s,itl_p99<=300ms")
OBJECTIVES = parse_objectives("max:out_tok_s,min:itl_p99")
SMOKE = "--smoke" in sys.argv
"""make test runs it so (that the script runs, not its figures): 4 s steps at 16 users, one seed."""
SEEDS = list(range(int(next((a.split("=")[1] for a in sys.argv if a.startswith("--seeds=")), "1" if SMOKE else "20"))))
BUDGETS = [10, 20, 30, 40]
POP = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--population=")), "8"))
SPACE = load_space(None, KNOWN)
USERS = int(next((a.split("=")[1] for a in sys.argv if a.startswith("--users=")), "16" if SMOKE else "128"))
RAMP = RampConfig(
    "",
    load_workload("coding"),
    FixedUsers([USERS]),
    LIMITS,
    Path(),
    step_s=4.0 if SMOKE else 40.0,
    warmup_s=1.0 if SMOKE else 10.0,
    seed=0,
)


def _evaluate(config: dict) -> tuple[tuple, TrialOutcome]:
    ev = FastSimEvaluator(RAMP, fixed=dict(SPACE.fixed, **KNOWN))
    return SPACE.key(config), ev.evaluate(TrialRequest(config))


NOISE = "--noise" in sys.argv
_CV = next((a.split("=")[1] for a in sys.argv if a.startswith("--cv=")), "0.16").split(",")
CV = (float(_CV[0]), float(_CV[-1]))
"""Per-run coefficient of variation of output tokens/s and of the latencies (``--cv=TOK,LAT``, or
one figure for both): benchmarks/tune_noise.py measures them."""
_W = next((a.split("=")[1] for a in sys.argv if a.startswith("--within=")), None)
WITHIN = (float(_W.split(",")[0]), float(_W.split(",")[-1])) if _W else CV
"""The standard error a run's own interval claims (``--within=TOK,LAT``; default: the true noise,
a perfectly calibrated run). On the real vLLM CPU build a run claimed 1.4 % (tokens/s) and 4.4 %
(ITL p99) while runs spread by 10.4 % and 7.7 %: its own interval cannot see the run-to-run noise."""


def noisy(o: TrialOutcome, rng: random.Random, cv: tuple[float, float]) -> TrialOutcome:
    """One noisy run of a configuration: its reference step's throughput and latencies scaled by
    independent (1 + cv N(0,1)) factors, with the intervals such a run would report."""
    import copy

    if o.status != "ok" or not o.steps:
        return o
    out = copy.deepcopy(o)
    step = out.steps[-1]
    cv_tok, cv_lat = cv
    w_tok, w_lat = WITHIN if cv == CV else cv
    f_tok = max(0.05, 1 + cv_tok * rng.gauss(0, 1))
    f_lat = max(0.05, 1 + cv_lat * rng.gauss(0, 1))
    step.output_tokens_per_s *= f_tok
    v = step.output_tokens_per_s
    step.ci95["output_tokens_per_s"] = [v * (1 - 1.96 * w_tok), v * (1 + 1.96 * w_tok)]
    for lat in step.latency.values():
        for stat in ("p50", "p90", "p95", "p99", "mean"):
            if isinstance(lat.get(stat), (int, float)):
                lat[stat] *= f_lat
                lat.setdefault("ci95", {})[stat] = [lat[stat] * (1 - 1.96 * w_lat), lat[stat] * (1 + 1.96 * w_lat)]
    return out


class Lookup:
    """Answers trials from the exhaustive table (a configuration that cannot start is refused);
    with ``cv``, each answer is a fresh noisy run."""

    def __init__(self, table: dict, cv: tuple[float, float] = (0.0, 0.0), seed: int = 0) -> None:
        self.table = table
        self.cv = cv
        self.rng = random.Random(seed)
        self.ramp = RAMP  # the study asks its evaluator's ramp (fixed users: no calibration)

    def stop(self) -> None:
        pass

    def evaluate(self, req: TrialRequest) -> TrialOutcome:
        config = req.config
        key = SPACE.key(config)
        if key not in self.table:
            return TrialOutcome("infeasible", reason="breaks a condition")
        return noisy(self.table[key], self.rng, self.cv) if any(self.cv) else self.table[key]


def point(o: TrialOutcome) -> tuple[float, float] | None:
    if o.status != "ok":
        return None
    from spoc_tui.core.tuning.space import constraint_values

    if any(c > 0 for c in constraint_values(LIMITS, OBJECTIVES, o.steps, o.knee, None).values()):
        return None
    v = [objective_value(ob, o.steps, o.knee, None) for ob in OBJECTIVES]
    return None if any(x is None for x in v) else (v[0], v[1])  # type: ignore[return-value]


def hv_curve(points_in_order: list[tuple[float, float] | None], ref: tuple[float, float]) -> dict[int, float]:
    out = {}
    dirs = [o.direction for o in OBJECTIVES]
    for b in BUDGETS:
        pts = [p for p in points_in_order[:b] if p is not None]
        out[b] = hypervolume(pts, dirs, ref) if pts else 0.0
    return out


def tabulate(valid: list[dict]) -> dict[tuple, TrialOutcome]:
    """Every configuration in the fast mode, on two processes. A process that dies (the out-of-memory
    killer on a shared host) stops the benchmark with a message: multiprocessing.Pool waits for its
    results for ever, and a clean-clone run sat 420 s in it so."""
    try:
        with ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as pool:
            return dict(pool.map(_evaluate, valid, chunksize=8))
    except BrokenProcessPool as e:
        raise SystemExit(
            f"tune_quality: a process of the tabulation died ({e}): rerun on a host with memory to spare"
        ) from None


def main() -> None:
    valid = [c for c in SPACE.all_configs() if SPACE.violated(c) is None]
    print(f"space: {SPACE.size} configurations, {len(valid)} can start (max-model-len {KNOWN['max-model-len']})")
    t0 = time.monotonic()
    cache = Path(tempfile.gettempdir()) / f"spoc-tune-quality-{USERS}{'-smoke' if SMOKE else ''}.pickle"
    if "--cached" in sys.argv and cache.exists():
        import pickle

        table = pickle.loads(cache.read_bytes())
    else:
        table = tabulate(valid)
        import pickle

        cache.write_bytes(pickle.dumps(table))
    print(f"exhaustive evaluation in the simulator's fast mode: {time.monotonic() - t0:.0f} s")
    pts_all = {k: point(o) for k, o in table.items()}
    feas = [p for p in pts_all.values() if p is not None]
    # reference: the worst feasible value of each objective (the nadir), so the hypervolume measures
    # progress within what the space can reach rather than the distance from zero throughput
    ref = (min(p[0] for p in feas), max(p[1] for p in feas))
    dirs = [o.direction for o in OBJECTIVES]
    true_hv = hypervolume(feas, dirs, ref)
    front = sorted({feas[i] for i in pareto_indices(feas, dirs)})
    print(
        f"feasible under the SLA ({', '.join(map(str, LIMITS))}): {len(feas)}; true front: {len(front)} points, hypervolume {true_hv:.2f}"
    )
    for p in front:
        print(f"   {p[0]:8.0f} out tok/s   ITL p99 {p[1] * 1000:6.1f} ms")

    ours_name = "spoc tune"
    results: dict[str, list[dict[int, float]]] = {
        ours_name: [],
        "NSGA-II, no screening": [],
        "random": [],
        "grid (auto_tune order)": [],
    }
    for seed in SEEDS:
        for name, pool in ((ours_name, TuneConfig.screen_pool), ("NSGA-II, no screening", 1)):
            with tempfile.TemporaryDirectory() as d:
                cfg = TuneConfig(
                    load_space(None, KNOWN),
                    OBJECTIVES,
                    LIMITS,
                    max(BUDGETS),
                    Path(d),
                    population=POP,
                    seed=seed,
                    screen_pool=pool,
                    storage=f"journal:{Path(d) / 'study.journal'}",
                    rerun_share=0,  # noise-free lookups: a re-run would measure the same figures again
                )  # same search as SQLite, faster to write
                session = TuneSession(cfg, Lookup(table))
                session.run()
                recs = sorted((r for r in session.records if r.repeat_of is None), key=lambda r: r.number)
                order = [pts_all.get(SPACE.key(r.config)) for r in recs]
                results[name].append(hv_curve(order, ref))
        rng = random.Random(seed)
        shuffled = valid[:]
        rng.shuffle(shuffled)
        results["random"].append(hv_curve([pts_all[SPACE.key(c)] for c in shuffled], ref))
    results["grid (auto_tune order)"].append(hv_curve([pts_all[SPACE.key(c)] for c in valid], ref))

    print(f"\nhypervolume reached, % of the true front's (mean over {len(SEEDS)} seeds; grid is deterministic)")
    print(f"{'method':<24}" + "".join(f"{f'{b} trials':>11}" for b in BUDGETS) + f"{'min@30':>9}")
    for name, curves in results.items():
        means = [statistics.mean(c[b] for c in curves) / true_hv * 100 for b in BUDGETS]
        worst30 = min(c[30] for c in curves) / true_hv * 100
        print(f"{name:<24}" + "".join(f"{m:>10.1f}%" for m in means) + f"{worst30:>8.1f}%")
    ours = statistics.mean(c[30] for c in results[ours_name]) / true_hv
    rnd = statistics.mean(c[30] for c in results["random"]) / true_hv
    grid = results["grid (auto_tune order)"][0][30] / true_hv
    print(
        f"\ntarget >= 95 % within 30 trials, ahead of both baselines: {ours * 100:.1f}% vs random {rnd * 100:.1f}%, grid {grid * 100:.1f}% -> "
        + ("met" if ours >= 0.95 and ours > rnd and ours > grid else "NOT met")
    )


def noisy_main() -> None:
    """``--noise``: the comparison under measurement noise (see the module's docstring)."""
    import pickle

    valid = [c for c in SPACE.all_configs() if SPACE.violated(c) is None]
    cache = Path(tempfile.gettempdir()) / f"spoc-tune-quality-{USERS}.pickle"
    if cache.exists():
        table = pickle.loads(cache.read_bytes())
    else:
        table = tabulate(valid)
        cache.write_bytes(pickle.dumps(table))
    pts_all = {k: point(o) for k, o in table.items()}
    feas = [p for p in pts_all.values() if p is not None]
    ref = (min(p[0] for p in feas), max(p[1] for p in feas))
    dirs = [o.direction for o in OBJECTIVES]
    true_hv = hypervolume(feas, dirs, ref)
    budget = 30

    def true_hv_of(keys) -> float:
        pts = [pts_all[k] for k in keys if pts_all.get(k) is not None]
        return hypervolume(pts, dirs, ref) if pts else 0.0

    def noisy_front(keys, rng) -> list:
        """A baseline's report: the front of one noisy run per configuration."""
        obs = [(k, point(noisy(table[k], rng, CV))) for k in keys]
        obs = [(k, p) for k, p in obs if p is not None]
        idx = pareto_indices([p for _, p in obs], dirs) if obs else []
        return [obs[i][0] for i in idx]

    rows: dict[str, list[float]] = {"spoc tune (noise-aware, re-runs)": [], "spoc tune, no re-runs": []}
    rows |= {"NSGA-II, no screening": [], "random": [], "grid (auto_tune order)": []}
    clean: list[float] = []
    covered = members = 0
    confirmed = 0
    for seed in SEEDS:
        for name, share, pool_ in (
            ("spoc tune (noise-aware, re-runs)", TuneConfig.rerun_share, TuneConfig.screen_pool),
            ("spoc tune, no re-runs", 0.0, TuneConfig.screen_pool),
            ("NSGA-II, no screening", 0.0, 1),
        ):
            with tempfile.TemporaryDirectory() as d:
                cfg = TuneConfig(
                    load_space(None, KNOWN),
                    OBJECTIVES,
                    LIMITS,
                    budget,
                    Path(d),
                    population=POP,
                    seed=seed,
                    screen_pool=pool_,
                    rerun_share=share,
                    storage=f"journal:{Path(d) / 'study.journal'}",
                )
                session = TuneSession(cfg, Lookup(table, CV, seed=1000 + seed))
                front = session.run().front
                keys = [SPACE.key(m.record.config) for m in front.members]
                rows[name].append(true_hv_of(keys) / true_hv)
                if share:
                    for m, k in zip(front.members, keys, strict=True):
                        members += 1
                        confirmed += m.status == "confirmed"
                        t = pts_all.get(k)
                        if t is not None and all(m.ci95[i][0] <= t[i] <= m.ci95[i][1] for i in range(2)):
                            covered += 1
        rng = random.Random(seed)
        shuffled = valid[:]
        rng.shuffle(shuffled)
        rows["random"].append(true_hv_of(noisy_front([SPACE.key(c) for c in shuffled[:budget]], rng)) / true_hv)
        rows["grid (auto_tune order)"].append(
            true_hv_of(noisy_front([SPACE.key(c) for c in valid[:budget]], rng)) / true_hv
        )
        clean.append(true_hv_of([SPACE.key(c) for c in shuffled[:budget] if pts_all.get(SPACE.key(c))]) / true_hv)
    print(
        f"\nunder noise (CV per run {CV[0]:.3f} on tokens/s, {CV[1]:.3f} on latencies; each run's own interval "
        f"claims {WITHIN[0]:.3f} and {WITHIN[1]:.3f}), {budget} trials (re-runs included), "
        f"{len(SEEDS)} seeds; true hypervolume of the reported front, % of the true front's:"
    )
    print(f"{'method':<36}{'mean':>8}{'worst':>8}")
    for name, vals in rows.items():
        print(f"{name:<36}{statistics.mean(vals) * 100:>7.1f}%{min(vals) * 100:>7.1f}%")
    print(f"{'(random, noise-free, for scale)':<36}{statistics.mean(clean) * 100:>7.1f}%{min(clean) * 100:>7.1f}%")
    ours = statistics.mean(rows["spoc tune (noise-aware, re-runs)"])
    others = [statistics.mean(rows[k]) for k in ("random", "grid (auto_tune order)")]
    cover = covered / members if members else 0.0
    print(
        f"front members whose intervals hold the true values (both objectives): {covered}/{members} = "
        f"{cover * 100:.0f} % (target 90 %); confirmed: {confirmed}/{members}"
    )
    print(
        f"target >= 95 % of the true hypervolume within 30 trials, ahead of random and grid: {ours * 100:.1f}% -> "
        + ("met" if ours >= 0.95 and all(ours > x for x in others) else "NOT met")
    )


if __name__ == "__main__":
    from spoc_tui.procs.supervise import supervise

    supervise()  # whatever stops this script stops what it started
    if NOISE:
        noisy_main()
    else:
        main()
