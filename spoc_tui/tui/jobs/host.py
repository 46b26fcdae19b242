"""What a job asks of the app it runs in (:class:`JobHost`), and the one question it may ask
before it starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from textual.message import Message
from textual.notifications import SeverityLevel
from textual.worker import ResultType, Worker, WorkType

from spoc_tui.config import Settings
from spoc_tui.core.monitor.events import EventLog
from spoc_tui.core.monitor.recording import Recorder

if TYPE_CHECKING:
    from spoc_tui.tui.screens.load import LoadScreen
    from spoc_tui.tui.screens.monitor import MonitorScreen
    from spoc_tui.tui.screens.tune import TuneScreen


Handlers = dict[type[Message], Callable[[Any], None]]
"""The messages a job takes (the screens' intents, its worker's reports) and what takes each."""


class WorkerHost(Protocol):
    """The app as what runs in its workers sees it: where messages go, how a worker starts, the
    monitor."""

    @property
    def monitor(self) -> MonitorScreen: ...

    def post_message(self, message: Message) -> bool: ...
    def run_worker(
        self,
        work: WorkType[ResultType],
        name: str | None = "",
        group: str = "default",
        description: str = "",
        exit_on_error: bool = True,
        start: bool = True,
        exclusive: bool = False,
        thread: bool = False,
    ) -> Worker[ResultType]: ...


class JobHost(WorkerHost, Protocol):
    """The app as its jobs see it: the settings, the event log, the screens a job draws on, the
    worker and message machinery, and the badge every screen shows while work runs."""

    settings: Settings
    events: EventLog

    @property
    def load_screen(self) -> LoadScreen: ...
    @property
    def tune_screen(self) -> TuneScreen: ...

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = True,
    ) -> None: ...
    def copy_to_clipboard(self, text: str) -> None: ...
    def ask(self, question: str, yes: Callable[[], None], no: Callable[[], None] | None = None) -> None: ...
    def set_background(self) -> None: ...
    def record(self, write: Callable[[Recorder], None]) -> None: ...


def start_unless(
    host: JobHost,
    problem: str | None,
    kind: str,
    note: str,
    question: str,
    go: Callable[[], None],
    refused: Callable[[], None],
) -> None:
    """Start at once when there is no ``problem``; else ask, and note the start as a warning."""
    if problem is None:
        go()
        return

    def start() -> None:
        host.events.note(kind, note, "warning")
        go()

    host.ask(question, start, refused)
