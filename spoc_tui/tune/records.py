"""What a study records of each trial, where it keeps it in Optuna, and the Pareto front of it.

Every field of :class:`TrialRecord` is stored as a user attribute of its Optuna trial under the
field's own name (so a shared study's workers and optuna-dashboard see the same record); the
few attributes that are not record fields are named in :class:`TrialAttr` and :class:`StudyAttr`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.tuning.docs import RAN, TrialRecord
from spoc_tui.core.tuning.noisyfront import Estimate, FrontStatus, Run, classify, pool, run_to_run_cv, widen
from spoc_tui.core.tuning.pareto import hypervolume
from spoc_tui.core.tuning.space import Config, Objective, reference_point


class TrialAttr(StrEnum):
    """Trial user attributes that are not :class:`TrialRecord` fields."""

    SEEDED = "seeded"
    """Why a queued trial was queued (``--try``, server defaults, a re-run...)."""
    SKIPPED = "skipped"
    """Why a proposal was not run (a repeat, a broken condition)."""


class StudyAttr(StrEnum):
    """Study user attributes."""

    OBJECTIVES = "objectives"
    SLA = "sla"
    SPACE = "space"
    COMMAND = "command"
    REFERENCE_USERS = "reference_users"
    """The reference load the calibration set (--users auto)."""
    KV_SEED = "kv_seed"
    """The KV-capacity-derived configuration was queued."""
    MAX_MODEL_LEN = "max_model_len"
    """The max-model-len the study's servers reported (its conditions apply on --resume too)."""


def record_of(t: Any) -> TrialRecord | None:
    """An Optuna trial's record (its user attributes), None for a trial that has not finished one."""
    a = t.user_attrs
    if "status" not in a:
        return None
    return TrialRecord.from_dict({**a, "number": t.number, "config": a.get("config") or t.params}, f"trial {t.number}")


def config_key(config: Config) -> tuple[tuple[str, str], ...]:
    """A configuration as a hashable key (its runs are pooled under it)."""
    return tuple(sorted((k, json.dumps(v, sort_keys=True, default=str)) for k, v in config.items()))


@dataclass
class FrontMember:
    """A configuration on (or near) the front: its runs pooled (see :mod:`spoc_tui.core.tuning.noisyfront`)."""

    record: TrialRecord
    """The configuration's first trial (its flags, command, reference load)."""
    values: tuple[float, float]
    ci95: tuple[tuple[float, float], tuple[float, float]]
    runs: int
    numbers: list[int]
    """Its trial, then the trials that re-ran it."""
    status: FrontStatus
    spread: tuple[float, ...] = ()
    """Coefficient of variation between its runs, per objective (with two runs or more)."""


@dataclass
class Front:
    """The Pareto set of the feasible configurations so far, and its hypervolume.

    A configuration run more than once (re-runs, ``--repeat-pareto``) is one point: its runs pooled.
    ``members`` are the front's configurations, each confirmed or provisional; ``candidates`` are
    configurations off the point-estimate front whose intervals still reach it."""

    records: list[TrialRecord]
    reference: tuple[float, float]
    hypervolume: float
    hv_by_trial: list[float]
    """Hypervolume after each run (trials and re-runs), in the order they finished."""
    members: list[FrontMember] = field(default_factory=list)
    candidates: list[FrontMember] = field(default_factory=list)
    estimates: list[Estimate] = field(default_factory=list)
    """Every feasible configuration's pooled estimate, classified (for the re-run policy)."""
    run_to_run_cv: tuple[float, ...] | None = None
    """The run-to-run noise the study's repeated configurations measured, per objective (every
    interval is at least this wide); None until a configuration has run twice."""

    @property
    def settled(self) -> bool:
        """Every member confirmed and no candidate left."""
        return all(m.status == "confirmed" for m in self.members) and not self.candidates

    def member(self, number: int) -> FrontMember | None:
        return next((m for m in self.members if number in m.numbers), None)


def _run_of(r: TrialRecord, objectives: Sequence[Objective]) -> Run | None:
    v = r.values(objectives)
    if v is None:
        return None
    ci: list[tuple[float | None, float | None]] = []
    for o in objectives:
        c = r.ci95.get(o.name) or [None, None]
        ci.append((c[0], c[1]) if len(c) == 2 else (None, None))
    return Run(v, tuple(ci))


def _estimate(key: Hashable, runs: Sequence[TrialRecord], objectives: Sequence[Objective]) -> Estimate | None:
    """A configuration's runs pooled, or None when it is not a feasible front contender."""
    if any(r.status != "ok" for r in runs):
        return None  # a server that failed once under this configuration is not a front member
    rs = [x for r in runs if (x := _run_of(r, objectives)) is not None]
    if len(rs) != len(runs):
        return None
    cons: dict[str, list[float]] = {}
    for r in runs:
        for name, c in r.constraints.items():
            cons.setdefault(name, []).append(c)
    if not runs[0].feasible and not cons:
        return None
    if any(statistics.fmean(cs) > 0 for cs in cons.values()):
        return None  # feasible on average over its runs, or not at all
    return pool(key, rs)


def compute_front(records: Sequence[TrialRecord], objectives: Sequence[Objective], limits: Sequence[Limit]) -> Front:
    ordered = sorted(records, key=lambda r: (r.finished_at or 0.0, r.number, r.repeat_of is not None))
    dirs = [o.direction for o in objectives]
    groups: dict[Hashable, list[TrialRecord]] = {}
    pooled: dict[Hashable, Estimate | None] = {}
    history: list[list[Estimate]] = []  # the pooled points after each run (for the hypervolume)
    for r in ordered:
        if r.status in RAN:  # only the configuration this run belongs to changes
            key = config_key(r.config)
            groups.setdefault(key, []).append(r)
            pooled[key] = _estimate(key, groups[key], objectives)
        history.append([e for e in pooled.values() if e is not None])
    estimates = history[-1] if history else []
    # one run's interval holds only that run's sampling; configurations run more than once measure
    # the run-to-run noise too, and every interval is widened to at least it
    runs_by: list[list[Run]] = []
    for gkey, recs in groups.items():
        if pooled.get(gkey) is not None:
            runs_by.append([x for r in recs if (x := _run_of(r, objectives)) is not None])
    noise = run_to_run_cv(runs_by)
    if noise is not None:
        for e in estimates:
            widen(e, noise)
    pts = [e.values for e in estimates]
    ref = reference_point(objectives, limits, [(float(p[0]), float(p[1])) for p in pts])
    classify(estimates, dirs)

    def member(e: Estimate) -> FrontMember:
        runs = groups[e.key]
        first = min(runs, key=lambda r: (r.repeat_of is not None, r.number))
        numbers = [first.number] + sorted(r.number for r in runs if r is not first)
        return FrontMember(
            first,
            (e.values[0], e.values[1]),
            ((e.lo[0], e.hi[0]), (e.lo[1], e.hi[1])),
            e.runs,
            numbers,
            e.status,
            e.spread,
        )

    members = sorted(
        (member(e) for e in estimates if e.status in ("confirmed", "provisional")), key=lambda m: m.values[0]
    )
    candidates = sorted((member(e) for e in estimates if e.status == "candidate"), key=lambda m: m.values[0])
    hv_by = [hypervolume([e.values for e in est], dirs, ref) if est else 0.0 for est in history]
    return Front(
        [m.record for m in members],
        ref,
        hypervolume(pts, dirs, ref) if pts else 0.0,
        hv_by,
        members,
        candidates,
        estimates,
        noise,
    )
