"""The TUI's jobs: a load ramp and a profile of its running step (the Load screen), a tuning
study (the Tune screen) and the live headroom (the monitor). Each is an object that owns its
worker, the messages it takes (its screen's intents, its worker's reports: :meth:`handlers`) and
its files; the app hands each message to :meth:`Jobs.take` and asks :meth:`Jobs.running` before
it quits."""

from __future__ import annotations

from textual.message import Message

from spoc_tui.core.ramp.sla import Limit
from spoc_tui.tui.jobs.headroom import HeadroomJob
from spoc_tui.tui.jobs.host import Handlers, JobHost
from spoc_tui.tui.jobs.ramp import ProfileJob, RampJob
from spoc_tui.tui.jobs.tune import TuneJob
from spoc_tui.tui.sources import MonitorSources
from spoc_tui.twin.publish import HeadroomCollector

__all__ = ["HeadroomJob", "JobHost", "Jobs", "ProfileJob", "RampJob", "TuneJob"]


class Jobs:
    """Every job of one app, and which takes each message."""

    def __init__(
        self, host: JobHost, sources: MonitorSources, limits: tuple[Limit, ...], published: HeadroomCollector | None
    ) -> None:
        self.ramp = RampJob(host)
        self.profile = ProfileJob(host)
        self.tune = TuneJob(host)
        self.headroom = HeadroomJob(host, sources, limits, published)
        self._takes: Handlers = {}
        for job in (self.ramp, self.profile, self.tune, self.headroom):
            self._takes.update(job.handlers())

    def messages(self) -> tuple[type[Message], ...]:
        """Every message a job takes (the app routes these to :meth:`take`)."""
        return tuple(self._takes)

    def take(self, message: Message) -> None:
        """``message`` to the job that takes it."""
        self._takes[type(message)](message)

    def running(self) -> list[str]:
        """What would be lost by quitting now, in a few words each."""
        return [w for w in (self.ramp.running(), self.tune.running(), self.profile.running()) if w]
