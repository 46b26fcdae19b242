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
from dataclasses import dataclass
from pathlib import Path

from spoc_tui.core.errors import InputError
from spoc_tui.core.files import JsonLineError, json_lines
from spoc_tui.core.hardware.presets import PresetError, read_json_object
from spoc_tui.core.jsonsafe import json_safe
from spoc_tui.core.ramp.knee import Knee
from spoc_tui.core.ramp.status import RampStatus
from spoc_tui.core.ramp.steps import Json, StepSummary, json_float
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


@dataclass(frozen=True, slots=True)
class RampDoc:
    """A ramp result as read back: its steps and knee as typed values, the header as written."""

    schema: int
    status: str
    """As written (:data:`RampStatus`; a file of another program may say anything)."""
    model: str
    url: str
    sla: tuple[str, ...]
    steps: tuple[StepSummary, ...]
    knee: Knee
    stop_reason: str = ""
    plan: str = ""
    """The levels asked for, as ``--users``/``--rate`` described them (``1,2,4``, ``auto:256``, ``rate:1,2``)."""
    step_seconds: float | None = None
    started_at: float | None = None
    updated_at: float | None = None
    path: str = ""
    predicted: bool = False
    """Predicted by the twin (``spoc twin predict``), not measured."""

    @property
    def gpus(self) -> int | None:
        """How many GPUs the ramp saw beside the server (its steps' DCGM readings), or None."""
        for s in self.steps:
            if s.server.gpus:
                return len(s.server.gpus)
        return None


def encode_ramp(
    header: Mapping[str, object], steps: Sequence[StepSummary], knee: Knee, status: RampStatus, updated_at: float
) -> str:
    """ramp.json's text: the header, the status, every step and the knee."""
    return dumps(
        {
            **header,
            "status": status,
            "steps": [s.as_dict() for s in steps],
            "knee": knee.as_dict(),
            "updated_at": updated_at,
        }
    )


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
    sla = doc.get("sla")

    return RampDoc(
        schema=version,
        status=str(doc.get("status") or "unknown"),
        model=str(doc.get("model") or "?"),
        url=str(doc.get("url") or ""),
        sla=tuple(str(x) for x in sla) if isinstance(sla, list) else (),
        steps=steps,
        knee=knee,
        stop_reason=str(doc.get("stop_reason") or ""),
        plan=str(doc.get("users") or ""),
        step_seconds=json_float(doc, "step_seconds"),
        started_at=json_float(doc, "started_at"),
        updated_at=json_float(doc, "updated_at"),
        path=where,
        predicted=doc.get("predicted") is True,
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
