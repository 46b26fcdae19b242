"""A tuning study: Optuna's NSGA-II proposes configurations, each one is started and ramped.

Used by ``spoc tune`` and the Tune screen alike. The study lives in Optuna storage (SQLite or a
journal file in the output folder by default, any SQLAlchemy URL such as PostgreSQL for several
machines), so it opens in optuna-dashboard as it is, survives a crash and can be resumed, and
several ``--worker`` processes can share it. Each finished trial is appended to
``trials.jsonl`` and ``pareto.json`` is rewritten, so nothing measured is lost on Ctrl-C.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from spoc_tui.core.errors import first_line
from spoc_tui.core.jsonsafe import json_safe
from spoc_tui.core.ramp.knee import FixedUsers, SaturationSearch, UserPlan
from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.ramp.steps import StepSummary
from spoc_tui.core.redact import redact_argv, redact_url
from spoc_tui.core.tuning.docs import RAN, ReferenceStep, StudyStatus, TrialRecord
from spoc_tui.core.tuning.noisyfront import pick_rerun
from spoc_tui.core.tuning.space import (
    Config,
    Objective,
    Space,
    constraint_values,
    objective_interval,
    objective_value,
    reference_step,
)
from spoc_tui.procs.group import pid_alive
from spoc_tui.procs.leftovers import stop_leftover
from spoc_tui.procs.lock import FolderLock
from spoc_tui.tune.evaluate import Evaluator, TrialOutcome, TrialPlan, TrialRequest
from spoc_tui.tune.events import (
    EvaluatorEvent,
    Listener,
    Note,
    OthersDone,
    StudyDone,
    StudyOpened,
    TrialDone,
    TrialSkipped,
    TrialStarted,
    TuneEvent,
)
from spoc_tui.tune.files import StudyFiles
from spoc_tui.tune.optuna_compat import add_frozen, ask_preferring
from spoc_tui.tune.policies import calibration, dominated, kv_seed
from spoc_tui.tune.records import Front, StudyAttr, TrialAttr, compute_front, config_key, record_of
from spoc_tui.tune.storage import TuneError, open_storage, take_study_lock, worker_id

logger = logging.getLogger(__name__)
REQUEUED = "re-run of interrupted trial"
"""How a configuration an interruption cut short is queued again (it runs first on --resume)."""
LOG_TAIL_CHARS = 4000


@dataclass
class TuneConfig:
    space: Space
    objectives: tuple[Objective, ...]
    limits: tuple[Limit, ...]
    trials: int
    out_dir: Path
    study_name: str = "spoc"
    storage: str | None = None
    resume: bool = False
    worker: bool = False
    seed: int | None = 0
    population: int = 8
    ref_users: int | None = None
    tries: list[Config] = field(default_factory=list)
    """Configurations the operator wants tried first (for example the one in production)."""
    repeats: int = 0
    """Run each Pareto-optimal configuration this many more times at the end."""
    template: list[str] = field(default_factory=list)
    """The launch template (for the copyable command lines in the results)."""
    max_skips: int = 400
    """Proposals skipped (duplicates, broken conditions) in a row before the space counts as exhausted."""
    screen_pool: int = 32
    """NSGA-II children bred per trial, of which the surrogate picks one (1: plain NSGA-II)."""
    rerun_share: float = 0.1
    """At most this share of the --trials budget re-runs unsettled configurations
    (see :meth:`TuneSession._due_rerun`)."""


@dataclass
class TuneSummary:
    status: StudyStatus
    records: list[TrialRecord]
    front: Front
    repeats: dict[int, list[dict[str, float | None]]] = field(default_factory=dict)
    message: str = ""


def suggest(trial: Any, space: Space) -> Config:
    """Ask the sampler for a configuration: ordered flags as numbers (powers of two by exponent),
    so crossover and mutation can use their order; other choices as categories."""
    config: Config = {}
    for p in space.params:
        if p.kind == "pow2":
            exps = [p.encode(v) for v in p.values]
            config[p.name] = p.decode(trial.suggest_int(p.sampler_name, min(exps), max(exps)))
        elif p.by_index:
            config[p.name] = p.decode(trial.suggest_int(p.sampler_name, 0, len(p.values) - 1))
        elif p.kind == "range" and len(p.values) > 1:
            step = p.values[1] - p.values[0]  # type: ignore[operator]  # a range's values are ints (tunespace)
            config[p.name] = trial.suggest_int(p.name, p.values[0], p.values[-1], step=step)
        else:
            config[p.name] = trial.suggest_categorical(p.name, list(p.values))
    return config


def spread_configs(space: Space, n: int, seed: int | None, taken: Sequence[Config] = ()) -> list[Config]:
    """``n`` configurations spread over the space (a Latin-hypercube design on the value lists):
    every value of every flag appears about equally often, unlike a random first generation
    that can miss a value altogether. Configurations that break a condition or repeat are redrawn.
    """
    import random

    rng = random.Random(seed)
    seen = {space.key(c) for c in taken}
    out: list[Config] = []
    for _ in range(20):
        if len(out) >= n:
            break
        columns = {}
        for p in space.params:
            reps = -(-n // len(p.values))
            col = [v for _ in range(reps) for v in rng.sample(list(p.values), len(p.values))][:n]
            rng.shuffle(col)
            columns[p.name] = col
        for i in range(n):
            c = {name: col[i] for name, col in columns.items()}
            key = space.key(c)
            if key in seen or space.violated(c) is not None:
                continue
            seen.add(key)
            out.append(c)
            if len(out) >= n:
                break
    return out


@dataclass(frozen=True)
class StudyState:
    """What the study has decided so far, replaced (never changed) when it decides more: the
    levels each trial's ramp steps (a calibration's :class:`SaturationSearch` until the reference
    load is found, then that load) and the reference load the objectives are read at."""

    plan: UserPlan
    ref_users: int | None = None

    def trial(self, early_stop: Callable[[StepSummary], str | None] | None) -> TrialPlan:
        """What the next trial's evaluator is handed."""
        return TrialPlan(self.plan, early_stop)


