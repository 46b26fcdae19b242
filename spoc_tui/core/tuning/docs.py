"""A study's result files as typed documents: a line of ``trials.jsonl`` (:class:`TrialRecord`)
and ``pareto.json`` (:class:`StudyDoc`, its front's and candidates' configurations
:class:`MemberDoc`). The codec (:mod:`spoc_tui.core.results`) reads them with their schema; the
study writes them through :meth:`as_dict`. Their keys, in order, are docs/results.md's, and a
file of schema 1 (written before the schema field) reads through the same decoders: a key it
lacks takes the value that meant the same then (an empty mapping, none).

Decoding is strict about shape (a member that is not an object, a number that is text) and says
where: these files are also written by hand and by other tools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast, get_args

from spoc_tui.core.errors import InputError
from spoc_tui.core.ramp.knee import Knee
from spoc_tui.core.ramp.steps import EarlyStop, StepVerdict
from spoc_tui.core.tuning.space import Config, Objective

TrialStatus = Literal["ok", "infeasible", "interrupted"]
"""ok: measured; infeasible: the server did not start or failed under load (a result);
interrupted: stopped before a verdict (run again when the study goes on)."""
RAN: tuple[TrialStatus, ...] = ("ok", "infeasible")
"""Statuses of trials that ran to a verdict (they count towards --trials)."""
StudyStatus = Literal["complete", "interrupted", "exhausted"]

Interval = list[float | None]
"""A 95 % interval as the files write it: ``[low, high]``, an open end ``null``."""


class DocError(InputError):
    """A study file whose shape is not a study file's (exit code 2)."""


