"""The Textual app: composes the monitor's sampler and the jobs, and routes messages.

Screens never call the app's methods: they post typed intents (``LoadScreen.StartRequested``,
``TuneScreen.StopRequested``...: :class:`~spoc_tui.tui.messages.Intent`) and workers post
facts; the app hands the jobs' own to :class:`~spoc_tui.tui.jobs.Jobs`, and draws the sources'
on the monitor.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from textual import on
from textual.app import SystemCommand
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen

from spoc_tui.config import Settings, data_dir
from spoc_tui.core.monitor.events import EventLog
from spoc_tui.core.monitor.model import MonitorModel
from spoc_tui.core.monitor.recording import Recorder
from spoc_tui.core.ramp.sla import DEFAULT_SLA, parse_sla
from spoc_tui.core.redact import redact_url
from spoc_tui.tui.ascii import AsciiDriver, AsciiScreenshots, wants_ascii
from spoc_tui.tui.jobs import Jobs
from spoc_tui.tui.messages import GpusSampled, Intent, JobReport, ServersSampled, SourceStatusChanged
from spoc_tui.tui.sampling import Sampler
from spoc_tui.tui.screens.capacity import CapacityScreen
from spoc_tui.tui.screens.confirm import ConfirmScreen
from spoc_tui.tui.screens.help import HelpScreen
from spoc_tui.tui.screens.load import LoadScreen
from spoc_tui.tui.screens.monitor import MonitorScreen
from spoc_tui.tui.screens.tune import TuneScreen
from spoc_tui.tui.sources import MonitorSources, NothingToMonitor, build_sources, check_sources
from spoc_tui.tui.svg import fix_file
from spoc_tui.tui.terminal import require_terminal
from spoc_tui.tui.textual_mode import FastTruecolorApp, QuietDriver
from spoc_tui.tui.widgets.badge import WorkBadge
from spoc_tui.twin.live import LiveHeadroom
from spoc_tui.twin.model import read_twin
from spoc_tui.twin.publish import HeadroomCollector, parse_address, serve_metrics

logger = logging.getLogger(__name__)

FREEZE_AFTER_S = 2.0
"""When the heap built at start-up is handed to the collector's permanent generation."""

__all__ = ["MonitorSources", "NothingToMonitor", "SpocApp", "run_monitor"]


def title_for(s: Settings) -> str:
    """The monitor's title: what it watches, how often and over what window."""
    if s.prometheus_url:
        target = f"Prometheus {redact_url(s.prometheus_url)}"
    elif s.vllm_urls:
        shown = [redact_url(u) for u in s.vllm_urls[:2]]
        target = ", ".join(shown) + (f" +{len(s.vllm_urls) - 2}" if len(s.vllm_urls) > 2 else "")
    else:
        target = "no vLLM server (--url)"
    return f"spoc-tui · {target} · refresh {s.interval:g}s · window {s.window:g}s"


def last_ramp() -> Path | None:
    """The newest ramp result in the data folder (the Capacity screen's and spoc ramp's default)."""
    found = sorted((data_dir() / "ramps").glob("*/ramp.json"), key=lambda p: p.stat().st_mtime)
    return found[-1].parent if found else None


