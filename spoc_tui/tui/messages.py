"""Messages to the app: from workers, past-tense facts carrying frozen snapshots; from screens,
intents (:class:`Intent`). The jobs' own (:class:`JobReport`, :class:`Intent`) go to the job that
takes them (:class:`spoc_tui.tui.jobs.Jobs`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from textual.message import Message

from spoc_tui.core.hardware.gpu import TpGroupReport
from spoc_tui.core.monitor.model import HeadroomShown
from spoc_tui.core.monitor.snapshots import GpuTick, SourceStatus, VllmTick
from spoc_tui.core.ramp.status import RampEnd
from spoc_tui.core.tuning.docs import StudyStatus
from spoc_tui.load.ramp import RampProgress
from spoc_tui.tune import events

RampOutcome = RampEnd | Literal["error"]
StudyOutcome = StudyStatus | Literal["error"]


class Intent(Message):
    """What the operator asked of a job from its screen (start, stop, copy): the app hands it to
    the job that takes it."""


class JobReport(Message):
    """A job's worker reporting back (progress, an end, an estimate): to the job that runs it."""


@dataclass
class ServersSampled(Message):
    tick: VllmTick
    gpus_follow: bool = False
    """A GPU tick read at the same moment is posted right after this one: the app draws this
    tick with it, in one repaint, and the panels both feed (verdicts, roofline, TP groups, status,
    events) once."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, ServersSampled)


@dataclass
class GpusSampled(Message):
    """All GPUs from every GPU source, with TP-group reports."""

    tick: GpuTick
    groups: tuple[TpGroupReport, ...] = ()
    note: str | None = None
    """Why there is no GPU data, when there is none."""

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, GpusSampled)


@dataclass
class HeadroomEstimated(JobReport):
    """Each server's live headroom, worked out in a worker thread."""

    results: dict[str, HeadroomShown]


@dataclass
class SourceStatusChanged(Message):
    status: SourceStatus


@dataclass
class RampProgressed(JobReport):
    progress: RampProgress

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RampProgressed) and message.progress.phase == self.progress.phase == "measuring"


@dataclass
class JobFinished(JobReport):
    """A ramp's or a study's end: how it ended (one of :attr:`OK`: a result to read) and a line
    for the operator."""

    status: str
    message: str
    OK: ClassVar[tuple[str, ...]] = ()

    @property
    def ok(self) -> bool:
        return self.status in self.OK


@dataclass
class RampFinished(JobFinished):
    status: RampOutcome
    OK = ("complete", "stopped_early")


@dataclass
class TuneEvent(JobReport):
    """An event of a running tuning study (posted from its thread)."""

    event: events.TuneEvent


@dataclass
class TuneFinished(JobFinished):
    status: StudyOutcome
    OK = ("complete", "exhausted")


@dataclass
class ProfileProgressed(JobReport):
    text: str


@dataclass
class ProfileFinished(JobReport):
    """A profile of the running step: its breakdown, or why there is none."""

    breakdown: object | None
    """A :class:`spoc_tui.profile.analyze.Breakdown` (None: ``error`` says why)."""
    error: str | None = None
