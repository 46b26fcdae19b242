"""What a study records of each trial, where it keeps it in Optuna, and the Pareto front of it.

Every field of :class:`TrialRecord` is stored as a user attribute of its Optuna trial under the
field's own name (so a shared study's workers and optuna-dashboard see the same record); the
few attributes that are not record fields are named in :class:`TrialAttr` and :class:`StudyAttr`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from spoc_tui.core.loadmath import Limit
from spoc_tui.core.pareto import hypervolume, pareto_indices
from spoc_tui.core.tunespace import Config, Objective, reference_point

TrialStatus = Literal["ok", "infeasible", "interrupted"]
"""ok: measured; infeasible: the server did not start or failed under load (a result);
interrupted: stopped before a verdict (run again when the study goes on)."""
RAN: tuple[TrialStatus, ...] = ("ok", "infeasible")
"""Statuses of trials that ran to a verdict (they count towards --trials)."""
StudyStatus = Literal["complete", "interrupted", "exhausted"]


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
    KV_SEED = "kv_seed"
    """The KV-capacity-derived configuration was queued."""


@dataclass
class TrialRecord:
    number: int
    status: TrialStatus
    config: Config
    flags: list[str]
    objectives: dict[str, float | None] = field(default_factory=dict)
    constraints: dict[str, float] = field(default_factory=dict)
    feasible: bool = False
    reason: str = ""
    log_tail: str = ""
    knee: dict[str, Any] = field(default_factory=dict)
    reference: dict[str, Any] = field(default_factory=dict)
    start_s: float | None = None
    duration_s: float = 0.0
    worker: str = ""
    repeat_of: int | None = None
    finished_at: float = 0.0
    ci95: dict[str, list[float | None]] = field(default_factory=dict)
    """Each objective's 95 % interval at the reference load (ramp.json's shape)."""
    n: dict[str, int] = field(default_factory=dict)
    """The sample each objective rests on (requests; ITL gaps for ITL; steps for the knee)."""

    def values(self, objectives: Sequence[Objective]) -> tuple[float, float] | None:
        v = [x for o in objectives if (x := self.objectives.get(o.name)) is not None]
        if self.status != "ok" or len(v) != len(objectives):
            return None
        return (float(v[0]), float(v[1]))

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_trial(cls, t: Any) -> TrialRecord | None:
        a = t.user_attrs
        if "status" not in a:
            return None
        return cls(
            number=t.number,
            status=a["status"],
            config=dict(a.get("config") or t.params),
            flags=list(a.get("flags", [])),
            objectives=dict(a.get("objectives", {})),
            constraints=dict(a.get("constraints", {})),
            feasible=bool(a.get("feasible")),
            reason=a.get("reason", ""),
            log_tail=a.get("log_tail", ""),
            knee=dict(a.get("knee", {})),
            reference=dict(a.get("reference", {})),
            start_s=a.get("start_s"),
            duration_s=float(a.get("duration_s", 0.0)),
            worker=a.get("worker", ""),
            finished_at=float(a.get("finished_at", 0.0)),
            ci95=dict(a.get("ci95", {})),
            n=dict(a.get("n", {})),
        )


@dataclass
class Front:
    """The Pareto set of the feasible trials so far, and its hypervolume."""

    records: list[TrialRecord]
    reference: tuple[float, float]
    hypervolume: float
    hv_by_trial: list[float]
    """Hypervolume after each counted trial, in trial order (same reference point)."""


def compute_front(records: Sequence[TrialRecord], objectives: Sequence[Objective], limits: Sequence[Limit]) -> Front:
    counted = sorted((r for r in records if r.repeat_of is None), key=lambda r: r.number)
    feas = [(r, v) for r in counted if r.feasible and (v := r.values(objectives)) is not None]
    dirs = [o.direction for o in objectives]
    pts = [v for _, v in feas]
    ref = reference_point(objectives, limits, pts)
    idx = pareto_indices(pts, dirs) if pts else []
    pareto = sorted((feas[i] for i in idx), key=lambda rv: rv[1][0])
    front_records = [r for r, _ in pareto]
    hv_by: list[float] = []
    seen: list[tuple[float, float]] = []
    for r in counted:
        v = r.values(objectives)
        if r.feasible and v is not None:
            seen.append(v)
        hv_by.append(hypervolume(seen, dirs, ref) if seen else 0.0)
    return Front(front_records, ref, hv_by[-1] if hv_by else 0.0, hv_by)
