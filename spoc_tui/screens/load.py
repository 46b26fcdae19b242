"""The Load screen: choose a profile, the user steps and the SLA; watch the ramp find its knee."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Label, Select, Static

from spoc_tui.core import fmt
from spoc_tui.core.loadmath import Knee, Limit, StepSummary, SlaError, parse_sla, parse_users
from spoc_tui.load.profiles import ProfileError, builtin_names, load_profile
from spoc_tui.load.ramp import RampProgress
from spoc_tui.widgets.charts import Bar, LimitBarChart
from spoc_tui.widgets.tables import Cell, DiffTable


class StepTable(DiffTable):
    def __init__(self, **kw: object) -> None:
        super().__init__(
            [("u", "Users", 5), ("rps", "req/s", 6), ("tok", "out t/s", 7), ("good", "goodput", 7), ("ttft", "TTFT p99", 8),
             ("itl", "ITL p99", 7), ("err", "err%", 5), ("q", "queue", 5), ("kv", "KV", 5), ("v", "verdict", 16)],
            **kw,  # type: ignore[arg-type]
        )

    def show(self, steps: tuple[StepSummary, ...]) -> None:
        rows: dict[str, list[Cell]] = {}
        for s in steps:
            srv = s.server or {}
            ok = bool(s.verdict.get("ok"))
            rows[str(s.step)] = [
                str(s.users), f"{s.request_rate:.2f}", f"{s.output_tokens_per_s:.0f}", f"{s.goodput:.2f}",
                fmt.seconds(s.latency["ttft"]["p99"]), fmt.seconds(s.latency["itl"]["p99"]), f"{s.error_rate * 100:.1f}",
                fmt.num(srv.get("waiting_max")), fmt.pct(srv.get("kv_cache_usage_max")),
                Text("meets SLA" if ok else f"breaks {s.verdict.get('broken_limit')}", style="green" if ok else "bold red"),
            ]
        self.sync(rows)


def knee_text(knee: Knee | None, done: bool) -> Text:
    if knee is None:
        return Text("knee: no step finished yet", style="dim")
    if knee.first_failing_users is None:
        msg = f"knee: not reached yet; {knee.max_users_within_sla} users meet the SLA" if not done else f"knee: not reached; {knee.max_users_within_sla} users still meet the SLA"
        return Text(msg, style="green")
    if knee.max_users_within_sla is None:
        return Text(f"knee: even {knee.first_failing_users} users break the SLA ({knee.broken_limit})", style="bold red")
    return Text(f"knee: {knee.max_users_within_sla} users meet the SLA; {knee.first_failing_users} break {knee.broken_limit}", style="bold yellow")


class LoadScreen(Screen[None]):
    """Start/stop a ramp against the monitored server; the monitor is one key away (m)."""

    BINDINGS = [
        Binding("m,escape", "app.pop_screen", "Monitor"),
        Binding("ctrl+r", "start", "Start ramp"),
        Binding("ctrl+x", "stop", "Stop ramp"),
        Binding("f8", "app.screenshot", "Screenshot"),
    ]

    DEFAULT_CSS = """
    LoadScreen Horizontal { height: auto; }
    LoadScreen #form, LoadScreen #form2 { height: auto; padding: 0 1; }
    LoadScreen #form Input { width: 1fr; }
    LoadScreen #form Select { width: 18; }
    LoadScreen #form Label, LoadScreen #form2 Label { padding: 1 1 0 0; }
    LoadScreen #form2 Input { width: 1fr; }
    LoadScreen #buttons { height: auto; padding: 0 1; }
    LoadScreen #buttons Button { margin-right: 2; min-width: 12; }
    LoadScreen #charts { height: auto; margin-top: 1; }
    LoadScreen #status { height: auto; padding: 0 1; }
    LoadScreen #knee { height: auto; padding: 0 1; }
    LoadScreen #form-error { color: $error; height: auto; padding: 0 1; }
    """

    def __init__(self, url: str | None) -> None:
        super().__init__()
        self.url = url
        self.running = False
        self.limits: tuple[Limit, ...] = ()

    def compose(self) -> ComposeResult:
        yield Static(f"Load ramp against {self.url or 'no server (start the monitor with --url)'}", id="title")
        with VerticalScroll(id="body"):
            with Horizontal(id="form"):
                yield Label("profile")
                yield Select([(n, n) for n in builtin_names()], value="chatbot", allow_blank=False, id="profile")
                yield Label("users")
                yield Input("1,2,4,8,16,32", id="users")
                yield Label("step s")
                yield Input("60", id="step", restrict=r"[0-9.]*")
                yield Label("warm-up s")
                yield Input("10", id="warmup", restrict=r"[0-9.]*")
            with Horizontal(id="form2", classes="-row"):
                yield Label("SLA")
                yield Input("ttft_p99<=2s,itl_p99<=100ms", id="sla")
            yield Static("", id="form-error")
            with Horizontal(id="buttons"):
                yield Button("Start (ctrl+r)", id="start", variant="success", disabled=self.url is None)
                yield Button("Stop (ctrl+x)", id="stop", variant="error", disabled=True)
            yield Static(Text("idle", style="dim"), id="status")
            with Horizontal(id="charts"):
                yield LimitBarChart("p99 TTFT by users", id="ttft-chart")
                yield LimitBarChart("p99 ITL by users", id="itl-chart")
            with Vertical(classes="panel", id="steps-panel"):
                yield StepTable(id="steps")
            yield Static(knee_text(None, False), id="knee")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#steps-panel").border_title = "Steps"
        self.steps = self.query_one(StepTable)
        self.ttft_chart = self.query_one("#ttft-chart", LimitBarChart)
        self.itl_chart = self.query_one("#itl-chart", LimitBarChart)
        self.status = self.query_one("#status", Static)
        self.knee = self.query_one("#knee", Static)
        self.form_error = self.query_one("#form-error", Static)

    # -- form -------------------------------------------------------------------------------
    def read_form(self) -> dict[str, object] | None:
        """Validated ramp settings, or None with the problem shown under the form."""
        try:
            users = parse_users(self.query_one("#users", Input).value)
            limits = parse_sla(self.query_one("#sla", Input).value)
            step = float(self.query_one("#step", Input).value or "0")
            warm = float(self.query_one("#warmup", Input).value or "0")
            if step <= 0 or not 0 <= warm < step:
                raise ValueError("warm-up must be at least 0 and shorter than the step")
            profile = load_profile(str(self.query_one("#profile", Select).value))
        except (ValueError, SlaError, ProfileError) as e:
            self.form_error.update(str(e))
            return None
        self.form_error.update("")
        self.limits = limits
        return {"users": users, "limits": limits, "step_s": step, "warmup_s": warm, "profile": profile}

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "start":
            self.action_start()
        elif event.button.id == "stop":
            self.action_stop()

    def action_start(self) -> None:
        if self.running or self.url is None:
            return
        form = self.read_form()
        if form is None:
            return
        self.app.start_ramp(form)  # type: ignore[attr-defined]

    def action_stop(self) -> None:
        if self.running:
            self.app.stop_ramp()  # type: ignore[attr-defined]

    def set_running(self, running: bool) -> None:
        self.running = running
        self.query_one("#start", Button).disabled = running or self.url is None
        self.query_one("#stop", Button).disabled = not running

    # -- progress -----------------------------------------------------------------------------
    def show_progress(self, p: RampProgress) -> None:
        total = len(self.app.ramp_users) if getattr(self.app, "ramp_users", None) else "?"  # type: ignore[attr-defined]
        phase = {"preflight": "checking the server", "starting": "starting Locust", "warmup": "warming up",
                 "measuring": "measuring", "step_done": "step done", "done": "finished"}.get(p.phase, p.phase)
        out_rate = p.steps[-1].output_tokens_per_s if p.steps else None
        self.status.update(Text(
            f"step {p.step}/{total} · {p.users} users · {phase} · {p.samples} requests · "
            f"last step {fmt.rate(out_rate, ' out tok/s')} · {p.elapsed_s:.0f}s elapsed", style="bold"))
        with self.app.batch_update():
            self.steps.show(p.steps)
            self._charts(p.steps)
            self.knee.update(knee_text(p.knee, p.phase == "done"))

    def _charts(self, steps: tuple[StepSummary, ...]) -> None:
        def limit_for(metric: str) -> float | None:
            for lim in self.limits:
                if lim.metric == metric:
                    return lim.value
            return None

        self.ttft_chart.show([Bar(str(s.users), s.latency["ttft"]["p99"]) for s in steps], limit_for("ttft"))
        self.itl_chart.show([Bar(str(s.users), s.latency["itl"]["p99"]) for s in steps], limit_for("itl"))

    def show_finished(self, message: str, ok: bool) -> None:
        self.set_running(False)
        self.status.update(Text(message, style="bold green" if ok else "bold red"))