class SpocApp(AsciiScreenshots, FastTruecolorApp[int]):
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
    monitor: MonitorScreen

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
        self.ascii_mode = wants_ascii() if ascii_mode is None else ascii_mode
        """Draw in ASCII (a terminal whose locale is not UTF-8: :mod:`spoc_tui.tui.ascii`)."""
        super().__init__(driver_class=AsciiDriver if self.ascii_mode else (QuietDriver if os.name == "posix" else None))
        self.install_fast_truecolor()
        self.recorder = recorder
        """Where what the monitor sees is written (``--record``), or None."""
        self.settings = settings
        self.sources = sources if sources is not None else build_sources(settings)
        self.start_workers = start_workers
        self.paused = False
        self._frozen = False
        """Whether the start-up heap is frozen out of the collector's full passes (:meth:`_freeze_heap`)."""
        self._servers_due: ServersSampled | None = None
        """A servers' tick whose GPU tick follows: both are drawn by the GPUs' handler, in one
        repaint (two handlers a message apart were two passes of the compositor a second)."""
        self.events = EventLog()
        """What happened, for the monitor's Events panel: sources, throttling, ramps, studies."""
        self.limits = parse_sla(settings.sla) if settings.sla else ()
        self.model = MonitorModel(
            settings.window,
            self.limits,
            self.events,
            settings.vllm_urls,
            [redact_url(u) for u in settings.dcgm_urls],
            headroom_alert=settings.headroom_alert,
        )
        """What the monitor shows, worked out from the sources' ticks (its screen draws it)."""
        self.jobs = Jobs(self, self.sources, self.limits or parse_sla(DEFAULT_SLA), published)
        self.sampler = Sampler(self, settings, self.sources, self.jobs.headroom.feed)

    @property
    def headroom(self) -> LiveHeadroom | None:
        """Each server's headroom, learned from the scrapes (``--no-headroom``: None)."""
        return self.jobs.headroom.live

    def title_text(self) -> str:
        return title_for(self.settings)

    def on_mount(self) -> None:
        self.monitor = MonitorScreen(self.title_text(), self.model, self.settings.gpu_cost_per_hour)
        self.push_screen(self.monitor)
        note = self.jobs.headroom.learning_note()
        if note is not None:
            self.monitor.learning_headroom(note)
        if self.start_workers and self.sampler.start():
            self.set_timer(FREEZE_AFTER_S, self._freeze_heap)

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

    # -- messages: the sources' drawn on the monitor, the jobs' handed to them ---------------
    def on_servers_sampled(self, message: ServersSampled) -> None:
        self.record(lambda r: r.servers(message.tick))
        if message.gpus_follow:
            self._servers_due = message
        else:
            self.monitor.apply_servers(message)
        self.jobs.headroom.sampled(message)
        if self.start_workers:
            self.sampler.ask_models(message)

    def on_gpus_sampled(self, message: GpusSampled) -> None:
        groups = [[int(m.gpu.gpu) for m in rep.members if m.gpu.gpu.isdigit()] for rep in message.groups]
        self.record(lambda r: r.gpus(message.tick, groups, message.note))
        due, self._servers_due = self._servers_due, None
        if due is not None:
            self.monitor.apply_servers(due)
        self.monitor.apply_gpus(message)

    def on_source_status_changed(self, message: SourceStatusChanged) -> None:
        s = message.status
        self.record(lambda r: r.status(s))
        self.monitor.apply_status(s)
        if s.up:
            self.notify(f"{s.source}: connected", severity="information", timeout=3)
        else:
            self.notify(s.reason or f"{s.source}: down", severity="error", timeout=6)

    @on(Intent)
    @on(JobReport)
    def _to_jobs(self, message: Message) -> None:
        """A screen's intent or a job's report, to the job that takes it."""
        self.jobs.take(message)

    def record(self, write: Callable[[Recorder], None]) -> None:
        """Into the recording (``--record``), if any: a failing disk stops it with a notice, never
        the monitor."""
        if self.recorder is None:
            return
        try:
            write(self.recorder)
        except OSError as e:
            self.notify(f"recording stopped: {self.recorder.path}: {e.strerror or e}", severity="error", timeout=10)
            self.recorder = None

    # -- screens ------------------------------------------------------------------------------
    @property
    def load_screen(self) -> LoadScreen:
        """Installed once, so a ramp keeps its screen while the operator watches the monitor."""
        if not self.is_screen_installed("load"):
            url = self.settings.vllm_urls[0] if self.settings.vllm_urls else None
            self.install_screen(LoadScreen(url, read_twin), "load")
        screen = self.get_screen("load")
        assert isinstance(screen, LoadScreen)
        return screen

    @property
    def tune_screen(self) -> TuneScreen:
        if not self.is_screen_installed("tune"):
            self.install_screen(TuneScreen(self.settings.tune_launch), "tune")
        screen = self.get_screen("tune")
        assert isinstance(screen, TuneScreen)
        return screen

    def action_load(self) -> None:
        if self.screen is not self.load_screen:
            self.action_monitor()  # from another screen: one screen above the monitor at a time
            self.push_screen("load")
            self.call_after_refresh(self.set_background)
        self.call_after_refresh(self.jobs.headroom.confirm)  # once the form is on screen

    def action_tune(self) -> None:
        if self.screen is not self.tune_screen:
            self.action_monitor()
            self.push_screen("tune")
            self.call_after_refresh(self.set_background)

    def action_capacity(self) -> None:
        """Open the Capacity screen, prefilled from what the monitor sees."""
        if isinstance(self.screen, CapacityScreen):
            return
        self.action_monitor()
        screen = CapacityScreen(last_ramp())
        self.push_screen(screen)
        self.call_after_refresh(self.set_background)
        seen = self.monitor.seen()
        if seen is not None:
            self.call_after_refresh(screen.prefill, *seen)

    def action_monitor(self) -> None:
        while len(self.screen_stack) > 2 and self.screen is not self.monitor:
            self.pop_screen()
        if self.screen is not self.monitor and len(self.screen_stack) > 1:
            self.pop_screen()

    def set_background(self) -> None:
        """Every screen's badge says what runs (the monitor's status line too)."""
        work = self.jobs.running()
        text = " and ".join(work) + " running" if work else ""
        self.monitor.set_background(text)
        for screen in {*self.screen_stack, self.load_screen, self.tune_screen}:
            for badge in screen.query(WorkBadge):
                badge.show(text)

    def ask(self, question: str, yes: Callable[[], None], no: Callable[[], None] | None = None) -> None:
        """A yes/no box; ``yes`` or ``no`` runs with the answer (Esc is no)."""

        def answered(answer: bool | None) -> None:
            if answer:
                yes()
            elif no is not None:
                no()

        self.push_screen(ConfirmScreen(question), answered)

    # -- keys -----------------------------------------------------------------------------------
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

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "close_keys":  # False where the Keys panel is not shown: Esc reaches the screen
            from textual.widgets import HelpPanel

            return bool(self.screen.query(HelpPanel))
        return True

    def action_close_keys(self) -> None:
        self.action_hide_help_panel()

    async def action_quit(self) -> None:
        work = self.jobs.running()
        if not work or isinstance(self.screen, ConfirmScreen):
            self._quit_now()
            return

        self.ask(
            f"{' and '.join(work).capitalize()} is running. Quit and stop it?\n"
            "Finished steps and trials are kept on disk (a study can be resumed with ctrl+e).",
            self._quit_now,
        )

    def _quit_now(self) -> None:
        self.jobs.tune.stop()  # its server stops; if we exit first, the server's guard stops it
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
        if self.jobs.ramp.running():
            yield SystemCommand(
                "Stop ramp", "Stop the running load ramp (finished steps are kept)", self.jobs.ramp.stop
            )
        if self.jobs.tune.running():
            yield SystemCommand("Stop study", "Stop the running study (trials are kept)", self.jobs.tune.stop)


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
                "title": title_for(settings),
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