def _obj(v: object, where: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise DocError(f"{where}: not an object")
    return dict(v)


def _list(v: object, where: str) -> list[Any]:
    if v is None:
        return []
    if not isinstance(v, list):
        raise DocError(f"{where}: not a list")
    return v


def _num(v: object, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DocError(f"{where}: {v!r} is not a number")
    return float(v)


def _int(v: object, where: str, default: int = 0) -> int:
    x = _num(v, where)
    return default if x is None else int(x)


def _str(v: object) -> str:
    return "" if v is None else str(v)


def _figures(v: object, where: str) -> dict[str, float | None]:
    return {str(k): _num(x, f"{where}.{k}") for k, x in _obj(v, where).items()}


def _present(figures: dict[str, float | None]) -> dict[str, float]:
    return {k: v for k, v in figures.items() if v is not None}


def _intervals(v: object, where: str) -> dict[str, Interval]:
    out: dict[str, Interval] = {}
    for k, x in _obj(v, where).items():
        pair = _list(x, f"{where}.{k}")
        if len(pair) != 2:
            raise DocError(f"{where}.{k}: an interval is [low, high]")
        out[str(k)] = [_num(pair[0], f"{where}.{k}"), _num(pair[1], f"{where}.{k}")]
    return out


def _counts(v: object, where: str) -> dict[str, int]:
    return {str(k): _int(x, f"{where}.{k}") for k, x in _obj(v, where).items()}


@dataclass(frozen=True)
class ReferenceStep:
    """A trial's step at the study's reference load: what its objectives are read from."""

    users: int | None
    requests: int
    out_tok_s: float | None
    req_s: float | None
    ttft_p99: float | None
    itl_p99: float | None
    error_rate: float | None
    verdict: StepVerdict

    def as_dict(self) -> dict[str, object]:
        return {
            "users": self.users,
            "requests": self.requests,
            "out_tok_s": self.out_tok_s,
            "req_s": self.req_s,
            "ttft_p99": self.ttft_p99,
            "itl_p99": self.itl_p99,
            "error_rate": self.error_rate,
            "verdict": self.verdict.as_dict(),
        }

    @classmethod
    def from_dict(cls, v: object, where: str) -> ReferenceStep | None:
        """None for a trial that measured no step (written ``{}``)."""
        d = _obj(v, where)
        if not d:
            return None
        users = _num(d.get("users"), f"{where}.users")
        return cls(
            users=None if users is None else int(users),
            requests=_int(d.get("requests"), f"{where}.requests"),
            out_tok_s=_num(d.get("out_tok_s"), f"{where}.out_tok_s"),
            req_s=_num(d.get("req_s"), f"{where}.req_s"),
            ttft_p99=_num(d.get("ttft_p99"), f"{where}.ttft_p99"),
            itl_p99=_num(d.get("itl_p99"), f"{where}.itl_p99"),
            error_rate=_num(d.get("error_rate"), f"{where}.error_rate"),
            verdict=StepVerdict.from_dict(_obj(d.get("verdict"), f"{where}.verdict")),
        )


def _early_stop(v: object, where: str) -> EarlyStop | None:
    d = _obj(v, where)
    if not d:
        return None
    return EarlyStop(_str(d.get("reason")), _num(d.get("saved_s"), f"{where}.saved_s") or 0.0)


@dataclass
class TrialRecord:
    """A finished trial: one line of trials.jsonl (and the user attributes of its Optuna trial)."""

    number: int
    status: TrialStatus
    config: Config
    flags: list[str]
    objectives: dict[str, float | None] = field(default_factory=dict)
    constraints: dict[str, float] = field(default_factory=dict)
    feasible: bool = False
    reason: str = ""
    log_tail: str = ""
    knee: Knee | None = None
    """The knee of the trial's steps (None: it measured none)."""
    reference: ReferenceStep | None = None
    """Its step at the reference load (None: it measured none)."""
    start_s: float | None = None
    duration_s: float = 0.0
    worker: str = ""
    repeat_of: int | None = None
    finished_at: float = 0.0
    ci95: dict[str, Interval] = field(default_factory=dict)
    """Each objective's 95 % interval at the reference load (ramp.json's shape)."""
    n: dict[str, int] = field(default_factory=dict)
    """The sample each objective rests on (requests; ITL gaps for ITL; steps for the knee)."""
    extra: bool = False
    """A --repeat-pareto run, outside the --trials budget."""
    early_stop: EarlyStop | None = None
    """Set when the trial stopped partway through its step, clearly dominated: why, and the
    seconds of planned measurement it did not spend."""

    def values(self, objectives: Sequence[Objective]) -> tuple[float, float] | None:
        v = [x for o in objectives if (x := self.objectives.get(o.name)) is not None]
        if self.status != "ok" or len(v) != len(objectives):
            return None
        return (float(v[0]), float(v[1]))

    def as_dict(self) -> dict[str, Any]:
        """The record as trials.jsonl writes it (a knee, a reference step or an early stop it
        lacks: ``{}``)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for k in ("knee", "reference", "early_stop"):
            d[k] = d[k].as_dict() if d[k] is not None else {}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, object], where: str = "trial") -> TrialRecord:
        """A record as written (any schema), or as an Optuna trial's user attributes hold it.

        Raises:
            DocError: a record of another shape.
        """
        status = d.get("status")
        if status not in get_args(TrialStatus):
            raise DocError(f"{where}: status {status!r} is not one of {', '.join(get_args(TrialStatus))}")
        repeat_of = d.get("repeat_of")
        return cls(
            number=_int(d.get("number"), f"{where}: number", -1),
            status=cast(TrialStatus, status),
            config=_obj(d.get("config"), f"{where}: config"),
            flags=[str(x) for x in _list(d.get("flags"), f"{where}: flags")],
            objectives=_figures(d.get("objectives"), f"{where}: objectives"),
            constraints={
                k: v for k, v in _figures(d.get("constraints"), f"{where}: constraints").items() if v is not None
            },
            feasible=bool(d.get("feasible")),
            reason=_str(d.get("reason")),
            log_tail=_str(d.get("log_tail")),
            knee=Knee.from_dict(knee) if (knee := _obj(d.get("knee"), f"{where}: knee")) else None,
            reference=ReferenceStep.from_dict(d.get("reference"), f"{where}: reference"),
            start_s=_num(d.get("start_s"), f"{where}: start_s"),
            duration_s=_num(d.get("duration_s"), f"{where}: duration_s") or 0.0,
            worker=_str(d.get("worker")),
            repeat_of=None if repeat_of is None else _int(repeat_of, f"{where}: repeat_of"),
            finished_at=_num(d.get("finished_at"), f"{where}: finished_at") or 0.0,
            ci95=_intervals(d.get("ci95"), f"{where}: ci95"),
            n=_counts(d.get("n"), f"{where}: n"),
            extra=bool(d.get("extra")),
            early_stop=_early_stop(d.get("early_stop"), f"{where}: early_stop"),
        )


@dataclass(frozen=True)
class FirstRun:
    """A pooled configuration's first run, as it was measured alone."""

    objectives: dict[str, float | None]
    ci95: dict[str, Interval]
    n: dict[str, int]

    def as_dict(self) -> dict[str, object]:
        return {"objectives": self.objectives, "ci95": self.ci95, "n": self.n}


@dataclass(frozen=True)
class MemberDoc:
    """A configuration on the front (or a candidate near it): its runs pooled."""

    number: int
    status: str
    """confirmed or provisional (a candidate: its own classification)."""
    config: Config
    flags: list[str]
    command: str
    """The server's command line for these flags (secrets redacted)."""
    objectives: dict[str, float | None]
    ci95: dict[str, Interval]
    n: dict[str, int]
    runs: int
    trials: list[int]
    """Its trial, then the trials that re-ran it."""
    first_run: FirstRun
    reference: ReferenceStep | None
    spread_cv: dict[str, float | None] | None = None
    """Coefficient of variation between its runs, per objective (with two runs or more)."""
    repeats: list[dict[str, float | None]] | None = None
    """Its --repeat-pareto runs' objectives."""

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "number": self.number,
            "status": self.status,
            "config": self.config,
            "flags": self.flags,
            "command": self.command,
            "objectives": self.objectives,
            "ci95": self.ci95,
            "n": self.n,
            "runs": self.runs,
            "trials": self.trials,
        }
        if self.spread_cv is not None:
            d["spread_cv"] = self.spread_cv
        d["first_run"] = self.first_run.as_dict()
        d["reference"] = self.reference.as_dict() if self.reference is not None else {}
        if self.repeats is not None:
            d["repeats"] = self.repeats
        return d

    @classmethod
    def from_dict(cls, v: object, where: str) -> MemberDoc:
        d = _obj(v, where)
        first = _obj(d.get("first_run"), f"{where}: first_run")
        spread, repeats = d.get("spread_cv"), d.get("repeats")
        return cls(
            number=_int(d.get("number"), f"{where}: number", -1),
            status=_str(d.get("status")),
            config=_obj(d.get("config"), f"{where}: config"),
            flags=[str(x) for x in _list(d.get("flags"), f"{where}: flags")],
            command=_str(d.get("command")),
            objectives=_figures(d.get("objectives"), f"{where}: objectives"),
            ci95=_intervals(d.get("ci95"), f"{where}: ci95"),
            n=_counts(d.get("n"), f"{where}: n"),
            runs=_int(d.get("runs"), f"{where}: runs", 1),
            trials=[_int(x, f"{where}: trials") for x in _list(d.get("trials"), f"{where}: trials")],
            first_run=FirstRun(
                _figures(first.get("objectives"), f"{where}: first_run.objectives"),
                _intervals(first.get("ci95"), f"{where}: first_run.ci95"),
                _counts(first.get("n"), f"{where}: first_run.n"),
            ),
            reference=ReferenceStep.from_dict(d.get("reference"), f"{where}: reference"),
            spread_cv=None if spread is None else _figures(spread, f"{where}: spread_cv"),
            repeats=None
            if repeats is None
            else [_figures(r, f"{where}: repeats[{i}]") for i, r in enumerate(_list(repeats, f"{where}: repeats"))],
        )


@dataclass(frozen=True)
class ObjectiveDoc:
    name: str
    direction: str
    """max or min (``maximize``/``minimize`` in files of other tools: read alike)."""
    label: str

    @property
    def maximise(self) -> bool:
        return self.direction in ("max", "maximize")


@dataclass(frozen=True)
class StudyDoc:
    """``pareto.json``: a study's front with its intervals, rewritten after each trial."""

    status: str
    """running, then how the study ended (complete, interrupted, exhausted)."""
    study: str
    storage: str
    objectives: tuple[ObjectiveDoc, ...]
    sla: tuple[str, ...]
    reference_load_users: int | None
    trials_run: int
    feasible: int
    infeasible: int
    hypervolume: float | None
    hypervolume_reference: list[float | None]
    pareto: tuple[MemberDoc, ...]
    candidates: tuple[MemberDoc, ...]
    settled: bool | None
    run_to_run_cv: dict[str, float | None] | None
    noise: str
    reruns: int
    early_stopped: dict[str, float]
    """``trials`` stopped early and the measurement ``saved_s``."""
    updated_at: float | None

    def as_dict(self) -> dict[str, object]:
        return {
            "status": self.status,
            "study": self.study,
            "storage": self.storage,
            "objectives": [{"name": o.name, "direction": o.direction, "label": o.label} for o in self.objectives],
            "sla": list(self.sla),
            "reference_load_users": self.reference_load_users,
            "trials_run": self.trials_run,
            "feasible": self.feasible,
            "infeasible": self.infeasible,
            "hypervolume": self.hypervolume,
            "hypervolume_reference": self.hypervolume_reference,
            "pareto": [m.as_dict() for m in self.pareto],
            "candidates": [m.as_dict() for m in self.candidates],
            "settled": self.settled,
            "run_to_run_cv": self.run_to_run_cv,
            "noise": self.noise,
            "reruns": self.reruns,
            "early_stopped": self.early_stopped,
            "updated_at": self.updated_at,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, object], where: str = "pareto.json") -> StudyDoc:
        """Raises: DocError for a document of another shape."""
        if not isinstance(d.get("pareto"), list):
            raise DocError(f"{where}: not a study result (no pareto list)")
        objectives = []
        for i, o in enumerate(_list(d.get("objectives"), f"{where}: objectives")):
            od = _obj(o, f"{where}: objectives[{i}]")
            name = _str(od.get("name"))
            objectives.append(ObjectiveDoc(name, _str(od.get("direction")), _str(od.get("label")) or name))
        users = d.get("reference_load_users")
        settled = d.get("settled")
        rtr = d.get("run_to_run_cv")
        return cls(
            status=_str(d.get("status")),
            study=_str(d.get("study")),
            storage=_str(d.get("storage")),
            objectives=tuple(objectives),
            sla=tuple(str(x) for x in _list(d.get("sla"), f"{where}: sla")),
            reference_load_users=None if users is None else _int(users, f"{where}: reference_load_users"),
            trials_run=_int(d.get("trials_run"), f"{where}: trials_run"),
            feasible=_int(d.get("feasible"), f"{where}: feasible"),
            infeasible=_int(d.get("infeasible"), f"{where}: infeasible"),
            hypervolume=_num(d.get("hypervolume"), f"{where}: hypervolume"),
            hypervolume_reference=[
                _num(x, f"{where}: hypervolume_reference")
                for x in _list(d.get("hypervolume_reference"), f"{where}: hypervolume_reference")
            ],
            pareto=tuple(
                MemberDoc.from_dict(m, f"{where}: pareto[{i}]") for i, m in enumerate(_list(d["pareto"], where))
            ),
            candidates=tuple(
                MemberDoc.from_dict(m, f"{where}: candidates[{i}]")
                for i, m in enumerate(_list(d.get("candidates"), f"{where}: candidates"))
            ),
            settled=None if settled is None else bool(settled),
            run_to_run_cv=None if rtr is None else _figures(rtr, f"{where}: run_to_run_cv"),
            noise=_str(d.get("noise")),
            reruns=_int(d.get("reruns"), f"{where}: reruns"),
            early_stopped=_present(_figures(d.get("early_stopped"), f"{where}: early_stopped")),
            updated_at=_num(d.get("updated_at"), f"{where}: updated_at"),
        )

    def best(self, n: int) -> list[MemberDoc]:
        """The ``n`` best members of the front by its first objective."""
        if not self.objectives:
            return []
        first = self.objectives[0]
        sign = -1.0 if first.maximise else 1.0
        return sorted(self.pareto, key=lambda m: sign * (m.objectives.get(first.name) or 0.0))[:n]
