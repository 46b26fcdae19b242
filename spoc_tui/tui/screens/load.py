"""The Load screen: choose a profile, the user steps and the SLA; watch the ramp find its knee."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Select, Static

from spoc_tui.core import fmt
from spoc_tui.core.errors import InputError, SpocError
from spoc_tui.core.ramp.inference import KneeEstimate
from spoc_tui.core.ramp.knee import (
    Knee,
    Listed,
    UserPlan,
    parse_levels,
    parse_speed_plan,
)
from spoc_tui.core.ramp.rules import StepRules, declared, form_id, settings
from spoc_tui.core.ramp.sla import DEFAULT_SLA, Limit, parse_sla
from spoc_tui.core.ramp.steps import StepSummary
from spoc_tui.core.ramp.text import (
    KneeTone,
    check_lines,
    interval_strip,
    knee_sentence,
    step_cells,
    verdict,
    verdict_text,
)
from spoc_tui.core.traces.read import TraceSource, trace_source
from spoc_tui.core.traces.stats import stats_lines, trace_stats
from spoc_tui.load.defaults import DEFAULT_PROFILE, DEFAULT_USERS
from spoc_tui.load.ramp import RampConfig, RampProgress
from spoc_tui.tui.messages import Intent
from spoc_tui.tui.screens.keys import work_screen_keys
from spoc_tui.tui.widgets.badge import WorkBadge
from spoc_tui.tui.widgets.charts import Bar, LimitBarChart
from spoc_tui.tui.widgets.fields import Field, rule_fields
from spoc_tui.tui.widgets.tables import Cell, DiffTable
from spoc_tui.workload import Workload, builtin_names, load_workload

if TYPE_CHECKING:
    pass

_DECISION_STYLE = {"meets": "green", "breaks": "bold red", "inconclusive": "yellow"}
_KNEE_STYLE: dict[KneeTone, str] = {
    "pending": "dim",
    "meets": "green",
    "breaks_at_once": "bold red",
    "breaks": "bold yellow",
}
_COLUMNS = [
    ("users", "Users", 5),
    ("req_s", "req/s", 6),
    ("out_tok_s", "out t/s", 7),
    ("goodput", "goodput", 7),
    ("ttft_p99", "TTFT p99", 8),
    ("itl_p99", "ITL p99", 7),
    ("err_pct", "err%", 5),
    ("queue", "queue", 5),
    ("kv", "KV", 5),
]


class StepTable(DiffTable):
    COLUMNS = [*_COLUMNS, ("v", "verdict", 16)]

    def show(self, steps: tuple[StepSummary, ...], stats: dict[str, str] | None = None) -> None:
        """``stats``: the percentile the SLA judges TTFT and ITL by (``{"ttft": "p90"}``), which
        their columns show; p99 where the SLA sets no limit on the metric."""
        stat = {m: (stats or {}).get(m, "p99") for m in ("ttft", "itl")}
        labels = {"ttft_p99": f"TTFT {stat['ttft']}", "itl_p99": f"ITL {stat['itl']}"}
        columns = [(k, labels.get(k, label), w) for k, label, w in self._columns]
        if columns != self._columns:  # the SLA changed between ramps: new headers, every row again
            self._columns = columns
            self._header = None
            self._strips.clear()
            self._sigs.clear()
            self.refresh()
        rows: dict[str, list[Cell]] = {}
        for s in steps:
            cells = step_cells(s)
            cells["ttft_p99"] = fmt.seconds(s.latency.ttft.stat(stat["ttft"]))
            cells["itl_p99"] = fmt.seconds(s.latency.itl.stat(stat["itl"]))
            decision, _ = verdict(s)
            rows[str(s.step)] = [
                *(cells[key] for key, _, _ in _COLUMNS),
                Text(verdict_text(s), style=_DECISION_STYLE[decision]),
            ]
        self.sync(rows)


def knee_text(knee: Knee | None, done: bool, steps: tuple[StepSummary, ...] = ()) -> Text:
    """The knee sentence, its server-side reason, and each step's SLA figures with their intervals."""
    text, tone = knee_sentence(knee, done)
    out = Text(text, style=_KNEE_STYLE[tone])
    if knee is not None and knee.inferred is not None:
        out.append(f"\nknee across steps: {knee.inferred.text}", style="bold")
        if strip := interval_strip(knee, [s.level for s in steps]):
            out.append(f"\n{strip}", style="cyan")
    if knee is not None and knee.reason:
        out.append(f"\nwhy: {knee.reason}", style="bold")
    if steps:
        out.append("\n95 % intervals:" + "".join(f"\n{line}" for s in steps for line in check_lines(s)), style="dim")
    return out


