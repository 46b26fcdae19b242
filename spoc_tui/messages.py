"""Messages from workers to the UI: past-tense facts carrying frozen snapshots."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from textual.message import Message

from spoc_tui.collectors.poller import GpuTick, SourceStatus, VllmTick
from spoc_tui.core.gpu import TpGroupReport
from spoc_tui.load.ramp import RampProgress


@dataclass
class ServersSampled(Message):
    tick: VllmTick

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
class SourceStatusChanged(Message):
    status: SourceStatus


@dataclass
class RampProgressed(Message):
    progress: RampProgress

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, RampProgressed) and message.progress.phase == self.progress.phase == "measuring"


@dataclass
class RampFinished(Message):
    status: str
    """complete, stopped_early, interrupted, server_failed, error."""
    message: str


@dataclass
class TuneEvent(Message):
    """An event of a running tuning study (posted from its thread)."""

    kind: str
    data: dict[str, Any]


@dataclass
class TuneFinished(Message):
    status: str
    """complete, interrupted, exhausted, error."""
    message: str
