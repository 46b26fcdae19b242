"""The result files' codec: ``ramp.json``, ``pareto.json`` and the study's ``trials.jsonl``.

Every file (each line of trials.jsonl) carries ``"schema": SCHEMA``. Schema 1 is what this
project wrote before the field existed (no ``schema`` key): its keys are the same, so it reads
through the same decoder, and what it lacks (a knee's ``cause``) is rebuilt from the steps.
A file of a newer schema than this program knows is refused with a message naming both.

Users' scripts read these files: a key keeps its name and meaning across schema versions; a new
version only adds keys (and says so in CHANGELOG.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar, cast

from spoc_tui.core.errors import InputError
from spoc_tui.core.files import JsonLineError, json_lines
from spoc_tui.core.hardware.presets import PresetError, read_json_object
from spoc_tui.core.jsonsafe import json_safe
from spoc_tui.core.ramp.knee import Knee
from spoc_tui.core.ramp.rules import ARRIVALS, AUTO_SPAWN, SEED, STEP_S, WARMUP_S, ArrivalMode, StepRules
from spoc_tui.core.ramp.status import RampStatus
from spoc_tui.core.ramp.steps import Json, StepSummary, json_float, json_int
from spoc_tui.core.tuning.docs import DocError, StudyDoc, TrialRecord

SCHEMA = 3
"""1: files written before the schema field; 2: ``schema`` added, the knee's ``cause`` and
``client_saturated`` added; 3: a ramp predicted by the twin (``predicted``, ``twin``,
``prediction``): an older reader must refuse it rather than take it for a measurement."""


class ResultError(InputError):
    """A result file that cannot be read: missing, not JSON, not this kind of result, or written
    by a newer spoc-tui (exit code 2)."""


def schema_of(doc: Json, where: str) -> int:
    """The file's schema version (1 when it has none).

    Raises:
        ResultError: a version newer than :data:`SCHEMA`, or not a version at all.
    """
    v = doc.get("schema", 1)
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ResultError(f"{where}: schema {v!r} is not a version this program wrote")
    if v > SCHEMA:
        raise ResultError(
            f"{where}: written by a newer spoc-tui (schema {v}; this one reads schema 1 to {SCHEMA}): upgrade spoc-tui "
            "to read it"
        )
    return v


def dumps(doc: Mapping[str, object], indent: int | None = 2) -> str:
    """A result document as JSON with its schema first (non-finite numbers as null)."""
    return json.dumps(
        json_safe({"schema": SCHEMA, **doc}), indent=indent, allow_nan=False, separators=None if indent else (",", ":")
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RampHeader:
    """ramp.json's settings, before its steps: what was run and how its figures are defined. One
    value for a measured ramp (``spoc ramp``, the Load screen, a study's trial) and a predicted one
    (``spoc twin predict``: ``predicted``, ``twin``, ``prediction``), written by :meth:`as_dict`
    and read back by :meth:`from_doc`, a setting a file lacks read as the ramp that wrote it ran."""

    url: str = ""
    """Redacted (no credentials) by its writer."""
    model: str = "?"
    profile: Json = field(default_factory=dict)
    """The workload as :meth:`~spoc_tui.workload.Workload.as_dict` gives it (a trace replay: its name)."""
    sla: tuple[str, ...] = ()
    users: str = ""
    """The levels asked for, as ``--users``/``--rate`` described them (``1,2,4``, ``auto:256``, ``rate:1,2``)."""
    load: str = ""
    """How the load was made, in words."""
    step_seconds: float = STEP_S
    max_step_seconds: float | None = None
    warmup_seconds: float = WARMUP_S
    spawn_rate: float | None = None
    """``--spawn-rate``; None: the ramp's own rule (written as :data:`AUTO_SPAWN`)."""
    arrivals: str = ARRIVALS
    budget_seconds: float | None = None
    seed: int = SEED
    started_at: float | None = None
    abort_factor: float | None = None
    """A measured ramp's (none for a prediction)."""
    workers: int | None = None
    intervals: str | None = None
    metric_definitions: str | None = None
    trace: Json | None = None
    """A trace replay's selection (:meth:`~spoc_tui.core.traces.read.TraceSource.header`)."""
    prompt_lengths: str | None = None
    """How the load generator made prompt lengths (a measured ramp's, once its runner said)."""
    stop_reason: str | None = None
    predicted: bool = False
    """Predicted by the twin (``spoc twin predict``), not measured."""
    twin: Json | None = None
    prediction: Json | None = None

    @classmethod
    def of_rules(cls, rules: StepRules) -> RampHeader:
        """The header with ``rules`` in force (the longest step and the budget as they apply), for a
        measured ramp's and a predicted one's to add what they say besides (``dataclasses.replace``)."""
        return cls(step_seconds=rules.step_s, max_step_seconds=rules.step_limit_s, warmup_seconds=rules.warmup_s,
                   spawn_rate=rules.spawn_rate or None, arrivals=rules.arrivals, budget_seconds=rules.budget,
                   seed=rules.seed)  # fmt: skip

    def step_rules(self) -> StepRules:
        """The step rules the ramp ran by, as its header says them (the longest step and the budget
        as they applied)."""
        return StepRules(step_s=self.step_seconds, warmup_s=self.warmup_seconds, max_step_s=self.max_step_seconds,
                         budget_s=self.budget_seconds, spawn_rate=self.spawn_rate,
                         arrivals=cast(ArrivalMode, self.arrivals), seed=self.seed)  # fmt: skip

    _ALWAYS = (
        "url", "model", "profile", "sla", "users", "load", "step_seconds", "max_step_seconds", "warmup_seconds",
    )  # fmt: skip
    _LATER = ("arrivals", "budget_seconds", "seed", "started_at")
    _SAID = ("intervals", "metric_definitions", "trace", "prompt_lengths", "stop_reason", "twin", "prediction")

    def as_dict(self) -> dict[str, object]:
        """The header's keys as ramp.json has them: the settings, then what only one kind of ramp
        says (a key left out where it has nothing to say)."""
        out: dict[str, object] = {"predicted": True} if self.predicted else {}
        out.update((k, getattr(self, k)) for k in self._ALWAYS)
        out["sla"] = list(self.sla)
        if not self.predicted:
            out.update(abort_factor=self.abort_factor, workers=self.workers)
        out["spawn_rate"] = self.spawn_rate if self.spawn_rate is not None else AUTO_SPAWN
        out.update((k, getattr(self, k)) for k in self._LATER)
        out.update((k, v) for k in self._SAID if (v := getattr(self, k)) is not None)
        return out

    @classmethod
    def from_doc(cls, doc: Json) -> RampHeader:
        """The header of a ramp.json of any schema this project wrote (its other keys ignored)."""
        sla, prof = doc.get("sla"), doc.get("profile")
        trace, twin, prediction = doc.get("trace"), doc.get("twin"), doc.get("prediction")

        def text(k: str) -> str | None:
            v = doc.get(k)
            return v if isinstance(v, str) else None

        return cls(
            url=str(doc.get("url") or ""),
            model=str(doc.get("model") or "?"),
            profile=prof if isinstance(prof, Mapping) else {},
            sla=tuple(str(x) for x in sla) if isinstance(sla, list) else (),
            users=str(doc.get("users") or ""),
            load=text("load") or "",
            step_seconds=_or(json_float(doc, "step_seconds"), STEP_S),
            max_step_seconds=json_float(doc, "max_step_seconds"),
            warmup_seconds=_or(json_float(doc, "warmup_seconds"), WARMUP_S),
            spawn_rate=json_float(doc, "spawn_rate"),
            arrivals=text("arrivals") or ARRIVALS,
            budget_seconds=json_float(doc, "budget_seconds"),
            seed=_or(json_int(doc, "seed"), SEED),
            started_at=json_float(doc, "started_at"),
            abort_factor=json_float(doc, "abort_factor"),
            workers=json_int(doc, "workers"),
            intervals=text("intervals"),
            metric_definitions=text("metric_definitions"),
            trace=trace if isinstance(trace, Mapping) else None,
            prompt_lengths=text("prompt_lengths"),
            stop_reason=text("stop_reason"),
            predicted=doc.get("predicted") is True,
            twin=twin if isinstance(twin, Mapping) else None,
            prediction=prediction if isinstance(prediction, Mapping) else None,
        )


T = TypeVar("T")


def _or(v: T | None, default: T) -> T:
    return default if v is None else v


@dataclass(frozen=True, slots=True)
class RampDoc:
    """A ramp result as read back: its header, steps and knee as typed values."""

    schema: int
    status: str
    """As written (:data:`RampStatus`; a file of another program may say anything)."""
    header: RampHeader
    steps: tuple[StepSummary, ...]
    knee: Knee
    updated_at: float | None = None
    path: str = ""

    @property
    def model(self) -> str:
        return self.header.model

    @property
    def url(self) -> str:
        return self.header.url

    @property
    def sla(self) -> tuple[str, ...]:
        return self.header.sla

    @property
    def stop_reason(self) -> str:
        return self.header.stop_reason or ""

    @property
    def plan(self) -> str:
        """The levels asked for (:attr:`RampHeader.users`)."""
        return self.header.users

    @property
    def step_seconds(self) -> float:
        return self.header.step_seconds

    @property
    def started_at(self) -> float | None:
        return self.header.started_at

    @property
    def predicted(self) -> bool:
        return self.header.predicted

    @property
    def gpus(self) -> int | None:
        """How many GPUs the ramp saw beside the server (its steps' DCGM readings), or None."""
        for s in self.steps:
            if s.server.gpus:
                return len(s.server.gpus)
        return None


def ramp_doc(
    header: RampHeader, steps: Sequence[StepSummary], knee: Knee, status: RampStatus, updated_at: float
) -> dict[str, object]:
    """ramp.json's document: the header, the status, every step and the knee."""
    return {
        **header.as_dict(),
        "status": status,
        "steps": [s.as_dict() for s in steps],
        "knee": knee.as_dict(),
        "updated_at": updated_at,
    }


def encode_ramp(
    header: RampHeader, steps: Sequence[StepSummary], knee: Knee, status: RampStatus, updated_at: float
) -> str:
    """ramp.json's text (:func:`ramp_doc`)."""
    return dumps(ramp_doc(header, steps, knee, status, updated_at))


def decode_ramp(doc: Json, where: str = "ramp.json") -> RampDoc:
    """A ramp result of any schema this project wrote.

    Raises:
        ResultError: not a ramp result, or a newer schema.
    """
    version = schema_of(doc, where)
    raw = doc.get("steps")
    if not isinstance(raw, list) or not isinstance(doc.get("knee", {}), Mapping):
        raise ResultError(f"{where}: not a ramp result (no steps)")
    try:
        steps = tuple(StepSummary.from_dict(s) for s in raw if isinstance(s, Mapping))
    except (TypeError, ValueError) as e:
        raise ResultError(f"{where}: a step does not read as a ramp step ({e})") from None
    knee_doc = doc.get("knee")
    knee = Knee.from_dict(knee_doc if isinstance(knee_doc, Mapping) else {}, steps)
    return RampDoc(
        schema=version,
        status=str(doc.get("status") or "unknown"),
        header=RampHeader.from_doc(doc),
        steps=steps,
        knee=knee,
        updated_at=json_float(doc, "updated_at"),
        path=where,
    )


def read_json(path: Path, kind: str) -> dict[str, object]:
    """A JSON object from a result file.

    Raises:
        ResultError: missing, unreadable, not JSON, not an object.
    """
    try:
        return read_json_object(path, unreadable=f"not a {kind}")
    except PresetError as e:
        raise ResultError(str(e)) from None


def read_ramp(path: str | Path) -> RampDoc:
    """``ramp.json`` (or the folder holding it), any schema this project wrote.

    Raises:
        ResultError: missing, unreadable, not a ramp result, or a newer schema.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "ramp.json"
    return decode_ramp(read_json(p, "ramp result"), str(p))


def read_pareto(path: str | Path) -> StudyDoc:
    """``pareto.json`` (or the study folder holding it), checked for its schema and shape; its
    keys are described in docs/results.md.

    Raises:
        ResultError: missing, unreadable, not a study result, or a newer schema.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "pareto.json"
    doc = read_json(p, "study result")
    schema_of(doc, str(p))
    try:
        return StudyDoc.from_dict(doc, str(p))
    except DocError as e:
        raise ResultError(str(e)) from None


def read_trials(path: str | Path) -> list[TrialRecord]:
    """``trials.jsonl`` (or the study folder holding it): one record per finished trial, each
    checked for its schema and shape; a line cut short by a crash (the last) is left out.

    Raises:
        ResultError: missing or unreadable file, a bad line before the last, or a newer schema.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "trials.jsonl"
    try:
        lines = p.read_text().splitlines()
    except FileNotFoundError:
        raise ResultError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ResultError(f"{p}: not a trial log ({e})") from None
    out: list[TrialRecord] = []
    try:
        for n, rec in json_lines(lines):
            if not isinstance(rec, dict):
                raise ResultError(f"{p}:{n}: not a trial record (not a JSON object)")
            schema_of(rec, f"{p}:{n}")
            try:
                out.append(TrialRecord.from_dict(rec, f"{p}:{n}"))
            except DocError as e:
                raise ResultError(str(e)) from None
    except JsonLineError as e:
        if not e.last:  # the last: the write a crash cut short
            raise ResultError(f"{p}:{e.lineno}: not a trial record ({e.detail})") from None
    return out
