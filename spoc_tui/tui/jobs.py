"""The TUI's jobs: a load ramp, a tuning study and a profile of the running step, started from
their screens, run in workers, their progress posted to the screens and the monitor's badge; and
what asks before one starts or the app quits with one running. :class:`JobsApp` is the base of
:class:`spoc_tui.tui.app.SpocApp`, which adds the monitor's polling and the app's keys."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.worker import Worker

from spoc_tui.collectors.scrape import base_url
from spoc_tui.config import Settings, data_dir
from spoc_tui.core.errors import InputError, SpocError, first_line
from spoc_tui.core.hardware.presets import gpu_for_model_name, model_preset
from spoc_tui.core.monitor.events import EventLog
from spoc_tui.core.ramp.knee import plan_text
from spoc_tui.load.ramp import RampConfig, RampError, RampProgress, RampResult, run_ramp
from spoc_tui.profile.analyze import Breakdown, analyse
from spoc_tui.profile.capture import CaptureConfig, capture, profiler_flag
from spoc_tui.profile.report import decode_roofline
from spoc_tui.profile.trace import read_trace
from spoc_tui.tui.messages import (
    ProfileFinished,
    ProfileProgressed,
    RampFinished,
    RampProgressed,
    TuneEvent,
    TuneFinished,
)
from spoc_tui.tui.screens.capacity import CapacityScreen
from spoc_tui.tui.screens.confirm import ConfirmScreen
from spoc_tui.tui.screens.load import LoadScreen
from spoc_tui.tui.screens.monitor import MonitorScreen
from spoc_tui.tui.screens.tune import TuneScreen
from spoc_tui.tui.sources import MonitorSources
from spoc_tui.tui.textual_private import FastTruecolorApp
from spoc_tui.tui.widgets.badge import WorkBadge
from spoc_tui.tui.widgets.panels import profile_text
from spoc_tui.tune import events as tune_events
from spoc_tui.tune.args import TuneArgs
from spoc_tui.tune.setup import build
from spoc_tui.tune.study import TuneSession
from spoc_tui.twin.model import Twin, read_twin
from spoc_tui.twin.shadow import ShadowTwin, twin_id

logger = logging.getLogger(__name__)

RampRunner = Callable[[RampConfig, Callable[[RampProgress], None]], Awaitable[RampResult]]
"""What runs a ramp started from the Load screen: :func:`~spoc_tui.load.ramp.run_ramp` (the
live backend), or the same experiment over the virtual backend (the TUI's tests)."""
ProfileCapture = Callable[[CaptureConfig, Callable[[str], None]], Awaitable[Path]]
"""What profiles the server for F6: :func:`~spoc_tui.profile.capture.capture` (the network), or
the same capture with its requests answered in memory (the TUI's tests)."""


class JobsApp(FastTruecolorApp[int]):
    """The app's background jobs and what shows them (see the module's text)."""

    settings: Settings
    sources: MonitorSources
    monitor: MonitorScreen
    events: EventLog
    _ramp_worker: Worker[None] | None
    _ramp_badge: str
    """The running ramp in a few words (:attr:`RampProgress.badge`), on the monitor's status line."""
    _tune_session: TuneSession | None
    _profiling: bool
    ramp_runner: RampRunner = staticmethod(run_ramp)
    """Runs a ramp (tests: on the experiment's virtual backend)."""
    profile_capture: ProfileCapture = staticmethod(capture)
    """Profiles the server (tests: its requests answered in memory)."""

    # -- load ramps -------------------------------------------------------------------------
    @property
    def load_screen(self) -> LoadScreen:
        """Installed once, so a ramp keeps its screen while the operator watches the monitor."""
        if not self.is_screen_installed("load"):
            url = self.settings.vllm_urls[0] if self.settings.vllm_urls else None
            self.install_screen(LoadScreen(url, read_twin), "load")
        screen = self.get_screen("load")
        assert isinstance(screen, LoadScreen)
        return screen

    def action_load(self) -> None:
        if self.screen is not self.load_screen:
            self.action_monitor()  # from another screen: one screen above the monitor at a time
            self.push_screen("load")
            self.call_after_refresh(self._set_background)

    def last_ramp(self) -> Path | None:
        """The newest ramp result in the data folder (the Load screen's and spoc ramp's default)."""
        found = sorted((data_dir() / "ramps").glob("*/ramp.json"), key=lambda p: p.stat().st_mtime)
        return found[-1].parent if found else None

    def action_capacity(self) -> None:
        """Open the Capacity screen, prefilled from what the monitor sees."""
        if isinstance(self.screen, CapacityScreen):
            return
        self.action_monitor()
        screen = CapacityScreen(self.last_ramp())
        self.push_screen(screen)
        self.call_after_refresh(self._set_background)
        seen = self.monitor.seen()
        if seen is not None:
            self.call_after_refresh(screen.prefill, *seen)

    def _start_unless(
        self,
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
            self.events.note(kind, note, "warning")
            go()

        self.ask(question, start, refused)

    @on(LoadScreen.StartRequested)
    def start_ramp(self, request: LoadScreen.StartRequested) -> None:
        busy = self.monitor.busy()
        self._start_unless(
            busy,
            "ramp",
            f"ramp started on a busy server ({busy})",
            f"The server is already busy: {busy}.\nThe ramp's steps would be measured on top of that traffic, "
            "so its knee would come out low. Start anyway?",
            lambda: self._start_ramp(request),
            lambda: self.load_screen.show_finished("not started: the server is busy with other traffic", False),
        )

    def _start_ramp(self, request: LoadScreen.StartRequested) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        cfg = RampConfig(
            url=self.settings.vllm_urls[0],
            workload=request.profile,
            plan=request.plan,
            limits=request.limits,
            out_dir=data_dir() / "ramps" / stamp,
            **request.rules.values(),
            workers=request.workers,
            api_key=self.settings.api_key,
            dcgm_urls=list(self.settings.dcgm_urls),
            trace=request.trace,
        )
        if isinstance(request.twin, Twin):  # its prediction of each step, kept on the step as it is measured
            name = twin_id(request.twin, request.twin_path or "twin.json")
            shadow = ShadowTwin(request.twin, name, request.profile, request.limits, rules=cfg.rules())
            cfg = replace(cfg, shadow=shadow)
        self.load_screen.set_running(True)
        steps = f"{request.trace.path.name} replayed" if request.trace else f"{cfg.step_s:g} s steps"
        self.events.note("ramp", f"ramp started: {plan_text(cfg.plan)}, {steps}")
        self._set_background()
        self._ramp_worker = self._run_ramp(cfg)

    @on(LoadScreen.StopRequested)
    def stop_ramp(self) -> None:
        if self._ramp_worker is not None:
            self._ramp_worker.cancel()

    @work(group="ramps", exclusive=True, exit_on_error=False)
    async def _run_ramp(self, cfg: RampConfig) -> None:
        try:
            result = await self.ramp_runner(cfg, self._post_ramp_progress)
        except RampError as e:
            self.post_message(RampFinished("error", str(e)))
        except asyncio.CancelledError:
            self.post_message(RampFinished("interrupted", f"stopped: finished steps kept in {cfg.out_dir}"))
            raise
        else:
            self.post_message(RampFinished(result.status, f"{result.status}: results in {cfg.out_dir}"))

    def _post_ramp_progress(self, progress: RampProgress) -> None:
        self.post_message(RampProgressed(progress))

    def on_ramp_progressed(self, message: RampProgressed) -> None:
        p = message.progress
        self.load_screen.show_progress(p)
        self._ramp_badge = p.badge
        self._set_background()
        if p.phase == "step_done" and p.steps:
            last = p.steps[-1]
            decision = last.decision
            said = {"meets": "meets the SLA", "breaks": f"breaks the SLA ({last.verdict.broken_limit})"}
            self.events.note(
                "ramp",
                f"ramp step {len(p.steps)} at {p.level_text}: {said.get(decision, decision)} (n={last.requests})",
                "warning" if decision == "breaks" else "info",
            )

    def on_ramp_finished(self, message: RampFinished) -> None:
        self._ramp_worker = None
        self._ramp_badge = ""
        self.events.note("ramp", f"ramp {message.message}", "info" if message.ok else "warning")
        self._set_background()
        self.load_screen.show_finished(message.message, message.ok)
        self.notify(message.message, severity="information" if message.ok else "warning", timeout=8)

    # -- profiling the running step ----------------------------------------------------------
    PROFILE_SECONDS = 5.0

    @on(LoadScreen.ProfileRequested)
    def start_profile(self) -> None:
        if not self.settings.trace_dir:
            self.load_screen.show_profile(
                Text(
                    "no trace folder: start spoc with --trace-dir DIR (or trace_dir in the config), the folder the "
                    f"server writes traces to; the server needs {profiler_flag('DIR')}",
                    style="bold yellow",
                )
            )
            return
        self._profiling = True
        self._set_background()
        self._run_profile(Path(self.settings.trace_dir))

    @work(group="profile", exclusive=True, exit_on_error=False)
    async def _run_profile(self, trace_dir: Path) -> None:
        cfg = CaptureConfig(
            url=base_url(self.settings.vllm_urls[0]),
            trace_dir=trace_dir,
            seconds=self.PROFILE_SECONDS,
            api_key=self.settings.api_key,
        )
        try:
            path = await self.profile_capture(cfg, self._post_profile_progress)
            self.post_message(ProfileProgressed(f"reading {path.name}…"))
            breakdown = await asyncio.to_thread(lambda: analyse(read_trace(path)))
        except SpocError as e:
            self.post_message(ProfileFinished(None, first_line(str(e))))
            return
        roof = self._decode_roofline()
        if roof is not None:
            breakdown.roofline_step_s, breakdown.roofline_basis = roof
        self.post_message(ProfileFinished(breakdown))

    def _post_profile_progress(self, text: str) -> None:
        self.post_message(ProfileProgressed(text))

    def _decode_roofline(self) -> tuple[float, str] | None:
        """From what the monitor sees: the served model as a preset, the GPU by its name."""
        seen = self.monitor.seen()
        if seen is None:
            return None
        names, _, gpu_label, tp = seen
        gpu = gpu_for_model_name(gpu_label)
        for name in names:
            try:
                model = model_preset(name)
            except InputError:
                continue
            if gpu is not None:
                return decode_roofline(model, gpu, tp or 1)
        return None

    def on_profile_progressed(self, message: ProfileProgressed) -> None:
        self.load_screen.show_profile_progress(message.text)

    def on_profile_finished(self, message: ProfileFinished) -> None:
        self._profiling = False
        self._set_background()
        if isinstance(message.breakdown, Breakdown):
            self.load_screen.show_profile(profile_text(message.breakdown))
        else:
            self.load_screen.show_profile(Text(f"profile failed: {message.error}", style="bold red"))
            self.notify(f"profile failed: {message.error}", severity="warning", timeout=8)

    # -- tuning studies ----------------------------------------------------------------------
    @property
    def tune_screen(self) -> TuneScreen:
        if not self.is_screen_installed("tune"):
            self.install_screen(TuneScreen(self.settings.tune_launch), "tune")
        screen = self.get_screen("tune")
        assert isinstance(screen, TuneScreen)
        return screen

    def action_tune(self) -> None:
        if self.screen is not self.tune_screen:
            self.action_monitor()
            self.push_screen("tune")
            self.call_after_refresh(self._set_background)

    @on(TuneScreen.CopyRequested)
    def copy_command(self, request: TuneScreen.CopyRequested) -> None:
        """A trial's command line to the clipboard, by OSC 52, which reaches it only where the
        terminal allows (tmux needs set-clipboard on): also to a file, said in the notice."""
        number, command = request.number, request.command
        self.copy_to_clipboard(command)
        try:
            folder = data_dir() / "commands"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"trial-{number}.sh"
            path.write_text(command + "\n")
            saved = f"; also saved to {path}"
        except OSError as e:
            saved = f"; not saved ({e.strerror or e})"
        self.notify(f"trial #{number}'s command line sent to the clipboard (OSC 52){saved}", timeout=8)

    @on(TuneScreen.StartRequested)
    def start_tune(self, request: TuneScreen.StartRequested) -> None:
        shared = self.gpus_in_use(request.args.launch)
        self._start_unless(
            shared,
            "tune",
            f"study started on GPUs already in use ({shared})",
            f"This host's GPUs already serve a model ({shared}).\nEach trial starts another vLLM on the same "
            "GPUs: it competes for their memory (it may not start) and for their time (its figures and the "
            "running server's both suffer). Start anyway?",
            lambda: self._start_tune(request),
            lambda: self.tune_screen.show_error("not started: this host's GPUs already serve a model"),
        )

    def gpus_in_use(self, launch: str) -> str | None:
        """When a study would start a second server on GPUs this host's NVML sees serving one (the
        simulator needs no GPU: None)."""
        if any(word in launch for word in ("spoc sim", "spoc demo", "spoc_tui.cli sim", "spoc_tui.cli demo")):
            return None
        gpus = self.monitor.model.gpu_samples
        local = [g for g in gpus if g.source == "nvml" and not g.simulated]  # NVML here, not a trace
        used = [g for g in local if (g.fb_used_mib or 0) > 1024 or (g.util_pct or 0) > 5]
        if not used:
            return None
        busy = self.monitor.busy()
        return f"{len(used)} of {len(local)} GPU(s) with memory in use" + (f", the server {busy}" if busy else "")

    def _start_tune(self, request: TuneScreen.StartRequested) -> None:
        args: TuneArgs = request.args
        screen = self.tune_screen
        root = data_dir() / "tunes"
        if args.resume:
            earlier = sorted(p.parent for p in root.glob("*/study.db"))
            if not earlier:
                screen.show_error(f"no earlier study in {root} to resume")
                return
            args.out_dir = str(earlier[-1])
        else:
            args.out_dir = str(root / time.strftime("%Y%m%d-%H%M%S"))
        args.api_key = self.settings.api_key
        try:
            cfg, evaluator = build(args)
        except (InputError, ValueError) as e:
            screen.show_error(str(e))
            return
        session = TuneSession(cfg, evaluator, self._post_tune_event)
        screen.show_error("")
        screen.prepare(cfg.objectives, cfg.limits, session.command)
        screen.set_running(True)
        self._tune_session = session
        self.events.note("tune", f"study started: {cfg.trials} trials, results in {cfg.out_dir}")
        self._set_background()
        self._run_tune(session)

    @on(TuneScreen.StopRequested)
    def stop_tune(self) -> None:
        if self._tune_session is not None:
            self._tune_session.stop()

    @work(group="tune", exclusive=True, exit_on_error=False, thread=True)
    def _run_tune(self, session: TuneSession) -> None:
        out = session.cfg.out_dir
        try:
            session.open()
            summary = session.run()
        except SpocError as e:  # TuneError, TuneFatal: worded for the user
            self.post_message(TuneFinished("error", str(e)))
        except Exception as e:  # a bug: shown, not a crash of the monitor
            logger.exception("tuning study failed")
            self.post_message(TuneFinished("error", f"internal error: {type(e).__name__}: {e}"))
        else:
            ran = len([r for r in summary.records if r.repeat_of is None])
            self.post_message(
                TuneFinished(
                    summary.status,
                    f"{summary.status}: {ran} trial(s), {len(summary.front.records)} Pareto-optimal; "
                    f"results in {out}/pareto.json" + (f"; {summary.message}" if summary.message else ""),
                )
            )

    def _post_tune_event(self, event: tune_events.TuneEvent) -> None:
        """The study's listener (called on its thread): the event goes to the UI as a message."""
        self.post_message(TuneEvent(event))

    def on_tune_event(self, message: TuneEvent) -> None:
        e = message.event
        if isinstance(e, tune_events.TrialDone):
            r = e.record
            self.events.note(
                "tune",
                f"trial #{r.number} {r.status}"
                + ("" if r.feasible else " (misses the SLA)")
                + f"; front of {len(e.front.records)}",
            )
        self.tune_screen.apply_event(e)

    def on_tune_finished(self, message: TuneFinished) -> None:
        self._tune_session = None
        self.events.note("tune", f"study {message.message}", "info" if message.ok else "warning")
        self._set_background()
        self.tune_screen.finished(message.message, message.ok)
        if message.status == "error":
            self.tune_screen.show_error(message.message)
        self.notify(message.message, severity="information" if message.ok else "warning", timeout=8)

    def running_work(self) -> list[str]:
        """What would be lost by quitting now."""
        out = []
        if self._ramp_worker is not None and self._ramp_worker.is_running:
            out.append(f"a load ramp ({self._ramp_badge})" if self._ramp_badge else "a load ramp")
        if self._tune_session is not None:
            out.append("a tuning study")
        if self._profiling:
            out.append("a profile of the running step")
        return out

    def _set_background(self) -> None:
        work = self.running_work()
        text = " and ".join(work) + " running" if work else ""
        self.monitor.set_background(text)
        for screen in {*self.screen_stack, self.load_screen, self.tune_screen}:  # every screen's badge
            for badge in screen.query(WorkBadge):
                badge.show(text)

    def action_monitor(self) -> None:
        while len(self.screen_stack) > 2 and self.screen is not self.monitor:
            self.pop_screen()
        if self.screen is not self.monitor and len(self.screen_stack) > 1:
            self.pop_screen()

    def ask(self, question: str, yes: Callable[[], None], no: Callable[[], None] | None = None) -> None:
        """A yes/no box; ``yes`` or ``no`` runs with the answer (Esc is no)."""

        def answered(answer: bool | None) -> None:
            if answer:
                yes()
            elif no is not None:
                no()

        self.push_screen(ConfirmScreen(question), answered)
