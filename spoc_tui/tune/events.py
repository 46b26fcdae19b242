"""What a running study tells its listener (the CLI's printer, the Tune screen), defined once.

Each event is a frozen dataclass; a listener takes a :data:`TuneEvent` and matches on its type.
The study calls its listener on its own thread: a listener that touches a UI posts a message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from spoc_tui.core.tuning.docs import StudyStatus, TrialRecord
from spoc_tui.core.tuning.space import Config
from spoc_tui.load.ramp import RampProgress
from spoc_tui.tune.records import Front


@dataclass(frozen=True, slots=True)
class StudyOpened:
    """The study is open; ``records`` are the trials it already has (resume, shared study)."""

    study: str
    storage: str
    """Its storage URL, password hidden."""
    records: tuple[TrialRecord, ...]


@dataclass(frozen=True, slots=True)
class Note:
    """Something the operator should know (a leftover server stopped, a seed queued...)."""

    message: str


@dataclass(frozen=True, slots=True)
class TrialSkipped:
    """A proposal that will not run (a repeat, a broken condition)."""

    number: int
    config: Config
    reason: str
    seeded: str | None
    """Why it was queued, when it was (its skip is worth telling); None for NSGA-II's own."""


@dataclass(frozen=True, slots=True)
class TrialStarted:
    number: int
    ordinal: int
    """This trial's place in the study (1 = first), of ``total``."""
    total: int
    config: Config
    flags: tuple[str, ...]
    seeded: str | None


@dataclass(frozen=True, slots=True)
class ServerStarting:
    """The evaluator is starting the trial's server (its log is at ``log``)."""

    argv: tuple[str, ...]
    port: int
    log: str
    number: int | None = None
    """The trial (filled in by the study; evaluators do not know it)."""


@dataclass(frozen=True, slots=True)
class ServerReady:
    start_s: float
    url: str
    number: int | None = None


@dataclass(frozen=True, slots=True)
class TrialRampProgressed:
    """Progress of the trial's ramp."""

    progress: RampProgress
    number: int | None = None


@dataclass(frozen=True, slots=True)
class TrialDone:
    """A trial ran to a verdict (or was interrupted); ``front`` is the study's after it."""

    record: TrialRecord
    front: Front


@dataclass(frozen=True, slots=True)
class OthersDone:
    """Trials other workers of a shared study finished."""

    records: tuple[TrialRecord, ...]


@dataclass(frozen=True, slots=True)
class RepeatStarted:
    number: int
    index: int
    total: int
    flags: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RepeatDone:
    record: TrialRecord


@dataclass(frozen=True, slots=True)
class StudyDone:
    status: StudyStatus
    front: Front
    message: str


EvaluatorEvent = ServerStarting | ServerReady | TrialRampProgressed
"""What an evaluator reports while it scores one configuration."""

TuneEvent = (
    StudyOpened
    | Note
    | TrialSkipped
    | TrialStarted
    | ServerStarting
    | ServerReady
    | TrialRampProgressed
    | TrialDone
    | OthersDone
    | RepeatStarted
    | RepeatDone
    | StudyDone
)

Listener = Callable[[TuneEvent], None]