class TuneSession:
    """Runs a study with an evaluator (:class:`ServerEvaluator` or :class:`FastSimEvaluator`)."""

    def __init__(self, cfg: TuneConfig, evaluator: Evaluator, listener: Listener | None = None) -> None:
        self.cfg = cfg
        self.evaluator = evaluator
        self.listener: Listener = listener or (lambda ev: None)
        self._stop = threading.Event()
        self.records: list[TrialRecord] = []
        self.study: Any = None
        self.storage_url = ""
        self._lock: FolderLock | None = None
        self.files = StudyFiles(cfg)
        self._front: Front | None = None
        self.state = StudyState(evaluator.ramp.plan, cfg.ref_users)
        """The study's decisions so far (the evaluator and the configuration are never changed)."""

    def _calibrating(self) -> bool:
        """--users auto and no reference load yet: this trial's ramp is the calibration."""
        return isinstance(self.state.plan, SaturationSearch) and not self.state.ref_users

    def _use_reference(self, users: int) -> None:
        self.state = StudyState(FixedUsers([users]), users)

    def _planned_users(self) -> int | None:
        """The user count the trials' ramp steps last (the reference load), or None while calibrating."""
        plan = self.state.plan
        return plan.users[-1] if isinstance(plan, FixedUsers) and plan.users else None

    def _calibrate(self, o: TrialOutcome) -> None:
        """The first trial's calibration sets the study's reference load: the fewest users at
        which its configuration (normally the server defaults) reaches 90 % of its best output
        tokens/s (:func:`~spoc_tui.core.ramp.knee.reference_load`), so that every trial is
        measured near saturation, where flags change what the server does (at light load the
        front would rank the workload's randomness). Kept in the study for --resume and workers;
        the calibration trial is scored at that load like the others."""
        ref, why = calibration(o.steps)
        self._use_reference(ref)
        try:
            self.study.set_user_attr(StudyAttr.REFERENCE_USERS, ref)
        except Exception as e:  # the storage failing here must not lose the trial
            logger.warning("could not store the reference load: %s", first_line(e))
        self.emit(Note(f"calibration: the first configuration {why}; every trial is measured at {ref} users"))

    def _dominated(self, step: Any) -> str | None:
        """Early stopping: why the reference step measured so far is clearly dominated, or None.

        Its interval box (each objective's 95 % interval over the window so far) must lie wholly
        beyond a confirmed front member's pessimistic corner. Knee objectives are not stopped
        early (a knee needs every step)."""
        cfg = self.cfg
        front = self._front
        if front is None or not front.members or any(o.name == "knee_users" for o in cfg.objectives):
            return None
        if self._calibrating():  # its steps are the calibration's, not the reference load
            return None
        ref_users = self.state.ref_users or self._planned_users()
        if ref_users is not None and step.users != ref_users:
            return None
        return dominated(cfg.objectives, front, step)

    # -- control ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop after (or during) the current trial; thread-safe. The trial's server is stopped."""
        self._stop.set()
        self.evaluator.stop()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def emit(self, event: TuneEvent) -> None:
        self.listener(event)

    def _request(self, number: int, config: Config, flags: Sequence[str], trial_dir: Path) -> TrialRequest:
        """What the evaluator is handed for trial ``number``: its events tagged with the trial,
        and the plan the study's state decides for it now."""

        def on_event(ev: EvaluatorEvent) -> None:
            self.listener(dataclasses.replace(ev, number=number))

        return TrialRequest(config, tuple(flags), trial_dir, on_event, self.state.trial(self._dominated))

    # -- study -----------------------------------------------------------------------------
    def open(self) -> None:
        """Open or create the study and deal with what a killed study left behind.

        Raises:
            TuneError: a study that exists without --resume, or is missing with it; mismatched objectives.
        """
        import optuna

        from spoc_tui.tune.screening import ScreenedChildren

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        cfg = self.cfg
        cfg.out_dir.mkdir(parents=True, exist_ok=True)
        if not cfg.worker:
            self._take_lock()
        left = stop_leftover(cfg.out_dir / "server.json")
        if left:
            self.emit(Note(left))
        storage, self.storage_url = open_storage(cfg.storage, cfg.out_dir)
        names = optuna.study.get_all_study_names(storage)
        # population about 8: several generations within 30 expensive trials; SBX crossover uses the
        # order of numeric flags (powers of two are searched by exponent). See benchmarks/tune_quality.py.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SBXCrossover is marked experimental
            children = ScreenedChildren(
                seed=cfg.seed,
                crossover=optuna.samplers.nsgaii.SBXCrossover(),
                objective_names=[o.name for o in cfg.objectives],
                directions=[o.direction for o in cfg.objectives],
                make_filter=self._child_filter,
                pool=cfg.screen_pool,
            )
            sampler = optuna.samplers.NSGAIISampler(
                population_size=cfg.population, seed=cfg.seed, child_generation_strategy=children
            )
        directions: list[Literal["maximize", "minimize"]] = [
            "maximize" if o.direction == "max" else "minimize" for o in cfg.objectives
        ]
        shown = redact_url(self.storage_url)
        if cfg.study_name in names:
            if not (cfg.resume or cfg.worker):
                raise TuneError(
                    f"study {cfg.study_name!r} already exists in {shown}; pass --resume to continue it or "
                    f"choose another --study"
                )
            study = optuna.load_study(study_name=cfg.study_name, storage=storage, sampler=sampler)
            stored = study.user_attrs.get(StudyAttr.OBJECTIVES)
            if stored and stored != [str(o) for o in cfg.objectives]:
                raise TuneError(
                    f"study {cfg.study_name!r} optimises {', '.join(stored)}; it cannot be continued with "
                    f"{', '.join(map(str, cfg.objectives))}"
                )
            stored_sla = study.user_attrs.get(StudyAttr.SLA)
            if stored_sla and stored_sla != [str(x) for x in cfg.limits]:
                raise TuneError(
                    f"study {cfg.study_name!r} was run with the SLA {', '.join(stored_sla)}; continue it with "
                    f"the same --sla"
                )
        else:
            if cfg.resume or cfg.worker:
                known = ", ".join(names) or "none"
                raise TuneError(
                    f"no study {cfg.study_name!r} in {shown} to {'join' if cfg.worker else 'resume'} (studies "
                    f"there: {known})"
                )
            study = optuna.create_study(
                study_name=cfg.study_name, storage=storage, sampler=sampler, directions=directions
            )
            study.set_user_attr(StudyAttr.OBJECTIVES, [str(o) for o in cfg.objectives])
            study.set_user_attr(StudyAttr.SLA, [str(x) for x in cfg.limits])
            study.set_user_attr(StudyAttr.SPACE, cfg.space.source)
            study.set_user_attr(StudyAttr.COMMAND, redact_argv(cfg.template))
            # a flag a --try leaves out is what the server does without it: its default (where the
            # space names one; otherwise NSGA-II draws it)
            defaults = cfg.space.defaults()
            first = [{**defaults, **c} for c in cfg.tries]
            for c in first:
                study.enqueue_trial(cfg.space.encode(c), user_attrs={TrialAttr.SEEDED: "given with --try"})
            if defaults:
                study.enqueue_trial(cfg.space.encode(defaults), user_attrs={TrialAttr.SEEDED: "server defaults"})
                first.append(defaults)
            for c in spread_configs(cfg.space, cfg.population - len(first), cfg.seed, first):
                study.enqueue_trial(
                    cfg.space.encode(c), user_attrs={TrialAttr.SEEDED: "first generation, spread over the space"}
                )
        self.study = study
        stored_ref = study.user_attrs.get(StudyAttr.REFERENCE_USERS)
        if stored_ref and not self.state.ref_users:
            self._use_reference(int(stored_ref))
        stored_mml = study.user_attrs.get(StudyAttr.MAX_MODEL_LEN)
        if isinstance(stored_mml, int) and stored_mml > 0 and "max-model-len" not in cfg.space.names:
            self._learn_max_model_len(stored_mml, "the study's servers reported")
        self._recover_interrupted()
        self.records = [r for r in (record_of(t) for t in study.get_trials(deepcopy=False)) if r is not None]
        self._front = compute_front(self.records, cfg.objectives, cfg.limits)
        self.emit(StudyOpened(cfg.study_name, shown, tuple(self.records)))

    def _recover_interrupted(self) -> None:
        """Trials this host started and never finished (a crash): failed, and queued to run again."""
        from optuna.trial import TrialState

        if self.cfg.worker:
            return
        host = socket.gethostname()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            w = str(t.user_attrs.get("worker", ""))
            h, _, pid = w.partition(":")
            if h != host or (pid.isdigit() and pid_alive(int(pid))):
                continue
            try:
                self.study.tell(t.number, state=TrialState.FAIL)
            except (ValueError, RuntimeError):
                continue
            self.study.enqueue_trial(dict(t.params), user_attrs={TrialAttr.SEEDED: f"{REQUEUED} {t.number}"})
            self.emit(Note(f"trial {t.number} was interrupted by a crash; it will run again"))

    def counted(self) -> int:
        """Trials that ran (finished or infeasible), from every worker of the study."""
        from optuna.trial import TrialState

        return sum(
            1
            for t in self.study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
            )
            if t.user_attrs.get("status") in RAN and not t.user_attrs.get("extra")
        )

    def _due_rerun(self, done: int) -> TrialRecord | None:
        """The configuration to re-run now, or None (the sampler proposes the next trial).

        Policy (documented in the README): once the first generation has run, re-runs may take up
        to ``rerun_share`` of the trials run so far (a tenth by default), and go to the unsettled
        configuration :func:`~spoc_tui.core.tuning.noisyfront.pick_rerun` names: a provisional front member
        or a candidate whose interval reaches the front, fewest runs first, at most 4 runs each. In
        the last trials of the budget re-runs come first while the front is unsettled, since an
        unsettled front is what the study would otherwise end with."""
        cfg = self.cfg
        if cfg.rerun_share <= 0 or done < cfg.population:
            return None
        reruns = sum(1 for r in self.records if r.repeat_of is not None and not r.extra)
        left = cfg.trials - done
        allowed = int(cfg.rerun_share * (done + 1))
        if reruns >= allowed and left > max(1, round(cfg.rerun_share * cfg.population)):
            return None
        if reruns >= int(cfg.rerun_share * cfg.trials) + 1:
            return None
        front = self._front or compute_front(self.records, cfg.objectives, cfg.limits)  # current after each run
        pick = pick_rerun(front.estimates, [o.direction for o in cfg.objectives])
        if pick is None:
            return None
        runs = [r for r in self.records if config_key(r.config) == pick.key]
        return min(runs, key=lambda r: (r.repeat_of is not None, r.number)) if runs else None

    def _blocked(self, config: Config, seen: dict[tuple[Any, ...], int]) -> str | None:
        """Why ``config`` may not run (a repeat of a trial run or running, a broken condition), or None."""
        key = self.cfg.space.key(config)
        if key in seen:
            return f"same configuration as trial {seen[key]}"
        broken = self.cfg.space.violated(config)
        return None if broken is None else f"breaks the condition {broken}"

    def _child_filter(self) -> Callable[[dict[str, Any]], bool]:
        """For the sampler: may a proposed child run? (the same test the loop applies to it)"""
        seen = self._seen()
        return lambda params: self._blocked(self.cfg.space.decode(params), seen) is None

    def _seen(self, exclude: int | None = None) -> dict[tuple[Any, ...], int]:
        """Configurations already run or running (other workers), by trial number."""
        from optuna.trial import TrialState

        out: dict[tuple[Any, ...], int] = {}
        for t in self.study.get_trials(deepcopy=False):
            if t.number == exclude:
                continue
            if t.user_attrs.get("status") in RAN or t.state == TrialState.RUNNING:
                out.setdefault(self.cfg.space.key(self.cfg.space.decode(t.params)), t.number)
        return out

    def _take_lock(self) -> None:
        self._lock = take_study_lock(self.cfg.out_dir)

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # -- the loop --------------------------------------------------------------------------
    def run(self) -> TuneSummary:
        """Run trials until ``cfg.trials`` have run in the study (all workers), then the repeats.

        Raises:
            TuneError: the study cannot start; TuneFatal: a launch problem that is not the configuration's.
        """
        try:
            return self._run()
        finally:
            self._release_lock()

    def _run(self) -> TuneSummary:
        if self.study is None:
            self.open()
        from optuna.trial import TrialState

        cfg = self.cfg
        status: StudyStatus = "complete"
        message = ""
        skips = 0
        try:
            while not self._stop.is_set():
                done = self.counted()
                if done >= cfg.trials:
                    break
                due = self._due_rerun(done)
                if due is not None:
                    record = self._rerun(
                        due, done + 1, f"re-run of trial {due.number}: its interval overlaps the front"
                    )
                    if record.status == "interrupted":
                        status = "interrupted"
                        break
                    continue
                trial = ask_preferring(
                    self.study, lambda t: str(t.user_attrs.get(TrialAttr.SEEDED, "")).startswith(REQUEUED)
                )
                # A queued trial (--try, defaults, the spread first generation, the KV-derived seed)
                # takes its values without asking the sampler, so NSGA-II would never file it under a
                # generation: it would run a whole random generation of its own first and never use
                # the seeds as parents. Reading the relative parameters files it.
                _ = trial.relative_params
                config = suggest(trial, cfg.space)
                why = self._blocked(config, self._seen(exclude=trial.number))
                if why is not None:
                    trial.set_user_attr(TrialAttr.SKIPPED, why)
                    self.study.tell(trial, state=TrialState.PRUNED)
                    self.emit(TrialSkipped(trial.number, config, why, trial.user_attrs.get(TrialAttr.SEEDED)))
                    skips += 1
                    if skips >= cfg.max_skips:
                        status, message = (
                            "exhausted",
                            f"{skips} proposals in a row were duplicates or broke a condition: the space is "
                            f"exhausted around the front",
                        )
                        break
                    continue
                skips = 0
                record = self._run_trial(trial, config, done + 1)
                if record.status == "interrupted":
                    status = "interrupted"
                    break
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            if status == "interrupted" or self._stop.is_set():
                status = "interrupted"
            try:
                self._sync_others()
            except (
                Exception
            ) as e:  # the storage failing must not hide why the loop ended; the front is this worker's then
                logger.warning("could not read the other workers' trials: %s", first_line(e))
            front = compute_front(self.records, cfg.objectives, cfg.limits)
            repeating = status != "interrupted" and cfg.repeats > 0 and not cfg.worker
            self._write_pareto(front, {}, "running" if repeating else status)
        repeats: dict[int, list[dict[str, float | None]]] = {}
        if repeating:
            repeats = self._repeat(front)
            front = compute_front(self.records, cfg.objectives, cfg.limits)
            self._write_pareto(front, repeats, status)
        self.emit(StudyDone(status, front, message))
        return TuneSummary(status, list(self.records), front, repeats, message)

    def _run_trial(self, trial: Any, config: Config, ordinal: int) -> TrialRecord:
        """Run one trial the sampler proposed (or a queued one); re-runs go through :meth:`_rerun`."""
        from optuna.trial import TrialState

        cfg = self.cfg
        flags = cfg.space.argv(config)
        trial.set_user_attr("flags", flags)
        trial.set_user_attr("worker", worker_id())
        seeded = trial.user_attrs.get(TrialAttr.SEEDED)
        self.emit(TrialStarted(trial.number, ordinal, cfg.trials, config, tuple(flags), seeded))
        trial_dir = cfg.out_dir / "trials" / f"{trial.number:04d}"
        try:
            outcome: TrialOutcome = self.evaluator.evaluate(self._request(trial.number, config, flags, trial_dir))
        except KeyboardInterrupt:
            outcome = TrialOutcome("interrupted", reason="interrupted (Ctrl-C)")
            self._finish(trial, config, flags, outcome, TrialState.FAIL)
            raise
        except Exception as e:  # TuneFatal, or a bug: the trial must not stay RUNNING in the study
            trial.set_user_attr("reason", f"{type(e).__name__}: {e}"[:500])
            self.study.tell(trial, state=TrialState.FAIL)
            raise
        if outcome.status == "interrupted":
            return self._finish(trial, config, flags, outcome, TrialState.FAIL)
        if outcome.status == "ok" and self._calibrating():
            self._calibrate(outcome)
        if outcome.status == "ok":
            if outcome.max_model_len and not {"max-model-len"} & {*cfg.space.names, *cfg.space.known}:
                self._learn_max_model_len(outcome.max_model_len, "the server reports")
                # kept in the study: a resumed study skips what this one would have skipped
                self.study.set_user_attr(StudyAttr.MAX_MODEL_LEN, outcome.max_model_len)
            values = self._values(outcome)
            if values is None:
                return self._finish(trial, config, flags, outcome, TrialState.FAIL)
            rec = self._finish(trial, config, flags, outcome, TrialState.COMPLETE, values)
            self._maybe_kv_seed(outcome)
            return rec
        return self._finish(trial, config, flags, outcome, TrialState.FAIL)

    def _learn_max_model_len(self, value: int, source: str) -> None:
        for c in self.cfg.space.learn("max-model-len", value):
            self.emit(Note(f'{source} max-model-len {value}: the condition "{c}" now applies'))

    def _record(
        self,
        number: int,
        config: Config,
        flags: list[str],
        o: TrialOutcome,
        values: list[float] | None,
        repeat_of: int | None = None,
        extra: bool = False,
    ) -> TrialRecord:
        cfg = self.cfg
        ref = reference_step(o.steps, self.state.ref_users)
        cons = (
            constraint_values(cfg.limits, cfg.objectives, o.steps, o.knee, self.state.ref_users)
            if values is not None
            else {}
        )
        rec = TrialRecord(
            number=number,
            status=o.status,
            config=dict(config),
            flags=flags,
            objectives={ob.name: v for ob, v in zip(cfg.objectives, values, strict=True)} if values is not None else {},
            constraints=cons,
            feasible=values is not None and all(c <= 0 for c in cons.values()),
            reason=o.reason,
            log_tail=o.log_tail[-LOG_TAIL_CHARS:],
            knee=o.knee if o.steps else None,
            reference=(
                ReferenceStep(
                    users=ref.users,
                    requests=ref.requests,
                    out_tok_s=ref.output_tokens_per_s,
                    req_s=ref.request_rate,
                    ttft_p99=ref.latency.ttft.p99,
                    itl_p99=ref.latency.itl.p99,
                    error_rate=ref.error_rate,
                    verdict=ref.verdict,
                )
                if ref is not None
                else None
            ),
            start_s=o.start_s,
            duration_s=o.duration_s,
            worker=worker_id(),
            finished_at=time.time(),
            repeat_of=repeat_of,
            extra=extra,
            early_stop=o.early_stop,
        )
        if values is not None:
            for ob in cfg.objectives:
                rec.ci95[ob.name], rec.n[ob.name] = objective_interval(ob, o.steps, o.knee, self.state.ref_users)
        return rec

    def _values(self, o: TrialOutcome) -> list[float] | None:
        """The objectives at the reference load, or None (the outcome turns infeasible, saying why)."""
        cfg = self.cfg
        if o.status != "ok":
            return None
        values = [
            v for ob in cfg.objectives if (v := objective_value(ob, o.steps, o.knee, self.state.ref_users)) is not None
        ]
        if len(values) != len(cfg.objectives):
            where = f"{self.state.ref_users} users" if self.state.ref_users else "the last step"
            o.status, o.reason = "infeasible", f"no request finished at the reference load ({where})"
            return None
        return values

    def _finish(
        self,
        trial: Any,
        config: Config,
        flags: list[str],
        o: TrialOutcome,
        state: Any,
        values: list[float] | None = None,
    ) -> TrialRecord:
        cfg = self.cfg
        rec = self._record(trial.number, config, flags, o, values)
        attrs = json_safe(rec.as_dict())
        assert isinstance(attrs, dict)
        for k, v in attrs.items():
            if k != "number":
                trial.set_user_attr(k, v)
        if o.status == "interrupted":  # not the configuration's fault: queued to run again when the study goes on
            self.study.enqueue_trial(
                cfg.space.encode(config), user_attrs={TrialAttr.SEEDED: f"{REQUEUED} {trial.number}"}
            )
        if values is not None:
            for name, c in rec.constraints.items():
                trial.set_constraint(name, c)
            self.study.tell(trial, values)
        else:
            self.study.tell(trial, state=state)
        return self._recorded(rec)

    def _recorded(self, rec: TrialRecord) -> TrialRecord:
        self.records.append(rec)
        self._append(rec)
        self._sync_others()
        front = self._front = compute_front(self.records, self.cfg.objectives, self.cfg.limits)
        self._write_pareto(front, {})
        self.emit(TrialDone(rec, front))
        return rec

    def _rerun(self, of: TrialRecord, ordinal: int, why: str, extra: bool = False) -> TrialRecord:
        """Run ``of``'s configuration again. It is stored as a finished trial of its own (told as
        pruned, so NSGA-II's populations never hold a configuration twice) with ``repeat_of`` set,
        and pooled with ``of`` on the front. An interrupted re-run is dropped (nothing to pool)."""
        import optuna
        from optuna.trial import TrialState

        cfg = self.cfg
        run = 2 + sum(1 for r in self.records if r.repeat_of == of.number)  # the trial itself was run 1
        self.emit(TrialStarted(of.number, ordinal, cfg.trials, of.config, tuple(of.flags), why))
        trial_dir = cfg.out_dir / "trials" / f"{of.number:04d}-run{run}"
        try:
            o = self.evaluator.evaluate(self._request(of.number, of.config, of.flags, trial_dir))
        except KeyboardInterrupt:
            return self._record(of.number, of.config, list(of.flags), TrialOutcome("interrupted"), None, of.number)
        if o.status == "interrupted":
            return self._record(of.number, of.config, list(of.flags), o, None, of.number, extra)
        values = self._values(o)
        rec = self._record(-1, of.config, list(of.flags), o, values, of.number, extra)
        attrs = json_safe(rec.as_dict())
        assert isinstance(attrs, dict)
        attrs.pop("number", None)
        attrs[TrialAttr.SEEDED] = why
        frozen = optuna.trial.create_trial(
            state=TrialState.PRUNED,
            params=cfg.space.encode(of.config),
            distributions=self._distributions(of.number),
            user_attrs=attrs,
        )
        rec.number = add_frozen(self.study, frozen)
        return self._recorded(rec)

    def _distributions(self, number: int) -> dict[str, Any]:
        """The parameter distributions of trial ``number`` (a re-run stores its values as they were)."""
        return dict(self.study.trials[number].distributions) if number < len(self.study.trials) else {}

    def _sync_others(self) -> None:
        """Take in the trials other workers of a shared study finished meanwhile, so that the
        front, the hypervolume and pareto.json are the whole study's."""
        have = {r.number for r in self.records}
        new = [
            r
            for r in (record_of(t) for t in self.study.get_trials(deepcopy=False) if t.number not in have)
            if r is not None and r.status in RAN
        ]
        if new:
            self.records = sorted([*self.records, *new], key=lambda r: r.number)
            self.emit(OthersDone(tuple(new)))

    def _maybe_kv_seed(self, o: TrialOutcome) -> None:
        """After the first finished trial: a configuration whose max-num-seqs is what the KV cache holds."""
        space = self.cfg.space
        if (
            self.study.user_attrs.get(StudyAttr.KV_SEED)
            or "max-num-seqs" not in space.names
            or not o.kv_tokens
            or not o.tokens_per_request
        ):
            return
        self.study.set_user_attr(StudyAttr.KV_SEED, True)
        config, pick, fits, what = kv_seed(space, o.kv_tokens, o.tokens_per_request)
        if space.key(config) in self._seen():
            self.emit(Note(f"{what}; max-num-seqs {pick} was already tried"))
            return
        self.study.enqueue_trial(
            space.encode(config),
            user_attrs={TrialAttr.SEEDED: f"KV cache holds {fits:.0f} sequences of {o.tokens_per_request:.0f} tokens"},
        )
        self.emit(Note(f"{what}; queued max-num-seqs {pick}"))

    def _repeat(self, front: Front) -> dict[int, list[dict[str, float | None]]]:
        """--repeat-pareto: each front configuration this many more times, outside the budget; the
        runs are pooled with the configuration's trial like any re-run."""
        out: dict[int, list[dict[str, float | None]]] = {}
        n = self.cfg.repeats
        for rec in front.records:
            for i in range(n):
                if self._stop.is_set():
                    return out
                rep = self._rerun(
                    rec, self.counted(), f"repeat {i + 1}/{n} of trial {rec.number} (--repeat-pareto)", extra=True
                )
                if rep.status == "interrupted":
                    return out
                out.setdefault(rec.number, []).append(dict(rep.objectives))
        return out

    # -- files (tune/files.py) ---------------------------------------------------------------
    def _append(self, rec: TrialRecord) -> None:
        self.files.append(rec)

    def command(self, flags: Sequence[str]) -> str:
        """The server's command line for these flags, as pareto.json shows it (secrets redacted)."""
        return self.files.command(flags)

    def _write_pareto(
        self, front: Front, repeats: dict[int, list[dict[str, float | None]]], status: str = "running"
    ) -> None:
        self.files.write_pareto(front, self.records, self.storage_url, repeats, status, self.state.ref_users)
