"""The Textual app: owns the workers and routes their messages to the screens.

Screens never call the app's methods: they post typed requests (``LoadScreen.StartRequested``,
``TuneScreen.StopRequested``...) that the app handles here, as workers post facts.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import Callable, Coroutine, Iterable
from pathlib import Path

from textual import work
from textual.app import SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.worker import Worker, get_current_worker

from spoc_tui.collectors.promql import PromQLPoller
from spoc_tui.collectors.scrape import SourceError, served_models
from spoc_tui.config import Settings, data_dir
from spoc_tui.core.errors import SpocError, first_line
from spoc_tui.core.hardware.gpu import GpuSample, analyse_groups
from spoc_tui.core.monitor.events import EventLog
from spoc_tui.core.monitor.model import HeadroomShown
from spoc_tui.core.monitor.recording import Recorder
from spoc_tui.core.monitor.snapshots import GpuTick, SourceStatus
from spoc_tui.core.ramp.sla import DEFAULT_SLA, parse_sla
from spoc_tui.core.redact import redact_url
from spoc_tui.tui.ascii import AsciiDriver, AsciiScreenshots, wants_ascii
from spoc_tui.tui.jobs import JobsApp
from spoc_tui.tui.messages import (
    GpusSampled,
    HeadroomEstimated,
    ServersSampled,
    SourceStatusChanged,
)
from spoc_tui.tui.screens.confirm import ConfirmScreen
from spoc_tui.tui.screens.help import HelpScreen
from spoc_tui.tui.screens.monitor import MonitorScreen
from spoc_tui.tui.sources import MonitorSources, NothingToMonitor, build_sources, check_sources
from spoc_tui.tui.svg import fix_file
from spoc_tui.tui.terminal import require_terminal
from spoc_tui.tui.textual_private import QuietDriver
from spoc_tui.tune.study import TuneSession
from spoc_tui.twin.headroom import Headroom
from spoc_tui.twin.headroom_confirm import HeadroomClaim, confirm_speeds, write_traffic_trace
from spoc_tui.twin.history import HISTORY_S, PROMETHEUS_EVERY_S, PrometheusFeed
from spoc_tui.twin.live import CpuMeter, LiveHeadroom
from spoc_tui.twin.model import read_twin
from spoc_tui.twin.passive import MIN_WINDOWS
from spoc_tui.twin.publish import HeadroomCollector, parse_address, serve_metrics
from spoc_tui.twin.traffic import WINDOW_S

logger = logging.getLogger(__name__)

FREEZE_AFTER_S = 2.0
"""When the heap built at start-up is handed to the collector's permanent generation."""

__all__ = ["MonitorSources", "NothingToMonitor", "SpocApp", "run_monitor"]


