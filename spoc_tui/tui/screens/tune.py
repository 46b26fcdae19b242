"""The Tune screen: NSGA-II over server flags, the Pareto front filling in as trials finish."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, DataTable, Footer, Input, Label, Select, Sparkline, Static

from spoc_tui.core.ramp.sla import DEFAULT_SLA, Limit
from spoc_tui.core.tuning.docs import TrialRecord
from spoc_tui.core.tuning.space import Objective
from spoc_tui.tui.messages import Intent
from spoc_tui.tui.screens.keys import work_screen_keys
from spoc_tui.tui.widgets.badge import WorkBadge
from spoc_tui.tui.widgets.charts import ParetoPlot, PlotPoint
from spoc_tui.tui.widgets.fields import Field, rule_field
from spoc_tui.tune.args import SIM_LAUNCH, TUNE_RULES, VLLM_LAUNCH, TuneArgs
from spoc_tui.tune.events import (
    Note,
    OthersDone,
    RepeatDone,
    ServerReady,
    ServerStarting,
    StudyDone,
    StudyOpened,
    TrialDone,
    TrialRampProgressed,
    TrialStarted,
    TuneEvent,
)
from spoc_tui.tune.records import Front, compute_front
from spoc_tui.tune.report import member_tag, pooled_text, value_text
from spoc_tui.workload import builtin_names

__all__ = ["SIM_LAUNCH", "VLLM_LAUNCH", "TuneScreen"]


class TuneScreen(Screen[None]):
    """Start/stop/resume a tuning study; the monitor is one key away (m)."""

    AUTO_FOCUS = None
    """No field takes the keys when the screen opens: Tab (or a click) to edit, Esc to leave."""

    BINDINGS = work_screen_keys(
        # ctrl keys work from a field too (Input would take ctrl+x as "cut", ctrl+e as "end")
        Binding("ctrl+r", "start", "Start study", priority=True),
        Binding("ctrl+e", "resume", "Resume last", priority=True),
        Binding("ctrl+x", "stop", "Stop", priority=True),
        Binding("y", "copy", "Copy command"),
    )

    DEFAULT_CSS = """
    TuneScreen .row { height: auto; padding: 0 1; }
    TuneScreen .row Label { padding: 0 1 0 0; }
    TuneScreen .row Input { width: 1fr; }
    TuneScreen #trials, TuneScreen #step { width: 6; }
    TuneScreen #users { width: 12; }
    TuneScreen #sla { min-width: 24; }
    TuneScreen .row Select { width: 16; }
    TuneScreen #buttons { height: auto; padding: 0 1; }
    TuneScreen #buttons Button { margin-right: 2; min-width: 12; }
    TuneScreen #form-error { color: $error; height: auto; padding: 0 1; }
    TuneScreen #status { height: auto; padding: 0 1; }
    TuneScreen #plots { height: auto; margin-top: 1; }
    TuneScreen #side { width: 1fr; height: auto; }
    TuneScreen #hv { height: 3; margin: 0 1; }
    TuneScreen #hv-label { height: auto; max-height: 2; padding: 0 1; }
    TuneScreen #log-title { height: 1; padding: 0 1; }
    TuneScreen #log { height: 8; padding: 0 1; color: $text-muted; }
    TuneScreen #pareto { height: auto; max-height: 12; }
    TuneScreen #selected { height: auto; padding: 0 1; }
    """

    @dataclass
    class StartRequested(Intent):
        """The operator asked for a study (or to resume the last one) with these settings."""

        args: TuneArgs

    class StopRequested(Intent):
        """The operator asked to stop the running study (its server stops)."""

    @dataclass
    class CopyRequested(Intent):
        """The operator picked a Pareto-optimal trial's command line to take away (the app sends
        it to the clipboard and saves it)."""

        number: int
        command: str

    def __init__(self, launch: str | None = None) -> None:
        super().__init__()
        self.launch_default = launch or VLLM_LAUNCH
        self.running = False
        self.objectives: tuple[Objective, ...] = ()
        self.limits: tuple[Limit, ...] = ()
        self.records: list[TrialRecord] = []
        self.front: Front | None = None
        self.commands: dict[int, str] = {}
        self.log_path: Path | None = None
        self.trial_line = ""
        self.command_of: Callable[[Sequence[str]], str] | None = None
        """The study's copyable command line for a configuration's flags."""

    def compose(self) -> ComposeResult:
        yield Static(
            "Tuning study: NSGA-II over server flags; each trial starts the server and runs a ramp", id="title"
        )
        with VerticalScroll(id="body"):
            with Horizontal(classes="row"):
                yield Label("launch")
                yield Field(self.launch_default, id="launch")
            with Horizontal(classes="row"):
                yield Label("space")
                yield Field("", placeholder="built-in (or a TOML file)", id="space")
                yield Label("objectives")
                yield Field(TuneArgs.objectives, id="objectives")
            with Horizontal(classes="row"):
                yield Label("SLA")
                yield Field(DEFAULT_SLA, id="sla")
            # the SLA has a row of its own: at 80 columns it was cut beside the counts (issue 35)
            with Horizontal(classes="row"):
                yield Label("trials")
                yield Field(str(TuneArgs.trials), id="trials", restrict=r"[0-9]*")
                yield Label("users")
                yield Field(TuneArgs.users, id="users")
                yield from rule_field("step_s", TUNE_RULES.step_s)
                yield Select(
                    [(n, n) for n in builtin_names()],
                    value=TuneArgs.profile,
                    allow_blank=False,
                    id="profile",
                    compact=True,
                )
            yield Static("", id="form-error")
            with Horizontal(id="buttons"):
                yield Button("Start (ctrl+r)", id="start", variant="success", compact=True)
                yield Button("Resume last (ctrl+e)", id="resume", variant="primary", compact=True)
                yield Button("Stop (ctrl+x)", id="stop", variant="error", disabled=True, compact=True)
            yield Static(Text("idle", style="dim"), id="status")
            with Horizontal(id="plots"):
                yield ParetoPlot(id="plot")
                with Vertical(id="side"):
                    yield Static("hypervolume over trials", id="hv-label")
                    yield Sparkline([], id="hv")
                    yield Static("server log", id="log-title")
                    yield Static("", id="log")
            with Vertical(classes="panel", id="pareto-panel"):
                yield DataTable(id="pareto", cursor_type="row", zebra_stripes=False)
                yield Static("", id="selected")
        yield WorkBadge()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#pareto-panel").border_title = "Pareto set (y: copy the command line)"
        self.plot = self.query_one(ParetoPlot)
        self.table = self.query_one("#pareto", DataTable)
        self.status = self.query_one("#status", Static)
        self.form_error = self.query_one("#form-error", Static)
        self.plot.show([], "", "", note="start a study: each trial restarts the server with new flags")
        self.set_interval(1.0, self._tail_log)
        self._redraw()

    # -- form ------------------------------------------------------------------------------
    def form(self, resume: bool = False) -> TuneArgs | None:
        """The study's arguments, or None (the error shown under the form)."""

        def val(i: str) -> str:
            return self.query_one(f"#{i}", Input).value.strip()

        try:
            trials = int(val("trials") or "0")
            step = float(val("step") or "0")
        except ValueError:
            self.form_error.update("trials and step seconds must be numbers")
            return None
        profile = self.query_one("#profile", Select).value
        return TuneArgs(
            launch=val("launch"),
            sla=val("sla"),
            out_dir="",
            space=val("space") or None,
            objectives=val("objectives"),
            trials=trials,
            users=val("users") or TuneArgs.users,
            rules=replace(TUNE_RULES, step_s=step, warmup_s=min(5.0, step / 5)),
            profile=str(profile),
            resume=resume,
        )

    def set_running(self, running: bool) -> None:
        self.running = running
        self.query_one("#start", Button).disabled = running
        self.query_one("#resume", Button).disabled = running
        self.query_one("#stop", Button).disabled = not running
        for i in self.query(Input):
            i.disabled = running

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        """The table cuts long flag lists at its width: the highlighted member's command in full."""
        keys = list(self.commands)
        if keys and 0 <= event.cursor_row < len(keys):
            number = keys[event.cursor_row]
            self.query_one("#selected", Static).update(
                Text(f"trial #{number} (y copies it): {self.commands[number]}", style="dim")
            )

    def on_button_pressed(self, event: Button.Pressed) -> None:
        {"start": self.action_start, "resume": self.action_resume, "stop": self.action_stop}[
            event.button.id or "stop"
        ]()

    def action_start(self) -> None:
        if not self.running and (args := self.form()) is not None:
            self.set_focus(None)  # out of the field: the screen's keys work while the study runs
            self.post_message(self.StartRequested(args))

    def action_resume(self) -> None:
        if not self.running and (args := self.form(resume=True)) is not None:
            self.set_focus(None)
            self.post_message(self.StartRequested(args))

    def action_stop(self) -> None:
        if self.running:
            self.post_message(self.StopRequested())
            self.status.update(Text("stopping: the running trial's server is being stopped...", style="yellow"))

    def action_copy(self) -> None:
        if not self.commands:
            self.notify("no Pareto-optimal configuration yet", severity="warning")
            return
        row = self.table.cursor_row
        keys = list(self.commands)
        number = keys[min(max(row, 0), len(keys) - 1)]
        command = self.commands[number]
        self.query_one("#selected", Static).update(Text(f"trial #{number} (copied): {command}", style="bold"))
        self.post_message(self.CopyRequested(number, command))

    def show_error(self, message: str) -> None:
        self.form_error.update(message)

    # -- events from the study -------------------------------------------------------------
    def apply_event(self, ev: TuneEvent) -> None:
        match ev:
            case StudyOpened():
                self.form_error.update("")
                self.records = list(ev.records)
                self.status.update(
                    Text(
                        f"study {ev.study!r} in {ev.storage}"
                        + (f": {len(self.records)} trial(s) already run" if self.records else ""),
                        style="dim",
                    )
                )
                self._redraw()
            case Note(message=message):
                self.notify(message, timeout=8)
            case TrialStarted():
                self.trial_line = f"trial {ev.ordinal}/{ev.total} (#{ev.number}): {' '.join(ev.flags)}"
                self.status.update(Text(f"{self.trial_line}\nstarting the server...", style="bold"))
            case ServerStarting(log=log):
                self.log_path = Path(log)
            case ServerReady(start_s=start_s):
                self.status.update(
                    Text(f"{self.trial_line}\nserver ready in {start_s:.0f} s; ramp starting", style="bold")
                )
            case TrialRampProgressed(progress=p):
                if p.phase in ("warmup", "measuring"):
                    done = (
                        min(p.step_s, p.elapsed_s - sum(s.duration_s for s in p.steps))
                        if p.phase == "measuring"
                        else 0.0
                    )
                    self.status.update(
                        Text(
                            f"{self.trial_line}\nramp step {p.step}: {p.users} users, {p.phase} "
                            f"({p.samples} requests so far)"
                            + (f", {done:.0f}/{p.step_s:.0f} s" if p.phase == "measuring" else ""),
                            style="bold",
                        )
                    )
            case OthersDone(records=records):  # a shared study: trials other workers finished
                have = {r.number for r in self.records}
                self.records = sorted(
                    [*self.records, *(r for r in records if r.number not in have)], key=lambda r: r.number
                )
            case TrialDone(record=rec) | RepeatDone(record=rec):
                if isinstance(ev, TrialDone):
                    self.records.append(rec)
                    self.front = ev.front
                tail = "" if rec.status == "ok" else f": {rec.reason}"
                self.status.update(
                    Text(f"{self.trial_line}\n-> {rec.status}{tail}", style="green" if rec.status == "ok" else "yellow")
                )
                self._redraw()
            case StudyDone(front=front):
                self.front = front
                self._redraw()
            case _:
                pass  # skipped proposals, repeats starting: the status line has nothing to add

    def finished(self, message: str, ok: bool) -> None:
        self.set_running(False)
        self.status.update(Text(message, style="green" if ok else "yellow"))

    def _redraw(self) -> None:
        if not self.objectives or not self.is_mounted:
            return
        o = self.objectives
        front = compute_front(self.records, o, self.limits)
        self.front = front
        members = {m.record.number: m for m in front.members}
        pts: list[PlotPoint] = []
        failed = 0
        for r in self.records:
            if r.repeat_of is not None:
                continue  # pooled into its configuration's point
            v = r.values(o)
            if v is None:
                failed += 1
                continue
            m = members.get(r.number)
            if m is not None:
                pts.append(
                    PlotPoint(
                        m.values[0],
                        m.values[1],
                        "pareto" if m.status == "confirmed" else "provisional",
                        f"#{r.number}",
                        x_ci=m.ci95[0],
                        y_ci=m.ci95[1],
                    )
                )
                continue
            pts.append(PlotPoint(v[0], v[1], "feasible" if r.feasible else "breaks", f"#{r.number}"))
        note = f"{failed} trial(s) could not start or crashed" if failed else ""
        self.plot.show(pts, o[0].label, o[1].label, partial(value_text, o[0]), partial(value_text, o[1]), note=note)
        hv = front.hv_by_trial
        self.query_one("#hv", Sparkline).data = hv or [0.0]
        last = f"{hv[-1]:.4g}" if hv else "-"
        self.query_one("#hv-label", Static).update(
            f"hypervolume {last} after {len(hv)} runs (area to {value_text(o[0], front.reference[0])}, "
            f"{value_text(o[1], front.reference[1])})"
            + (f", {failed} infeasible" if failed else "")
            + ("" if front.settled or not front.members else "; front not settled: ◇ are provisional")
        )
        self.table.clear(columns=True)
        self.table.add_columns("#", o[0].label, o[1].label, "front", "flags")
        self.commands = {}
        for m in front.members:
            r = m.record
            self.commands[r.number] = self.command_for(r.flags)
            self.table.add_row(
                str(r.number),
                pooled_text(o[0], m, 0),
                pooled_text(o[1], m, 1),
                member_tag(m),
                " ".join(r.flags),
                key=str(r.number),
            )

    def command_for(self, flags: list[str]) -> str:
        if self.command_of is not None:
            return self.command_of(flags)
        return " ".join(flags)

    def prepare(
        self, objectives: tuple[Objective, ...], limits: tuple[Limit, ...], command_of: Callable[[Sequence[str]], str]
    ) -> None:
        self.objectives = objectives
        self.limits = limits
        self.command_of = command_of
        self.records = []
        self.log_path = None
        self._redraw()

    def _tail_log(self) -> None:
        if self.log_path is None:
            return
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - 4000))
                text = f.read().decode(errors="replace")
        except OSError:
            return
        lines = [ln[:200] for ln in text.splitlines() if ln.strip()][-7:]
        self.query_one("#log-title", Static).update(f"server log: {self.log_path}")
        self.query_one("#log", Static).update(Text("\n".join(lines)))
