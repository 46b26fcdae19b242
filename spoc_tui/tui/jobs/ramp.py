"""A load ramp started from the Load screen, and a profile of its running step (F6)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

from rich.text import Text
from textual.worker import Worker

from spoc_tui.collectors.scrape import base_url
from spoc_tui.config import data_dir
from spoc_tui.core.errors import InputError, SpocError, first_line
from spoc_tui.core.hardware.presets import gpu_for_model_name, model_preset
from spoc_tui.core.ramp.knee import plan_text
from spoc_tui.load.ramp import RampConfig, RampError, RampProgress, RampResult, run_ramp
from spoc_tui.profile.analyze import Breakdown, analyse
from spoc_tui.profile.capture import CaptureConfig, capture, profiler_flag
from spoc_tui.profile.report import decode_roofline
from spoc_tui.profile.trace import read_trace
from spoc_tui.tui.jobs.host import Handlers, JobHost, start_unless
from spoc_tui.tui.messages import ProfileFinished, ProfileProgressed, RampFinished, RampProgressed
from spoc_tui.tui.screens.load import LoadScreen
from spoc_tui.tui.widgets.panels import profile_text
from spoc_tui.twin.model import Twin
from spoc_tui.twin.shadow import ShadowTwin, twin_id

RampRunner = Callable[[RampConfig, Callable[[RampProgress], None]], Awaitable[RampResult]]
"""What runs a ramp started from the Load screen: :func:`~spoc_tui.load.ramp.run_ramp` (the
live backend), or the same experiment over the virtual backend (the TUI's tests)."""
ProfileCapture = Callable[[CaptureConfig, Callable[[str], None]], Awaitable[Path]]
"""What profiles the server for F6: :func:`~spoc_tui.profile.capture.capture` (the network), or
the same capture with its requests answered in memory (the TUI's tests)."""


class RampJob:
    """A ramp of the Load screen's form on the first server: asked about first where the server
    is busy, run in a worker, its progress on the screen, the events and every screen's badge;
    its results in the data folder's ``ramps/``."""

    def __init__(self, host: JobHost, runner: RampRunner = run_ramp) -> None:
        self.host = host
        self.runner = runner
        """Runs a ramp (tests: on the experiment's virtual backend)."""
        self.worker: Worker[None] | None = None
        self.badge = ""
        """The running ramp in a few words (:attr:`RampProgress.badge`), on the monitor's status line."""

    def handlers(self) -> Handlers:
        return {
            LoadScreen.StartRequested: self.start,
            LoadScreen.StopRequested: self.stop,
            RampProgressed: self.progressed,
            RampFinished: self.finished,
        }

    def running(self) -> str | None:
        """The ramp in a few words while one runs."""
        if self.worker is None or not self.worker.is_running:
            return None
        return f"a load ramp ({self.badge})" if self.badge else "a load ramp"

    def start(self, request: LoadScreen.StartRequested) -> None:
        host = self.host
        busy = host.monitor.busy()
        start_unless(
            host,
            busy,
            "ramp",
            f"ramp started on a busy server ({busy})",
            f"The server is already busy: {busy}.\nThe ramp's steps would be measured on top of that traffic, "
            "so its knee would come out low. Start anyway?",
            lambda: self._start(request),
            lambda: host.load_screen.show_finished("not started: the server is busy with other traffic", False),
        )

    def _start(self, request: LoadScreen.StartRequested) -> None:
        host = self.host
        cfg = RampConfig(
            url=host.settings.vllm_urls[0],
            workload=request.profile,
            plan=request.plan,
            limits=request.limits,
            out_dir=data_dir() / "ramps" / time.strftime("%Y%m%d-%H%M%S"),
            **request.rules.values(),
            workers=request.workers,
            api_key=host.settings.api_key,
            dcgm_urls=list(host.settings.dcgm_urls),
            trace=request.trace,
        )
        if isinstance(request.twin, Twin):  # its prediction of each step, kept on the step as it is measured
            name = twin_id(request.twin, request.twin_path or "twin.json")
            shadow = ShadowTwin(request.twin, name, request.profile, request.limits, rules=cfg.rules())
            cfg = replace(cfg, shadow=shadow)
        host.load_screen.set_running(True)
        steps = f"{request.trace.path.name} replayed" if request.trace else f"{cfg.step_s:g} s steps"
        host.events.note("ramp", f"ramp started: {plan_text(cfg.plan)}, {steps}")
        host.set_background()
        self.worker = host.run_worker(self._run(cfg), group="ramps", exclusive=True, exit_on_error=False)

    def stop(self, _: object = None) -> None:
        if self.worker is not None:
            self.worker.cancel()

    async def _run(self, cfg: RampConfig) -> None:
        post = self.host.post_message

        def progress(p: RampProgress) -> None:
            post(RampProgressed(p))

        try:
            result = await self.runner(cfg, progress)
        except RampError as e:
            post(RampFinished("error", str(e)))
        except asyncio.CancelledError:
            post(RampFinished("interrupted", f"stopped: finished steps kept in {cfg.out_dir}"))
            raise
        else:
            post(RampFinished(result.status, f"{result.status}: results in {cfg.out_dir}"))

    def progressed(self, message: RampProgressed) -> None:
        host, p = self.host, message.progress
        host.load_screen.show_progress(p)
        self.badge = p.badge
        host.set_background()
        if p.phase == "step_done" and p.steps:
            last = p.steps[-1]
            decision = last.decision
            said = {"meets": "meets the SLA", "breaks": f"breaks the SLA ({last.verdict.broken_limit})"}
            host.events.note(
                "ramp",
                f"ramp step {len(p.steps)} at {p.level_text}: {said.get(decision, decision)} (n={last.requests})",
                "warning" if decision == "breaks" else "info",
            )

    def finished(self, message: RampFinished) -> None:
        host = self.host
        self.worker = None
        self.badge = ""
        host.events.note("ramp", f"ramp {message.message}", "info" if message.ok else "warning")
        host.set_background()
        host.load_screen.show_finished(message.message, message.ok)
        host.notify(message.message, severity="information" if message.ok else "warning", timeout=8)


class ProfileJob:
    """F6 on the Load screen: a few seconds of the server's own profiler, read into where the
    time went, beside the decode's roofline for the model and GPU the monitor sees."""

    SECONDS = 5.0

    def __init__(self, host: JobHost, capture: ProfileCapture = capture) -> None:
        self.host = host
        self.capture = capture
        """Profiles the server (tests: its requests answered in memory)."""
        self.busy = False

    def handlers(self) -> Handlers:
        return {
            LoadScreen.ProfileRequested: self.start,
            ProfileProgressed: self.progressed,
            ProfileFinished: self.finished,
        }

    def running(self) -> str | None:
        return "a profile of the running step" if self.busy else None

    def start(self, _: object = None) -> None:
        host = self.host
        if not host.settings.trace_dir:
            host.load_screen.show_profile(
                Text(
                    "no trace folder: start spoc with --trace-dir DIR (or trace_dir in the config), the folder the "
                    f"server writes traces to; the server needs {profiler_flag('DIR')}",
                    style="bold yellow",
                )
            )
            return
        self.busy = True
        host.set_background()
        host.run_worker(self._run(Path(host.settings.trace_dir)), group="profile", exclusive=True, exit_on_error=False)

    async def _run(self, trace_dir: Path) -> None:
        host, post = self.host, self.host.post_message
        cfg = CaptureConfig(
            url=base_url(host.settings.vllm_urls[0]),
            trace_dir=trace_dir,
            seconds=self.SECONDS,
            api_key=host.settings.api_key,
        )

        def progress(text: str) -> None:
            post(ProfileProgressed(text))

        try:
            path = await self.capture(cfg, progress)
            post(ProfileProgressed(f"reading {path.name}…"))
            breakdown = await asyncio.to_thread(lambda: analyse(read_trace(path)))
        except SpocError as e:
            post(ProfileFinished(None, first_line(str(e))))
            return
        roof = self._decode_roofline()
        if roof is not None:
            breakdown.roofline_step_s, breakdown.roofline_basis = roof
        post(ProfileFinished(breakdown))

    def _decode_roofline(self) -> tuple[float, str] | None:
        """From what the monitor sees: the served model as a preset, the GPU by its name."""
        seen = self.host.monitor.seen()
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

    def progressed(self, message: ProfileProgressed) -> None:
        self.host.load_screen.show_profile_progress(message.text)

    def finished(self, message: ProfileFinished) -> None:
        host = self.host
        self.busy = False
        host.set_background()
        if isinstance(message.breakdown, Breakdown):
            host.load_screen.show_profile(profile_text(message.breakdown))
        else:
            host.load_screen.show_profile(Text(f"profile failed: {message.error}", style="bold red"))
            host.notify(f"profile failed: {message.error}", severity="warning", timeout=8)