PROFILE_HINT = (
    "F6 records the server's work for a few seconds (torch profiler) and shows where the step time goes. "
    "The server needs --profiler-config and spoc needs its folder (--trace-dir)."
)

TRACE_HINT = (
    "Give a trace file above (Mooncake, Bailian, BurstGPT, Azure, WEKA or spoc JSONL) to replay your own "
    "traffic instead of the profile: each step sends its rows on their timestamps divided by a speed, and "
    "the knee comes out in speed multiples (x2.6: your traffic 2.6 times as fast still meets the SLA)."
)


class Claim(Protocol):
    """A live headroom the form was set to confirm (the app's
    :class:`~spoc_tui.twin.headroom_confirm.HeadroomClaim`): the trace of its traffic, and its
    figures beside the knee a ramp of that trace measured."""

    @property
    def trace(self) -> str: ...

    def beside(self, measured: KneeEstimate | None) -> str: ...


TwinReader = Callable[[str], object]
"""Reads a twin file (the app's :func:`~spoc_tui.twin.model.read_twin`), raising a
:class:`~spoc_tui.core.errors.SpocError` that says what is wrong with it: the screen checks the
form's twin as the ramp will read it, and holds no twin code of its own."""


class LoadScreen(Screen[None]):
    """Start/stop a ramp against the monitored server; the monitor is one key away (m)."""

    AUTO_FOCUS = None
    """No field takes the keys when the screen opens: Tab (or a click) to edit, Esc to leave."""

    BINDINGS = work_screen_keys(
        # ctrl keys work from a field too (Input would take ctrl+x as "cut")
        Binding("ctrl+r", "start", "Start ramp", priority=True),
        Binding("ctrl+x", "stop", "Stop ramp", priority=True),
        Binding("f6", "profile", "Profile step", priority=True),
    )

    DEFAULT_CSS = """
    LoadScreen Horizontal { height: auto; }
    LoadScreen #form, LoadScreen #form2 { height: auto; padding: 0 1; }
    LoadScreen #form Input { width: 1fr; }
    LoadScreen #form #users { width: 3fr; min-width: 14; }
    LoadScreen #form #step, LoadScreen #form #warmup { width: 6; }
    LoadScreen #form Select { width: 16; }
    LoadScreen #form Label, LoadScreen #form2 Label { padding: 0 1 0 0; }
    LoadScreen #form2 Input { width: 1fr; }
    LoadScreen #form3 { height: auto; padding: 0 1; }
    LoadScreen #form3 Label { padding: 0 1 0 0; }
    LoadScreen #form3 Input { width: 8; }
    LoadScreen #form6 { height: auto; padding: 0 1; }
    LoadScreen #form6 Label { padding: 0 1 0 0; }
    LoadScreen #form6 Input { width: 8; }
    LoadScreen #form6 Select { width: 15; }
    LoadScreen #form4 { height: auto; padding: 0 1; }
    LoadScreen #form4 Label { padding: 0 1 0 0; }
    LoadScreen #form4 #trace { width: 1fr; }
    LoadScreen #form4 #speeds { width: 14; }
    LoadScreen #form5 { height: auto; padding: 0 1; }
    LoadScreen #form5 Label { padding: 0 1 0 0; }
    LoadScreen #form5 #twin { width: 1fr; }
    LoadScreen #buttons { height: auto; padding: 0 1; }
    LoadScreen #buttons Button { margin-right: 2; min-width: 12; }
    LoadScreen #charts { height: auto; margin-top: 1; }
    LoadScreen #status { height: auto; padding: 0 1; }
    LoadScreen #knee { height: auto; padding: 0 1; }
    LoadScreen #form-error { color: $error; height: auto; padding: 0 1; }
    """

    @dataclass
    class StartRequested(Intent):
        """The operator asked for a ramp with these settings (already checked)."""

        profile: Workload
        plan: UserPlan
        """User counts, the knee search (``auto[:MAX]``) or open-loop rates (``rate:1,2,4``)."""
        limits: tuple[Limit, ...]
        rules: StepRules
        """The step rules as the form gave them (the budget's None: the knee search's default, none
        for listed levels)."""
        workers: int = 0
        trace: TraceSource | None = None
        """Replay this trace instead of the profile (the plan is then speeds)."""
        twin: object | None = None
        """A calibrated twin (as :data:`TwinReader` read it): its prediction of each step is drawn
        beside the measurement."""
        twin_path: str = ""
        """Where the twin was read from (its name is in each step's prediction, ramp.json's ``shadow``)."""

    class StopRequested(Intent):
        """The operator asked to stop the running ramp."""

    class ProfileRequested(Intent):
        """The operator asked for a profile of what the server is doing now (the running step)."""

    def __init__(self, url: str | None, read_twin: TwinReader | None = None) -> None:
        """``read_twin``: how the form's twin file is read (without one, a twin in the form is refused)."""
        super().__init__()
        self.url = url
        self.read_twin = read_twin
        self.running = False
        self.limits: tuple[Limit, ...] = ()
        self.total_steps: int | None = None
        self.request: LoadScreen.StartRequested | None = None
        self.predicted: dict[float, tuple[float | None, float | None]] = {}
        """The twin's TTFT and ITL by level (at the charts' percentiles), as the steps finish."""
        self._bars_of: tuple[StepSummary, ...] = ()
        self._knee: Knee | None = None
        self._claim: Claim | None = None
        """The live headroom the form was pre-filled to confirm (its trace and its figures)."""

    def compose(self) -> ComposeResult:
        yield Static(f"Load ramp against {self.url or 'no server (start the monitor with --url)'}", id="title")
        with VerticalScroll(id="body"):
            with Horizontal(id="form"):
                yield Label("profile")
                yield Select(
                    [(n, n) for n in builtin_names()],
                    value=DEFAULT_PROFILE,
                    allow_blank=False,
                    id="profile",
                    compact=True,
                )
                yield Label("users")
                yield Field(DEFAULT_USERS, id="users", tooltip="1,2,4 · geom:1:64 · auto[:MAX] · rate:1,2,4 (req/s)")
                yield from rule_fields("first")
            with Horizontal(id="form2", classes="-row"):
                yield Label("SLA")
                yield Field(DEFAULT_SLA, id="sla")
            with Horizontal(id="form4", classes="-row"):
                yield Label("trace")
                yield Field(
                    "",
                    id="trace",
                    placeholder="a trace file (empty: the profile)",
                    tooltip="Mooncake, Bailian, BurstGPT, Azure, WEKA or spoc JSONL: replayed instead of the profile",
                )
                yield Label("speeds")
                yield Field("auto", id="speeds", tooltip="with a trace: 0.5,1,2 (a step each) or auto[:MAX]")
            with Horizontal(id="form5", classes="-row"):
                yield Label("twin")
                yield Field(
                    "",
                    id="twin",
                    placeholder="twin.json: its prediction beside each step (empty: none)",
                    tooltip="spoc twin calibrate writes one: each finished step is predicted on it and drawn as ◆",
                )
            with Horizontal(id="form3", classes="-row"):
                yield from rule_fields("rules")
                yield Label("workers")
                yield Field(
                    str(RampConfig.workers),
                    id="workers",
                    restrict=r"[0-9]*",
                    tooltip="load-generator processes (0: one; more above 64 users)",
                )
            with Horizontal(id="form6", classes="-row"):
                yield from rule_fields("pacing")
            yield Static("", id="form-error")
            with Horizontal(id="buttons"):
                yield Button("Start (ctrl+r)", id="start", variant="success", disabled=self.url is None, compact=True)
                yield Button("Stop (ctrl+x)", id="stop", variant="error", disabled=True, compact=True)
            yield Static(Text("idle", style="dim"), id="status")
            # the result first (steps and knee), then the charts: at 80x24 the table is in view
            with Vertical(classes="panel", id="steps-panel"):
                yield StepTable(id="steps")
            yield Static(knee_text(None, False), id="knee")
            with Horizontal(id="charts"):
                yield LimitBarChart("p99 TTFT by users", id="ttft-chart")
                yield LimitBarChart("p99 ITL by users", id="itl-chart")
            with Vertical(classes="panel", id="trace-panel"):
                yield Static(Text(TRACE_HINT, style="dim"), id="trace-view")
            with Vertical(classes="panel", id="profile-panel"):
                yield Static(Text(PROFILE_HINT, style="dim"), id="profile-view")
        yield WorkBadge()
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#steps-panel").border_title = "Steps"
        self.steps = self.query_one(StepTable)
        self.ttft_chart = self.query_one("#ttft-chart", LimitBarChart)
        self.itl_chart = self.query_one("#itl-chart", LimitBarChart)
        self.status = self.query_one("#status", Static)
        self.knee = self.query_one("#knee", Static)
        self.form_error = self.query_one("#form-error", Static)
        self.profile = self.query_one("#profile-view", Static)
        self.query_one("#profile-panel").border_title = "Profile (F6: profile the running step)"
        self.query_one("#trace-panel").border_title = "Trace"
        self.trace_view = self.query_one("#trace-view", Static)
        self.profiling = False

    # -- form -------------------------------------------------------------------------------
    def read_form(self) -> StartRequested | None:
        """The ramp asked for, checked, or None with the problem shown under the form."""
        try:
            trace_text = self.query_one("#trace", Input).value.strip()
            trace = trace_source(os.path.expanduser(trace_text)) if trace_text else None
            plan = (
                parse_speed_plan(self.query_one("#speeds", Input).value or "auto")
                if trace is not None
                else parse_levels(self.query_one("#users", Input).value)
            )
            limits = parse_sla(self.query_one("#sla", Input).value)
            rules = self._rules()
            try:
                workers = int(self.query_one("#workers", Input).value or "0")
            except ValueError:
                raise InputError("workers: a whole number") from None
            profile = load_workload(str(self.query_one("#profile", Select).value))
            twin_text = self.query_one("#twin", Input).value.strip()
            twin = self._twin(twin_text)
            if twin is not None and trace is not None:
                raise InputError("the twin predicts profile ramps: give a trace or a twin, not both")
            # the check spoc ramp makes, with the form's names for its fields
            RampConfig(self.url or "", profile, plan, limits, Path(), **rules.values(), workers=workers,
                       trace=trace).validate()  # fmt: skip
        except SpocError as e:
            names = {s.flag: s.said for _, s in settings()} | {"--workers": "workers"}
            message = str(e)
            for flag, name in names.items():
                message = message.replace(flag, name)
            self.form_error.update(message)
            return None
        self.form_error.update("")
        self.limits = limits
        return self.StartRequested(profile, plan, limits, rules, workers, trace, twin,
                                   os.path.expanduser(twin_text) if twin else "")  # fmt: skip

    def _rules(self) -> StepRules:
        """The step rules the form's fields give (an empty optional one: its default).

        Raises:
            InputError: a field that is not a number, naming it and its unit.
        """
        values: dict[str, object] = {}
        for name, s in settings():
            widget = self.query_one(f"#{form_id(name)}")
            text = str(widget.value if isinstance(widget, Select) else cast(Input, widget).value).strip()
            optional = declared(name)[1] is None
            try:
                if s.kind == "choice":
                    values[name] = text
                elif s.kind == "int":
                    values[name] = int(text or "0")
                elif not text and optional:
                    values[name] = None
                else:
                    values[name] = float(text or "0") * s.form_scale
            except ValueError:
                unit = "a whole number" if s.kind == "int" else "minutes" if s.form_scale == 60 else "a number"
                raise InputError(f"{s.said}: {text!r} is not {unit}") from None
        return StepRules(**values)  # type: ignore[arg-type]

    def _twin(self, text: str) -> object | None:
        """The form's twin, read (None: none asked).

        Raises:
            SpocError: the file's problem; or no reader to read it with.
        """
        if not text:
            return None
        if self.read_twin is None:
            raise InputError("this screen cannot read a twin: leave the twin field empty")
        return self.read_twin(os.path.expanduser(text))

    def prefill_trace(self, trace: str, speeds: str, note: str, claim: Claim | None = None) -> None:
        """The form set to replay ``trace`` at ``speeds`` (a ramp that confirms a headroom), with
        ``note`` saying why under it; a field the operator already filled is left alone. A ramp
        of that trace ends with ``claim``, the headroom predicted, beside the knee it measured."""
        if self.running or self.query_one("#trace", Input).value.strip():
            return
        self.query_one("#trace", Input).value = trace
        self.query_one("#speeds", Input).value = speeds
        self.form_error.update(Text(note, style="dim"))
        self._claim = claim

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.action_start()
        elif event.button.id == "stop":
            self.action_stop()

    def action_start(self) -> None:
        if self.running or self.url is None:
            return
        request = self.read_form()
        if request is None:
            return
        plan = request.plan
        # a search: as many steps as it takes
        self.total_steps = len(plan.levels) if isinstance(plan, Listed) else None
        if request.trace is not None:
            self.trace_view.update(Text(f"reading {request.trace.path.name}…", style="bold"))
            self.describe_trace(request.trace)
        self.set_focus(None)  # out of the field: the screen's keys work while the ramp runs
        self.request = request
        self.predicted = {}
        self.post_message(request)

    @work(thread=True, group="trace-stats", exclusive=True, exit_on_error=False)
    def describe_trace(self, source: TraceSource) -> None:
        """The trace's arrival rate over time and its shape, read in a thread (a big trace takes a
        while; the ramp reads it too before its first step)."""
        try:
            st = trace_stats(source.path, source.fmt, source.filters)
        except SpocError as e:
            self.app.call_from_thread(self.trace_view.update, Text(str(e), style="bold red"))
            return
        text = "\n".join(stats_lines(source.path.name, st))
        self.app.call_from_thread(self.trace_view.update, Text(text))

    def action_profile(self) -> None:
        if self.url is None or self.profiling:
            return
        self.profiling = True
        self.profile.update(Text("starting the profiler…", style="bold"))
        self.post_message(self.ProfileRequested())

    def show_profile_progress(self, text: str) -> None:
        self.profile.update(Text(text, style="bold"))

    def show_profile(self, text: Text) -> None:
        self.profiling = False
        self.profile.update(text)

    def action_stop(self) -> None:
        if self.running:
            self.post_message(self.StopRequested())

    def set_running(self, running: bool) -> None:
        self.running = running
        self.query_one("#start", Button).disabled = running or self.url is None
        self.query_one("#stop", Button).disabled = not running

    # -- progress -----------------------------------------------------------------------------
    def show_progress(self, p: RampProgress) -> None:
        total = self.total_steps or "?"
        phase = {
            "preflight": "checking the server",
            "starting": "starting Locust",
            "warmup": "warming up",
            "measuring": "measuring",
            "extending": "inconclusive so far: measuring on",
            "step_done": "step done",
            "done": "finished",
        }.get(p.phase, p.phase)
        out_rate = p.steps[-1].output_tokens_per_s if p.steps else None
        budget = f" · budget left {p.budget_left_s / 60:.1f} min" if p.budget_left_s is not None else ""
        self.status.update(
            Text(
                f"step {p.step}/{total} · {p.level_text} · {phase} · {p.samples} requests · "
                f"last step {fmt.rate(out_rate, ' out tok/s')} · {p.elapsed_s:.0f}s elapsed{budget}",
                style="bold",
            )
        )
        with self.app.batch_update():
            self.steps.show(p.steps, {m: self._stat(m) for m in ("ttft", "itl")})
            self._knee = p.knee
            self._charts(p.steps)
            req = self.request
            for s in p.steps:  # the shadow twin's prediction of each step, made as it was measured
                if s.shadow is not None:
                    figs = s.shadow.figures
                    ttft, itl = figs.get(f"ttft_{self._stat('ttft')}"), figs.get(f"itl_{self._stat('itl')}")
                    self.predicted[s.level] = (ttft, itl)
            text = knee_text(p.knee, p.phase == "done", p.steps)
            with_sessions = [s for s in p.steps if s.sessions is not None]
            if with_sessions:  # agent sessions, conversations: the latest step's
                last = with_sessions[-1]
                assert last.sessions is not None
                text.append(f"\nat {last.level_text}: {last.sessions.line()}")
            claim = self._claim
            if claim is not None and req is not None and req.trace is not None and str(req.trace.path) == claim.trace:
                text.append("\n" + claim.beside(p.knee.inferred if p.knee is not None else None), style="bold")
            self.knee.update(text)

    def _limit(self, metric: str) -> Limit | None:
        """The SLA's limit on ``metric`` (its first), None without one."""
        return next((lim for lim in self.limits if lim.metric == metric), None)

    def _stat(self, metric: str) -> str:
        """The percentile the SLA judges ``metric`` by (the chart shows that one), p99 without a limit."""
        lim = self._limit(metric)
        return lim.stat if lim is not None else "p99"

    def _charts(self, steps: tuple[StepSummary, ...]) -> None:
        by = {"x": "speed", "req/s": "req/s"}.get(steps[0].unit, "users") if steps else "users"
        inferred = self._knee.inferred if self._knee is not None else None
        lo, hi = inferred.ci95 if inferred is not None and inferred.boundary != "bound" else (None, None)

        def show(chart: LimitBarChart, metric: str, name: str, k: int) -> None:
            stat, lim = self._stat(metric), self._limit(metric)
            chart.title = f"{stat} {name} by {by}"
            curve = inferred.curve(f"{metric}_{stat}") if inferred is not None else None
            bars = []
            for s in steps:
                fit = curve.at(s.level) if curve is not None else None
                bars.append(
                    Bar(
                        f"{s.level:g}",
                        s.latency.of(metric).stat(stat),
                        self.predicted.get(s.level, (None, None))[k],
                        fit[0] if fit else None,
                        (fit[1], fit[2]) if fit else None,
                        lo is not None and hi is not None and lo <= s.level <= hi,
                    )
                )
            chart.show(bars, lim.value if lim is not None else None)

        show(self.ttft_chart, "ttft", "TTFT", 0)
        show(self.itl_chart, "itl", "ITL", 1)
        self._bars_of = steps

    def show_finished(self, message: str, ok: bool) -> None:
        self.set_running(False)
        self.status.update(Text(message, style="bold green" if ok else "bold red"))
