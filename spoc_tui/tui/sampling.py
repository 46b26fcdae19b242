"""The monitor's sources read on their clocks: the vLLM servers and the GPUs together each tick
(``--interval``), Prometheus on its own thread, each server's models once; what they read is
posted to the app as messages (:mod:`spoc_tui.tui.messages`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Protocol

from textual.message import Message
from textual.worker import Worker, get_current_worker

from spoc_tui.collectors.promql import PromQLPoller
from spoc_tui.collectors.scrape import SourceError, served_models
from spoc_tui.config import Settings
from spoc_tui.core.errors import SpocError, first_line
from spoc_tui.core.hardware.gpu import GpuSample, analyse_groups
from spoc_tui.core.monitor.snapshots import GpuTick, SourceStatus
from spoc_tui.core.redact import redact_url
from spoc_tui.tui.jobs.host import WorkerHost
from spoc_tui.tui.messages import GpusSampled, ServersSampled, SourceStatusChanged
from spoc_tui.tui.sources import MonitorSources
from spoc_tui.twin.history import PROMETHEUS_EVERY_S, PrometheusFeed

logger = logging.getLogger(__name__)


class SamplerHost(WorkerHost, Protocol):
    """The app as the sampler sees it."""

    paused: bool


class Sampler:
    """Reads ``sources`` for ``host`` (see the module's text); ``feed``: the live headroom's
    learners fed from Prometheus's history, read once its poller is up."""

    def __init__(
        self, host: SamplerHost, settings: Settings, sources: MonitorSources, feed: PrometheusFeed | None = None
    ) -> None:
        self.host = host
        self.settings = settings
        self.sources = sources
        self.feed = feed
        self._groups_cache: tuple[float, list[list[int]]] | None = None
        self._asked_models: set[str] = set()

    def start(self) -> bool:
        """Start every reading there is; whether a tick a second runs (servers or GPUs read
        directly, or a GPU note to show)."""
        ticks = self.sources.vllm is not None or self.reads_gpus() or bool(self.sources.gpu_note)
        if ticks:
            self.poll()
        if self.sources.promql is not None:
            self.host.run_worker(
                self._poll_prometheus, group="prometheus", exclusive=True, exit_on_error=False, thread=True
            )
        return ticks

    def poll(self) -> Worker[None]:
        """The tick a second, in a worker (tests start it themselves)."""
        return self.host.run_worker(self._poll(), group="sources", exclusive=True, exit_on_error=False)

    async def _poll(self) -> None:
        """One tick a second (``--interval``) for every HTTP and NVML source together: the vLLM
        servers and the GPUs are read at the same moment and their messages posted back to back,
        so the screen draws them in one pass (two ticks out of step were two full repaints a
        second). Ticks keep to a fixed grid: a slow read delays one tick, not every later one."""
        host, interval = self.host, self.settings.interval
        due = time.monotonic()
        note = bool(self.sources.gpu_note)  # no GPU to read: the panel's note, on the first tick only
        while True:
            if not host.paused:
                reads: list[Coroutine[object, object, list[Message]]] = []
                if self.sources.vllm is not None:
                    reads.append(self._servers_tick())
                if self.reads_gpus() or note:
                    reads.append(self._gpus_tick())
                    note = False
                elif not reads:
                    return  # nothing read each tick (the servers through Prometheus: their own worker)
                batch: list[Message] = []
                for messages in await asyncio.gather(*reads, return_exceptions=True):
                    if isinstance(messages, BaseException):  # a defect in one kind: the other goes on
                        if not isinstance(messages, Exception):
                            raise messages  # cancelled: the app is closing
                        logger.error("a poll failed", exc_info=messages)
                        messages = [SourceStatusChanged(SourceStatus("poller", False, first_line(messages, 120)))]
                    batch.extend(messages)
                if any(isinstance(m, GpusSampled) for m in batch):
                    for m in batch:
                        if isinstance(m, ServersSampled):
                            m.gpus_follow = True
                for m in batch:
                    host.post_message(m)
            due += interval
            now = time.monotonic()
            if due < now:  # fell behind (a slow read, a suspended process): start the grid again
                due = now + interval
            await asyncio.sleep(due - now)

    def reads_gpus(self) -> bool:
        """Whether a GPU source is read each tick (not where there is only a note saying why none
        is: a tick a second of no GPUs redrew the panels under it, a sixth of the monitor's CPU
        over Prometheus)."""
        return self.sources.dcgm is not None or bool(self.sources.gpu_readers)

    async def _servers_tick(self) -> list[Message]:
        poller = self.sources.vllm
        assert poller is not None
        try:
            # a slow source holds the tick up for one interval at most; its read goes on
            tick = await poller.poll(wait_s=self.settings.interval)
        except Exception as e:  # a defect, not a source's failure: shown, and polling goes on
            logger.exception("polling the vLLM sources")
            return [SourceStatusChanged(SourceStatus("vLLM poller", False, first_line(e, 120)))]
        return [*(SourceStatusChanged(ch) for ch in tick.changes), ServersSampled(tick)]

    def _poll_prometheus(self) -> None:
        worker = get_current_worker()
        settings = self.settings
        assert self.sources.promql is not None
        poller = PromQLPoller(self.sources.promql, settings.window, settings.prometheus_url or "prometheus")
        tried = -PROMETHEUS_EVERY_S
        while not worker.is_cancelled:
            if not self.host.paused:
                tick, change = poller.poll()
                if change is not None:
                    self.host.post_message(SourceStatusChanged(change))
                if tick is not None:
                    self.host.post_message(ServersSampled(tick))
                if (
                    self.feed is not None
                    and poller.on_scrape is None
                    and time.monotonic() - tried >= PROMETHEUS_EVERY_S
                ):
                    tried = time.monotonic()
                    try:  # its last hour into the headroom; then each scrape the monitor's reads hold
                        self.feed.read()
                        poller.on_scrape = self.feed.add
                    except SourceError as e:  # the poll says Prometheus failed; tried again
                        logger.info("the headroom's read of Prometheus's history failed: %s", e)
            # Sleep in short slices so a cancelled worker (quit) stops within 0.1 s.
            deadline = time.monotonic() + settings.interval
            while not worker.is_cancelled and time.monotonic() < deadline:
                time.sleep(0.1)

    async def _gpus_tick(self) -> list[Message]:
        src = self.sources
        gpus: list[GpuSample] = []
        stale: frozenset[str] = frozenset()
        statuses: tuple[SourceStatus, ...] = ()
        changes: tuple[SourceStatus, ...] = ()
        if src.dcgm is not None:
            try:
                t = await src.dcgm.poll(wait_s=self.settings.interval)
            except Exception as e:  # a defect, not a source's failure: shown, and polling goes on
                logger.exception("polling the DCGM sources")
                changes = (SourceStatus("DCGM poller", False, first_line(e, 120)),)
            else:
                gpus.extend(t.gpus)
                stale, statuses, changes = t.stale, t.statuses, t.changes
        for reader in src.gpu_readers:
            try:
                gpus.extend(await asyncio.to_thread(reader.read))
            except Exception as e:  # a GPU fell off the bus, an NVML hiccup: shown, and polling goes on
                changes = changes + (SourceStatus(getattr(reader, "source", "nvml"), False, f"NVML read failed: {e}"),)
        groups = await self._tp_groups()
        reports = tuple(analyse_groups(groups, gpus)) if groups else ()
        return [
            *(SourceStatusChanged(ch) for ch in changes),
            GpusSampled(GpuTick(tuple(gpus), stale, changes, statuses), reports, src.gpu_note),
        ]

    async def _tp_groups(self) -> list[list[int]] | None:
        src = self.sources
        if src.tp_groups:
            return src.tp_groups
        if src.find_groups is None:
            return None
        now = time.monotonic()
        if self._groups_cache is None or now - self._groups_cache[0] > 30:
            try:
                found = await asyncio.to_thread(src.find_groups)
            except Exception as e:  # process tables change under us; the groups are a hint
                logger.debug("finding TP groups failed: %s", first_line(e))
                found = []
            self._groups_cache = (now, found)
        return self._groups_cache[1] or None

    def ask_models(self, message: ServersSampled) -> None:
        """Once per server, once it answers: its models' max-model-len from /v1/models (the
        metrics do not say)."""
        for u in self.settings.vllm_urls:
            name = redact_url(u)
            if name not in self._asked_models and any(sv.source == name for sv in message.tick.servers):
                self._asked_models.add(name)
                self.host.run_worker(self._ask_models(u, name), group="models", exit_on_error=False)

    async def _ask_models(self, url: str, name: str) -> None:
        try:
            models = await served_models(url, self.settings.api_key)
        except SpocError as e:
            logger.info("reading /v1/models: %s", first_line(e))
            return
        self.host.monitor.set_models(name, models)
