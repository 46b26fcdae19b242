"""A tuning study started from the Tune screen, and a trial's command line taken away."""

from __future__ import annotations

import logging
import time

from spoc_tui.config import data_dir
from spoc_tui.core.errors import InputError, SpocError
from spoc_tui.tui.jobs.host import Handlers, JobHost, start_unless
from spoc_tui.tui.messages import TuneEvent, TuneFinished
from spoc_tui.tui.screens.tune import TuneScreen
from spoc_tui.tune import events as tune_events
from spoc_tui.tune.args import TuneArgs
from spoc_tui.tune.setup import build
from spoc_tui.tune.study import TuneSession

logger = logging.getLogger(__name__)


class TuneJob:
    """A study of the Tune screen's form: asked about first where this host's GPUs already serve
    a model, run in a thread (its events posted back), its trials on the screen and the events;
    its results in the data folder's ``tunes/`` (``resume``: the newest there)."""

    def __init__(self, host: JobHost) -> None:
        self.host = host
        self.session: TuneSession | None = None

    def handlers(self) -> Handlers:
        return {
            TuneScreen.StartRequested: self.start,
            TuneScreen.StopRequested: self.stop,
            TuneScreen.CopyRequested: self.copy_command,
            TuneEvent: self.event,
            TuneFinished: self.finished,
        }

    def running(self) -> str | None:
        return "a tuning study" if self.session is not None else None

    def copy_command(self, request: TuneScreen.CopyRequested) -> None:
        """A trial's command line to the clipboard, by OSC 52, which reaches it only where the
        terminal allows (tmux needs set-clipboard on): also to a file, said in the notice."""
        number, command = request.number, request.command
        self.host.copy_to_clipboard(command)
        try:
            folder = data_dir() / "commands"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"trial-{number}.sh"
            path.write_text(command + "\n")
            saved = f"; also saved to {path}"
        except OSError as e:
            saved = f"; not saved ({e.strerror or e})"
        self.host.notify(f"trial #{number}'s command line sent to the clipboard (OSC 52){saved}", timeout=8)

    def start(self, request: TuneScreen.StartRequested) -> None:
        host = self.host
        shared = self.gpus_in_use(request.args.launch)
        start_unless(
            host,
            shared,
            "tune",
            f"study started on GPUs already in use ({shared})",
            f"This host's GPUs already serve a model ({shared}).\nEach trial starts another vLLM on the same "
            "GPUs: it competes for their memory (it may not start) and for their time (its figures and the "
            "running server's both suffer). Start anyway?",
            lambda: self._start(request),
            lambda: host.tune_screen.show_error("not started: this host's GPUs already serve a model"),
        )

    def gpus_in_use(self, launch: str) -> str | None:
        """When a study would start a second server on GPUs this host's NVML sees serving one (the
        simulator needs no GPU: None)."""
        if any(word in launch for word in ("spoc sim", "spoc demo", "spoc_tui.cli sim", "spoc_tui.cli demo")):
            return None
        monitor = self.host.monitor
        local = [g for g in monitor.model.gpu_samples if g.source == "nvml" and not g.simulated]  # NVML here
        used = [g for g in local if (g.fb_used_mib or 0) > 1024 or (g.util_pct or 0) > 5]
        if not used:
            return None
        busy = monitor.busy()
        return f"{len(used)} of {len(local)} GPU(s) with memory in use" + (f", the server {busy}" if busy else "")

    def _start(self, request: TuneScreen.StartRequested) -> None:
        host = self.host
        args: TuneArgs = request.args
        screen = host.tune_screen
        root = data_dir() / "tunes"
        if args.resume:
            earlier = sorted(p.parent for p in root.glob("*/study.db"))
            if not earlier:
                screen.show_error(f"no earlier study in {root} to resume")
                return
            args.out_dir = str(earlier[-1])
        else:
            args.out_dir = str(root / time.strftime("%Y%m%d-%H%M%S"))
        args.api_key = host.settings.api_key
        try:
            cfg, evaluator = build(args)
        except (InputError, ValueError) as e:
            screen.show_error(str(e))
            return

        def listen(event: tune_events.TuneEvent) -> None:  # on the study's thread: to the UI as a message
            host.post_message(TuneEvent(event))

        session = TuneSession(cfg, evaluator, listen)
        screen.show_error("")
        screen.prepare(cfg.objectives, cfg.limits, session.command)
        screen.set_running(True)
        self.session = session
        host.events.note("tune", f"study started: {cfg.trials} trials, results in {cfg.out_dir}")
        host.set_background()
        host.run_worker(lambda: self._run(session), group="tune", exclusive=True, exit_on_error=False, thread=True)

    def stop(self, _: object = None) -> None:
        """The study stops (its server too; if the app exits first, the server's guard stops it)."""
        if self.session is not None:
            self.session.stop()

    def _run(self, session: TuneSession) -> None:
        """The study, on its thread; its end posted back."""
        post, out = self.host.post_message, session.cfg.out_dir
        try:
            session.open()
            summary = session.run()
        except SpocError as e:  # TuneError, TuneFatal: worded for the user
            post(TuneFinished("error", str(e)))
        except Exception as e:  # a bug: shown, not a crash of the monitor
            logger.exception("tuning study failed")
            post(TuneFinished("error", f"internal error: {type(e).__name__}: {e}"))
        else:
            ran = len([r for r in summary.records if r.repeat_of is None])
            post(
                TuneFinished(
                    summary.status,
                    f"{summary.status}: {ran} trial(s), {len(summary.front.records)} Pareto-optimal; "
                    f"results in {out}/pareto.json" + (f"; {summary.message}" if summary.message else ""),
                )
            )

    def event(self, message: TuneEvent) -> None:
        e = message.event
        if isinstance(e, tune_events.TrialDone):
            r = e.record
            self.host.events.note(
                "tune",
                f"trial #{r.number} {r.status}"
                + ("" if r.feasible else " (misses the SLA)")
                + f"; front of {len(e.front.records)}",
            )
        self.host.tune_screen.apply_event(e)

    def finished(self, message: TuneFinished) -> None:
        host = self.host
        self.session = None
        host.events.note("tune", f"study {message.message}", "info" if message.ok else "warning")
        host.set_background()
        host.tune_screen.finished(message.message, message.ok)
        if message.status == "error":
            host.tune_screen.show_error(message.message)
        host.notify(message.message, severity="information" if message.ok else "warning", timeout=8)