class SpocApp(AsciiScreenshots, JobsApp):
    CSS_PATH = "app.tcss"
    TITLE = "spoc-tui"
    SCREENS = {"help": HelpScreen}
    BINDINGS = [
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
        # screen switches that work from anywhere, a text field included (letters go to fields)
        Binding("f1", "push_screen('help')", "Help", show=False, priority=True),
        Binding("f2", "monitor", "Monitor", show=False, priority=True),
        Binding("f3", "load", "Load", show=False, priority=True),
        Binding("f4", "tune", "Tune", show=False, priority=True),
        Binding("f5", "capacity", "Capacity", show=False, priority=True),
        # Esc closes the Keys panel (ctrl+p, "Keys") first; otherwise it goes on to the screen
        Binding("escape", "close_keys", "Close keys", show=False, priority=True),
    ]

    def __init__(
        self,
        settings: Settings,
        sources: MonitorSources | None = None,
        start_workers: bool = True,
        recorder: Recorder | None = None,
        ascii_mode: bool | None = None,
        published: HeadroomCollector | None = None,
    ) -> None:
        """``published``: where each headroom worked out is served to Prometheus (``--serve-metrics``)."""
        self.published = published
        self.ascii_mode = wants_ascii() if ascii_mode is None else ascii_mode
        """Draw in ASCII (a terminal whose locale is not UTF-8: :mod:`spoc_tui.tui.ascii`)."""
        super().__init__(driver_class=AsciiDriver if self.ascii_mode else (QuietDriver if os.name == "posix" else None))
        self.install_fast_truecolor()
        self.recorder = recorder
        """Where what the monitor sees is written (``--record``), or None."""
        self._ramp_worker: Worker[None] | None = None
        self._ramp_badge = ""
        """The running ramp in a few words (:attr:`RampProgress.badge`), on the monitor's status line."""
        self._tune_session: TuneSession | None = None
        self._profiling = False
        self.settings = settings
        self.sources = sources if sources is not None else build_sources(settings)
        self.start_workers = start_workers
        self.paused = False
        self._groups_cache: tuple[float, list[list[int]]] | None = None
        self._frozen = False
        """Whether the start-up heap is frozen out of the collector's full passes (:meth:`_freeze_heap`)."""
        self._asked_models: set[str] = set()
        self._servers_due: ServersSampled | None = None
        """A servers' tick whose GPU tick follows: both are drawn by the GPUs' handler, in one
        repaint (two handlers a message apart were two passes of the compositor a second)."""
        self.events = EventLog()
        """What happened, for the monitor's Events panel: sources, throttling, ramps, studies."""
        self.limits = parse_sla(settings.sla) if settings.sla else ()
        self.headroom: LiveHeadroom | None = None
        """Each server's headroom, learned from the scrapes (``--no-headroom``: None)."""
        self._feed: PrometheusFeed | None = None
        """With ``--prometheus``: the headroom's learners fed from what Prometheus stored (its
        last hour at the start)."""
        if settings.headroom and (self.sources.vllm is not None or self.sources.promql is not None):
            prior = read_twin(Path(settings.twin).expanduser()) if settings.twin else None
            self.headroom = LiveHeadroom(self.limits or parse_sla(DEFAULT_SLA), prior, seats=settings.max_num_seqs)
            self.headroom.meter = CpuMeter()  # the estimates take what the monitor leaves of 1.45 % of a core
            if self.sources.vllm is not None:
                self.sources.vllm.on_scrape = self.headroom.add
            elif self.sources.promql is not None:
                self._feed = PrometheusFeed(self.sources.promql.scrapes, self.headroom)
        self._estimating = False

    def title_text(self) -> str:
        return self.title_for(self.settings)

    @staticmethod
    def title_for(s: Settings) -> str:
        if s.prometheus_url:
            target = f"Prometheus {redact_url(s.prometheus_url)}"
        elif s.vllm_urls:
            shown = [redact_url(u) for u in s.vllm_urls[:2]]
            target = ", ".join(shown) + (f" +{len(s.vllm_urls) - 2}" if len(s.vllm_urls) > 2 else "")
        else:
            target = "no vLLM server (--url)"
        return f"spoc-tui · {target} · refresh {s.interval:g}s · window {s.window:g}s"

    def on_mount(self) -> None:
        self.monitor = MonitorScreen(
            self.title_text(),
            self.settings.window,
            self.settings.gpu_cost_per_hour,
            self.limits,
            self.events,
            vllm_urls=self.settings.vllm_urls,
            dcgm_urls=self.settings.dcgm_urls,
        )
        self.monitor.model.headroom_alert = self.settings.headroom_alert
        self.push_screen(self.monitor)
        if self.headroom is not None:
            first = MIN_WINDOWS * WINDOW_S / 60
            every = f"then every {self.headroom.refresh_s / 60:.0f} min"
            self.monitor.learning_headroom(
                f"headroom: learning from Prometheus's last {HISTORY_S / 60:.0f} min (the first estimate once "
                f"read, {every})"
                if self._feed is not None
                else f"headroom: learning from the scrapes (the first estimate in about {first:.0f} min, {every})"
            )
        if not self.start_workers:
            return
        if self.sources.vllm is not None or self._reads_gpus() or self.sources.gpu_note:
            self._poll()
            self.set_timer(FREEZE_AFTER_S, self._freeze_heap)
        if self.sources.promql is not None:
            self._poll_prometheus()

    def _freeze_heap(self) -> None:
        """Everything alive once the screen is up (Textual, the widgets, the modules: ~95k
        objects) goes to the collector's permanent generation, so its full collections no longer
        walk it: one cost ~100 ms every ~15 s, a sixth of the monitor's CPU. Undone on exit."""
        gc.collect()
        gc.freeze()
        self._frozen = True

    async def on_unmount(self) -> None:
        if self._frozen:
            gc.unfreeze()  # what was frozen can be collected again (tests run many apps in one process)
            self._frozen = False
        if self.recorder is not None:
            self.recorder.close()
        await self.sources.aclose()

    # -- workers: sample, post, wait ------------------------------------------------------
    @work(group="sources", exclusive=True, exit_on_error=False)
    async def _poll(self) -> None:
        """One tick a second (``--interval``) for every HTTP and NVML source together: the vLLM
        servers and the GPUs are read at the same moment and their messages posted back to back,
        so the screen draws them in one pass (two ticks out of step were two full repaints a
        second). Ticks keep to a fixed grid: a slow read delays one tick, not every later one."""
        interval = self.settings.interval
        due = time.monotonic()
        note = bool(self.sources.gpu_note)  # no GPU to read: the panel's note, on the first tick only
        while True:
            if not self.paused:
                reads: list[Coroutine[object, object, list[Message]]] = []
                if self.sources.vllm is not None:
                    reads.append(self._servers_tick())
                if self._reads_gpus() or note:
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
                    self.post_message(m)
            due += interval
            now = time.monotonic()
            if due < now:  # fell behind (a slow read, a suspended process): start the grid again
                due = now + interval
            await asyncio.sleep(due - now)

    def _reads_gpus(self) -> bool:
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

    @work(group="prometheus", exclusive=True, exit_on_error=False, thread=True)
    def _poll_prometheus(self) -> None:
        worker = get_current_worker()
        assert self.sources.promql is not None
        poller = PromQLPoller(self.sources.promql, self.settings.window, self.settings.prometheus_url or "prometheus")
        tried = -PROMETHEUS_EVERY_S
        while not worker.is_cancelled:
            if not self.paused:
                tick, change = poller.poll()
                if change is not None:
                    self.post_message(SourceStatusChanged(change))
                if tick is not None:
                    self.post_message(ServersSampled(tick))
                if (
                    self._feed is not None
                    and poller.on_scrape is None
                    and time.monotonic() - tried >= PROMETHEUS_EVERY_S
                ):
                    tried = time.monotonic()
                    try:  # its last hour into the headroom; then each scrape the monitor's reads hold
                        self._feed.read()
                        poller.on_scrape = self._feed.add
                    except SourceError as e:  # the poll says Prometheus failed; tried again
                        logger.info("the headroom's read of Prometheus's history failed: %s", e)
            # Sleep in short slices so a cancelled worker (quit) stops within 0.1 s.
            deadline = time.monotonic() + self.settings.interval
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

    # -- message handlers own the UI state -------------------------------------------------
    def on_servers_sampled(self, message: ServersSampled) -> None:
        if self.recorder is not None:
            self._record(lambda r: r.servers(message.tick))
        if message.gpus_follow:
            self._servers_due = message
        else:
            self.monitor.apply_servers(message)
        if self.published is not None and self.headroom is not None:  # each server's series from its first tick
            new = {sv.source for sv in message.tick.servers} - self.published.servers()
            self.published.publish({src: Headroom.none("learning", self.headroom.limits) for src in new})
        if self.headroom is not None and self.headroom.meter is not None:
            self.headroom.meter.sample(busy=self._estimating)
        if self.headroom is not None and not self._estimating and self.headroom.work_due():
            self._estimating = True
            if self.headroom.meter is not None:
                self.headroom.meter.busy()
            self._estimate_headroom()
        if self.start_workers:
            for u in self.settings.vllm_urls:
                name = redact_url(u)
                if name not in self._asked_models and any(sv.source == name for sv in message.tick.servers):
                    self._asked_models.add(name)
                    self._ask_models(u, name)

    @work(group="headroom", exclusive=True, exit_on_error=False, thread=True)
    def _estimate_headroom(self) -> None:
        """Every server's headroom, or its ledger's newest window graded (seconds of CPU, off the UI
        thread), posted back."""
        assert self.headroom is not None
        try:
            found, fresh = self.headroom.work()
            if self.published is not None:
                self.published.publish(found, fresh)
        except Exception as e:  # a defect: said on the line, and the monitor goes on
            logger.exception("working out the headroom")
            shown = {"": HeadroomShown(f"headroom: failed ({first_line(e, 120)}); see spoc.log", None, False)}
        else:
            later = self.headroom.next_note()
            shown = {
                src: HeadroomShown(
                    h.line() + (f"; {later}" if later else ""),
                    h.estimate,
                    h.identified,
                    h.ledger.line() if h.ledger is not None else "",
                    fresh,
                )
                for src, h in found.items()
            }
        self.post_message(HeadroomEstimated(shown))

    def action_load(self) -> None:
        super().action_load()
        self.call_after_refresh(self._confirm_headroom)  # once the form is on screen

    def _confirm_headroom(self) -> None:
        """With a headroom worked out, the Load form is pre-filled to confirm it: the traffic it
        replayed written as a trace, at speeds around the estimate."""
        if self.headroom is None or not self.settings.vllm_urls:
            return
        # the Load screen ramps the first server: its headroom, by its name as the poller shows it
        h = self.headroom.results.get(redact_url(self.settings.vllm_urls[0]))
        if h is None or not h.identified or h.traffic is None or not h.estimate:
            return
        estimate = h.estimate
        path = data_dir() / "headroom" / f"traffic-{int(time.time())}.jsonl"
        try:
            rows = write_traffic_trace(h, path)
        except (OSError, ValueError) as e:
            logger.warning("writing the headroom's traffic: %s", e)
            return
        mins = round(h.traffic.seconds / 60) if h.traffic is not None else 0
        self.load_screen.prefill_trace(
            str(path),
            confirm_speeds(estimate),
            f"pre-filled to confirm the live headroom x{estimate:.2g}: the last {mins} min of traffic "
            f"({rows} requests, estimated from the server's counters and histograms) at speeds around it",
            HeadroomClaim.of(h, str(path)),
        )

    def on_headroom_estimated(self, message: HeadroomEstimated) -> None:
        self._estimating = False
        if self.recorder is not None:
            self._record(lambda r: r.headroom(message.results))
        self.monitor.apply_headroom(message.results)

    @work(group="models", exit_on_error=False)
    async def _ask_models(self, url: str, name: str) -> None:
        """Once per server: its models' max-model-len from /v1/models (the metrics do not say)."""
        try:
            models = await served_models(url, self.settings.api_key)
        except SpocError as e:
            logger.info("reading /v1/models: %s", first_line(e))
            return
        self.monitor.set_models(name, models)

    def on_gpus_sampled(self, message: GpusSampled) -> None:
        if self.recorder is not None:
            groups = [[int(m.gpu.gpu) for m in rep.members if m.gpu.gpu.isdigit()] for rep in message.groups]
            self._record(lambda r: r.gpus(message.tick, groups, message.note))
        due, self._servers_due = self._servers_due, None
        if due is not None:
            self.monitor.apply_servers(due)
        self.monitor.apply_gpus(message)

    def _record(self, write: Callable[[Recorder], None]) -> None:
        """A failing disk stops the recording with a notice, never the monitor."""
        assert self.recorder is not None
        try:
            write(self.recorder)
        except OSError as e:
            self.notify(f"recording stopped: {self.recorder.path}: {e.strerror or e}", severity="error", timeout=10)
            self.recorder = None

    def on_source_status_changed(self, message: SourceStatusChanged) -> None:
        s = message.status
        if self.recorder is not None:
            self._record(lambda r: r.status(s))
        self.monitor.apply_status(s)
        if s.up:
            self.notify(f"{s.source}: connected", severity="information", timeout=3)
        else:
            self.notify(s.reason or f"{s.source}: down", severity="error", timeout=6)

    def action_toggle_pause(self) -> None:
        self.paused = not self.paused
        self.monitor.set_paused(self.paused)

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        """F8: an SVG of the screen, in the data folder unless told otherwise."""
        folder = Path(path) if path else data_dir() / "screenshots"
        folder.mkdir(parents=True, exist_ok=True)
        path = self.save_screenshot(filename, path=str(folder))
        fix_file(path)  # renders right offline too
        self.notify(f"screenshot saved: {Path(path)}", timeout=5)

    def _keys_shown(self) -> bool:
        from textual.widgets import HelpPanel

        return bool(self.screen.query(HelpPanel))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "close_keys":
            return self._keys_shown()  # False: the binding is skipped and Esc reaches the screen
        return True

    def action_close_keys(self) -> None:
        self.action_hide_help_panel()

    async def action_quit(self) -> None:
        work = self.running_work()
        if not work or isinstance(self.screen, ConfirmScreen):
            self._quit_now()
            return

        self.ask(
            f"{' and '.join(work).capitalize()} is running. Quit and stop it?\n"
            "Finished steps and trials are kept on disk (a study can be resumed with ctrl+e).",
            self._quit_now,
        )

    def _quit_now(self) -> None:
        if self._tune_session is not None:
            self._tune_session.stop()  # its server stops; if we exit first, the server's guard stops it
        self.exit(0)

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        """Every app action in the command palette (ctrl+p), not only Textual's defaults (less
        Textual's own Screenshot and Quit: ours save to the data folder and ask before stopping
        running work, and one of each is enough)."""
        ours = {"Screenshot", "Quit"}
        yield from (c for c in super().get_system_commands(screen) if c.title not in ours)
        yield SystemCommand("Quit", "Quit spoc (asks first while a ramp or study runs) (q, ctrl+c)", self.action_quit)
        yield SystemCommand("Monitor", "Back to the live monitor (F2)", self.action_monitor)
        yield SystemCommand("Load ramp", "Step load up until the SLA breaks (l, F3)", self.action_load)
        yield SystemCommand("Tune", "NSGA-II study over server flags (t, F4)", self.action_tune)
        yield SystemCommand("Capacity", "KV-cache arithmetic and the fleet plan (c, F5)", self.action_capacity)
        yield SystemCommand("Pause / resume", "Stop or restart refreshing (p)", self.action_toggle_pause)
        yield SystemCommand(
            "Chart span", "Cycle the charts over 1, 5, 15, 60 min (w)", self.monitor.action_chart_window
        )
        yield SystemCommand("Screenshot", "Save an SVG of the screen to the data folder (F8)", self.action_screenshot)
        yield SystemCommand("Help", "Keys and how the figures are computed (?, F1)", lambda: self.push_screen("help"))
        if self.running_work():
            if self._ramp_worker is not None:
                yield SystemCommand("Stop ramp", "Stop the running load ramp (finished steps are kept)", self.stop_ramp)
            if self._tune_session is not None:
                yield SystemCommand("Stop study", "Stop the running study (trials are kept)", self.stop_tune)


def run_monitor(settings: Settings, sources: MonitorSources | None = None, record: str | None = None) -> int:
    """Build the sources, check there is something to watch, and run the app.

    Raises:
        NothingToMonitor: no server and no GPU source (exit code 2).
        RecordingError: ``record`` cannot be written (exit code 2).
    """
    if sources is None:
        sources = build_sources(settings)
    check_sources(sources)
    recorder = None
    if record:
        recorder = Recorder(
            record,
            {
                "title": SpocApp.title_for(settings),
                "window_s": settings.window,
                "interval_s": settings.interval,
                "sla": settings.sla,
                "tp_groups": settings.tp_groups,
            },
        )
    published, stop = None, None
    try:
        require_terminal("spoc monitor")
        if settings.serve_metrics is not None and settings.headroom:
            published = HeadroomCollector()
            stop = serve_metrics(parse_address(settings.serve_metrics), published)
        return int(SpocApp(settings, sources, recorder=recorder, published=published).run() or 0)
    finally:
        if recorder is not None:
            recorder.close()
        if stop is not None:
            stop()
