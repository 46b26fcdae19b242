"""The Monitor screen: servers, latency, GPUs, TP groups and alerts, source status."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical, VerticalScroll
from textual.screen import Screen
from textual.timer import Timer
from textual.widget import Widget
from textual.widgets import Footer, Static

from spoc_tui.core import fmt
from spoc_tui.core.hardware.roofline import gpu_of
from spoc_tui.core.monitor.fleet import waiting_per_replica
from spoc_tui.core.monitor.model import HeadroomShown, MonitorModel
from spoc_tui.core.monitor.series import WINDOWS_S, Window
from spoc_tui.core.monitor.snapshots import SourceStatus, VllmTick
from spoc_tui.tui.messages import GpusSampled, ServersSampled
from spoc_tui.tui.textual_mode import use_lean_compositor
from spoc_tui.tui.widgets.panels import (
    ChangedStatic,
    GpuTable,
    LatencyTable,
    RooflineTable,
    ServerTable,
    StatusLine,
    TpPanel,
)
from spoc_tui.tui.widgets.timechart import PALETTE, Line, TimeChart, span_text

_VERDICT_STYLE = {"ok": "green", "warning": "bold yellow", "error": "bold red"}
_EVENT_STYLE = {"info": "", "warning": "yellow", "error": "red"}


def _ms(v: float) -> str:
    return f"{v * 1000:.3g} ms" if v < 1 else f"{v:.3g} s"


def _n(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:.3g}M"
    return f"{v / 1000:.3g}k" if v >= 1000 else f"{v:.3g}"


WIDE_COLUMNS = 170
"""From this many columns the monitor's panels go two by two."""


class MonitorScreen(Screen[None]):
    """Live view. Handlers apply whole ticks; widgets never fetch anything."""

    BINDINGS = [
        ("p", "app.toggle_pause", "Pause"),
        ("l", "app.load", "Load ramp"),
        ("c", "app.capacity", "Capacity"),
        ("t", "app.tune", "Tune"),
        # w and F8 stay out of the footer so that q Quit fits at 80 columns (both are in ? and ctrl+p)
        Binding("w", "chart_window", "Chart span", show=False),
        ("question_mark", "app.push_screen('help')", "Help"),
        Binding("f8", "app.screenshot", "Screenshot", show=False),
        ("q", "app.quit", "Quit"),
    ]

    _status_timer: Timer | None = None
    """Redraws the status line each second while a source is down (its "retry N s" counts)."""

    def __init__(self, title: str, model: MonitorModel, gpu_cost_per_hour: float | None = None) -> None:
        """``model``: what the screen draws (the app's: verdicts and alerts computed once per
        tick, also for a replay)."""
        super().__init__()
        use_lean_compositor(self)  # a second's repaint renders the changed lines only
        self._headroom_note: str | None = None
        self._headroom_ages: tuple[str | None, ...] = ()
        self.model = model
        self.limits = model.limits
        self.events = model.events
        self.span_s = WINDOWS_S[1]
        self._events_drawn = -1
        self.background = ""
        """What runs in the background (a ramp, a study), shown in the title."""
        self.gpu_cost_per_hour = gpu_cost_per_hour
        self.title_text = title
        self.window_s = model.window_s
        self.paused = False
        self.ready = False
        self.drawn = 0
        """Server ticks drawn (the CPU benchmark counts them)."""

    @property
    def clock(self) -> Callable[[], float]:
        """Wall-clock seconds for the events and charts (tests and replays pin it)."""
        return self.model.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.model.clock = clock

    def compose(self) -> ComposeResult:
        yield Static(self.title_text, id="title")
        with VerticalScroll(id="body"):
            with Vertical(id="servers-panel", classes="panel"):
                # the verdict first: at 80x24 the headline (a growing queue, a full KV cache) is the top line
                yield ChangedStatic("", id="verdicts")
                yield ChangedStatic("", id="server-info")
                yield ServerTable(id="servers")
                yield ChangedStatic("", id="spec")
                yield ChangedStatic("", id="headroom")
            with Vertical(id="latency-panel", classes="panel"):
                yield LatencyTable(id="latency")
            with Vertical(id="roofline-panel", classes="panel"):
                yield RooflineTable(id="roofline")
            with Vertical(id="gpu-panel", classes="panel"):
                yield GpuTable(id="gpus")
                yield ChangedStatic("", id="gpu-note")
                yield ChangedStatic("", id="efficiency")
            with Vertical(id="tp-panel", classes="panel"):
                yield TpPanel(id="tp")
            with Vertical(id="events-panel", classes="panel"):
                yield ChangedStatic("", id="events")
            with Grid(id="charts"):
                yield TimeChart("Requests", _n, id="c-requests")
                yield TimeChart("KV cache", lambda v: f"{v:.0f}%", y_max=100.0, id="c-kv")
                yield TimeChart("Tokens/s", _n, id="c-tokens")
                yield TimeChart("TTFT p99", _ms, id="c-ttft")
                yield TimeChart("ITL p99", _ms, id="c-itl")
                yield TimeChart("SM MHz", lambda v: f"{v:.0f}", id="c-clock")
                yield TimeChart("GPU °C", lambda v: f"{v:.0f}", id="c-temp")
                yield TimeChart("GPU W", lambda v: f"{v:.0f}", id="c-power")
        yield StatusLine(id="status")
        yield Footer()

    def on_mount(self) -> None:
        self.servers = self.query_one(ServerTable)
        self.latency = self.query_one(LatencyTable)
        self.roofline = self.query_one(RooflineTable)
        self.gpus = self.query_one(GpuTable)
        self.tp = self.query_one(TpPanel)
        self.status = self.query_one(StatusLine)
        self.gpu_note = self.query_one("#gpu-note", ChangedStatic)
        self.efficiency = self.query_one("#efficiency", ChangedStatic)
        self.spec = self.query_one("#spec", ChangedStatic)
        self.spec.display = False
        self.server_info = self.query_one("#server-info", ChangedStatic)
        self.verdicts = self.query_one("#verdicts", ChangedStatic)
        self.headroom_view = self.query_one("#headroom", ChangedStatic)
        self.headroom_view.display = False
        self.events_view = self.query_one("#events", ChangedStatic)
        self.events_panel = self.query_one("#events-panel")
        self.events_panel.border_title = "Events"
        self.charts = self.query_one("#charts", Grid)
        # kept, not queried per draw: a tick that lands while the app shuts down finds them still
        self._chart = {str(c.id): c for c in self.query(TimeChart)}
        self.body = self.query_one("#body")
        self.title_bar = self.query_one("#title", Static)
        self.latency.limits = self.limits
        self.efficiency.display = False
        self.servers_panel = self.query_one("#servers-panel")
        self.latency_panel = self.query_one("#latency-panel")
        self.gpu_panel = self.query_one("#gpu-panel")
        self.servers_panel.border_title = "vLLM servers"
        self.latency_panel.border_title = "Latency"
        self.gpu_panel.border_title = "GPUs"
        self.roofline_panel = self.query_one("#roofline-panel")
        self.roofline_panel.border_title = "Roofline (vLLM's FLOP/byte estimates, per GPU)"
        self.query_one("#tp-panel").border_title = "TP groups & alerts"
        self.ready = True
        self.gpu_note.display = False
        self._draw_tp()
        self._draw_events()
        self._draw_headroom()
        self._draw_charts()
        # "stale N s" and "retry in N s" count every second, not only when a tick arrives (only
        # while a source is down: otherwise the ticks redraw the line, and this would wake the
        # screen each second for nothing)
        self._status_timer = self.set_interval(1.0, self._draw_status, pause=True)
        self._draw_status()

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit_charts)

    def _fit_charts(self) -> None:
        """Charts take the rows the panels leave (the terminal's size, not a fixed height): two
        to four per row by width, at least 7 rows each (below the fold at 80x24, scrolled to)."""
        if not self.ready:
            return
        body = self.body
        width = body.size.width
        # a wide terminal: panels two by two (the servers, events and charts across), not one
        # narrow column with most of the width empty
        wide = width >= WIDE_COLUMNS
        if body.has_class("-wide") != wide:
            body.set_class(wide, "-wide")
            self.call_after_refresh(self._fit_charts)  # the panels moved: measure again
            return
        cols = 4 if width >= 156 else 3 if width >= 108 else 2
        n = len(self.charts.children)
        rows = math.ceil(n / cols)
        # what the panels above take: where the charts start in the body's content
        used = (
            self.charts.virtual_region.y
            if wide
            else sum(w.outer_size.height for w in body.children if w is not self.charts and w.display)
        )
        height = max(rows * 7, body.size.height - used)
        if self.charts.styles.grid_size_columns != cols:
            self.charts.styles.grid_size_columns = cols
        if self.charts.styles.height is None or self.charts.styles.height.value != height:
            self.charts.styles.height = height

    # -- message handlers ---------------------------------------------------------------
    def ingest_servers(self, tick: VllmTick) -> None:
        """Take a tick into the model (history, events, verdicts) without drawing (a replay's seek)."""
        self.model.servers(tick)

    def apply_servers(self, msg: ServersSampled) -> None:
        if not self.ready or not self.is_attached:
            return
        self.ingest_servers(msg.tick)
        self._draw_servers(shared=not msg.gpus_follow)
        ages = tuple(self.model.headroom_age(src) for src in sorted(self.model.headroom))
        if ages != self._headroom_ages:  # a minute older: the line says so
            self._headroom_ages = ages
            self._draw_headroom()

    def _draw_servers(self, shared: bool = True) -> None:
        """``shared``: also the panels the GPU ticks feed too (False: a GPU tick follows at once
        and draws them; twice a second was a tenth of the monitor's CPU)."""
        tick = self.model.vllm
        if tick is None:
            return
        self.drawn += 1
        with self.app.batch_update():
            self.servers.show(tick)
            self._draw_info()
            view = tick.total if tick.total is not None else (tick.servers[0].total if tick.servers else None)
            if view is not None:
                stale = tick.total is None and bool(tick.servers) and tick.servers[0].source in tick.stale
                self.latency.show(view, stale)
                win = "lifetime" if view.window == "lifetime" else f"last {view.window} (window {self.window_s:g}s)"
                self._title(self.latency_panel, f"Latency over {win}")
            sim = any(s.simulated for s in tick.servers)
            title = "vLLM servers" + (" — SIMULATED" if sim else "")
            per = waiting_per_replica(tick.servers, tick.stale) if len(tick.servers) > 1 else None
            if per is not None:
                title += f" · {per:.1f} waiting per replica (the autoscaling signal)"
            self._title(self.servers_panel, title)
            self.servers_panel.set_class(bool(tick.stale), "-stale")
            self._draw_spec()
            if shared:
                self._draw_verdicts()
                self._draw_roofline()
                self._draw_tp()
                self._draw_status()
                self._draw_events()
            self._draw_server_charts()
            if self.model.gpu_tick is None:  # no GPU source (yet): its charts say so
                self._draw_gpu_charts()
        self._fit_charts()

    def learning_headroom(self, note: str) -> None:
        """The live headroom is on: ``note`` says when its first estimate comes."""
        self._headroom_note = note
        if self.ready:
            self._draw_headroom()

    def apply_headroom(self, results: Mapping[str, HeadroomShown]) -> None:
        """Each server's headroom as just worked out: its line under the servers, an alert
        when it is low."""
        self.model.set_headroom(results)
        if self.ready and self.is_attached:
            self._draw_headroom()
            self._draw_tp()

    def _draw_headroom(self) -> None:
        note = self._headroom_note
        if note is None and not self.model.headroom:
            return
        self.headroom_view.display = True
        t = Text()
        if not self.model.headroom:
            t.append(note or "", style="dim")
        for i, (src, h) in enumerate(sorted(self.model.headroom.items())):
            if i:
                t.append("\n")
            low = h.identified and h.estimate is not None and h.estimate < self.model.headroom_alert
            style = "bold yellow" if low else "" if h.identified else "dim"
            if len(self.model.headroom) > 1:
                t.append(fmt.short_source(src) + " ", style="bold")
            t.append(h.line, style=style)
            age = self.model.headroom_age(src)
            if age is not None:
                t.append(f" ({age})", style="dim")
            trend = self.model.headroom_trend(src)
            if trend is not None:
                t.append(f"\n  {trend}", style="dim")
            if h.ledger:
                t.append(f"\n  {h.ledger}", style="dim")
        fleet = self.model.fleet_headroom()
        if fleet is not None:
            t.append("\n" + fleet, style="bold")
        self.headroom_view.show_text(t)

    def set_models(self, source: str, models: dict[str, int | None]) -> None:
        """What /v1/models says of a server (max-model-len per model)."""
        self.model.set_models(source, models)
        if self.ready:
            self._draw_info()

    def _draw_info(self) -> None:
        """What is served: model, engine version and the KV cache it was given."""
        tick = self.model.vllm
        if tick is None or not tick.servers:
            return
        parts: list[str] = []
        seen: set[tuple[str, ...]] = set()
        for server in tick.servers:
            key = (fmt.names(server.model_names) if server.model_names else "", server.engine_version)
            if key in seen:
                continue
            seen.add(key)
            cc = server.cache_config
            kv = ""
            if cc.get("kv_cache_size_tokens") not in (None, "None"):
                kv = f" · KV {float(cc['kv_cache_size_tokens']):,.0f} tokens"
            elif cc.get("num_gpu_blocks") not in (None, "None") and cc.get("block_size") not in (None, "None"):
                kv = f" · KV {float(cc['num_gpu_blocks']) * float(cc['block_size']):,.0f} tokens"
            if cc.get("kv_cache_max_concurrency") not in (None, "None"):
                kv += f" (max {float(cc['kv_cache_max_concurrency']):,.0f} full-length requests)"
            if cc.get("enable_prefix_caching") == "True":
                kv += " · prefix caching"
            version = f"vLLM {server.engine_version}" if server.engine_version else "vLLM version n/a"
            lens = {n for n in self.model.models.get(server.source, {}).values() if n}
            max_len = f" · max-model-len {max(lens):,}" if lens else ""
            parts.append(f"{key[0] or 'model n/a'} · {version}{max_len}{kv}")
        n = len(tick.servers)
        text = "; ".join(parts) + (f" · {n} replicas" if n > 1 else "")
        self.server_info.show_text(Text(text, style="dim"))

    def _draw_verdicts(self) -> None:
        t = Text()
        for i, (src, v) in enumerate(self.model.verdicts):
            if i:
                t.append("\n")
            t.append("● " if v.severity == "ok" else "▲ ", style=_VERDICT_STYLE[v.severity])
            t.append(fmt.short_source(src) + " ", style="bold")
            t.append(v.word, style=_VERDICT_STYLE[v.severity])
            if v.reason:
                t.append(": " + v.reason)
            if v.since is not None:
                t.append(f" · since {time.strftime('%H:%M:%S', time.localtime(v.since))}", style="dim")
            if v.causes:  # the lower rungs that also hold: the causes under the headline
                t.append("\n  also " + " · ".join(v.causes), style="dim")
        self.verdicts.show_text(t)

    def _draw_events(self) -> None:
        if self.events.added == self._events_drawn:
            return
        self._events_drawn = self.events.added
        recent = self.events.recent(6)
        t = Text()
        if not recent:
            t.append(
                "nothing yet: throttling, restarts, preemption bursts, sources down/up, ramp and study steps", "dim"
            )
        for i, e in enumerate(reversed(recent)):
            if i:
                t.append("\n")
            t.append(e.clock() + " ", style="dim")
            t.append(e.text, style=_EVENT_STYLE.get(e.severity, ""))
        total = len(self.events)
        self._title(self.events_panel, f"Events (newest first, {total} kept)" if total > 6 else "Events")
        self.events_view.show_text(t)

    def action_chart_window(self) -> None:
        """``w``: the charts' span cycles 1, 5, 15, 60 minutes."""
        i = WINDOWS_S.index(self.span_s) if self.span_s in WINDOWS_S else 0
        self.span_s = WINDOWS_S[(i + 1) % len(WINDOWS_S)]
        self.notify(f"charts span the last {span_text(self.span_s)}", timeout=2)
        self._draw_charts()

    def _draw_charts(self) -> None:
        self._draw_server_charts()
        self._draw_gpu_charts()

    def _span(self) -> tuple[float, Callable[[str], Window]]:
        """The charts' now, and each series' window over their span."""
        now = self.clock()
        since = now - self.span_s
        return now, lambda key: self.model.series.window(key, since)

    def _draw_server_charts(self) -> None:
        """The five charts the servers feed (the GPU ticks' three are drawn with the GPUs)."""
        if not self.ready:
            return
        now, pts = self._span()
        chart = self._chart.__getitem__
        sla = {lim.key: lim.value for lim in self.limits}
        chart("c-requests").show(
            [Line("running", pts("running"), "green"), Line("waiting", pts("waiting"), "yellow")],
            now,
            self.span_s,
        )
        chart("c-kv").show([Line("KV", pts("kv"), "magenta")], now, self.span_s)
        chart("c-tokens").show([Line("out", pts("out"), "green"), Line("in", pts("in"), "cyan")], now, self.span_s)
        for cid, key in (("c-ttft", "ttft"), ("c-itl", "itl")):
            limit = sla.get(f"{key}_p99")
            chart(cid).show(
                [Line("p99", pts(key), "cyan")],
                now,
                self.span_s,
                ("SLA", limit) if limit else None,
                note="" if self.limits else "no SLA set (--sla)",
            )

    def _draw_gpu_charts(self) -> None:
        if not self.ready:
            return
        now, pts = self._span()
        chart = self._chart.__getitem__
        gpus = list(self.model.gpu_tick.gpus) if self.model.gpu_tick is not None else []
        multi = len({g.hostname for g in gpus}) > 1
        limits = {
            "temp": ("slowdown", gpus[0].slowdown_temp_c) if gpus and gpus[0].slowdown_temp_c else None,
            "power": ("limit", gpus[0].power_limit_w) if gpus and gpus[0].power_limit_w else None,
        }
        for cid, kind in (("c-clock", "clock"), ("c-temp", "temp"), ("c-power", "power")):
            lines = [
                Line(
                    (f"{g.hostname}:" if multi and g.hostname else "") + g.gpu,
                    pts(f"{kind}:{g.key}"),
                    PALETTE[i % len(PALETTE)],
                )
                for i, g in enumerate(gpus[:8])
            ]
            note = "no GPU source" if not gpus else ""
            chart(cid).show(lines, now, self.span_s, limits.get(kind), note=note)

    def _draw_spec(self) -> None:
        """Speculative decoding, shown only where the server exports its counters."""
        v = self.model.fleet_view
        if v is None or v.spec_acceptance is None:
            self.spec.display = False
            return
        self.spec.display = True
        length = f", {v.spec_mean_length:.2f} tokens per draft" if v.spec_mean_length is not None else ""
        self.spec.show_text(
            Text(f"speculative decoding: {v.spec_acceptance:.0%} of draft tokens accepted{length} (window)")
        )

    def ingest_gpus(self, msg: GpusSampled) -> None:
        """Take a GPU tick into the model (history, events, energy, verdicts) without drawing."""
        self.model.gpus(msg.tick, msg.groups, msg.note)

    def ingest_status(self, status: SourceStatus) -> None:
        self.model.status(status)

    def reset_history(self) -> None:
        """Forget charts, events and alerts' history (a replay seeking back)."""
        self.model.reset()
        self._events_drawn = -1

    def redraw(self) -> None:
        """Draw the whole state (after :meth:`ingest_servers` and friends)."""
        if not self.ready:
            return
        self._events_drawn = -1
        self._draw_servers()
        self._draw_gpus()
        self._draw_status()
        self._draw_tp()
        self._draw_verdicts()
        self._draw_events()
        self._draw_charts()

    def set_title(self, text: str) -> None:
        self.title_text = text
        if self.ready:
            self.title_bar.update(text)

    def apply_gpus(self, msg: GpusSampled) -> None:
        if not self.ready or not self.is_attached:
            return
        self.ingest_gpus(msg)
        self._draw_gpus()

    def _draw_gpus(self) -> None:
        tick = self.model.gpu_tick
        if tick is None:
            return
        draggers = {m.gpu.key for g in self.model.groups for m in g.draggers}
        with self.app.batch_update():
            self.gpus.show(tick, draggers, self.model.replicas())
            if self.gpus.display != bool(tick.gpus):
                self.gpus.display = bool(tick.gpus)
                self.gpu_note.display = not tick.gpus
            if not tick.gpus:
                self.gpu_note.show_text(Text(self.model.gpu_note or "No GPU data yet.", style="dim"))
            sim = any(g.simulated for g in tick.gpus)
            self._title(self.gpu_panel, "GPUs" + (" — SIMULATED" if sim else ""))
            self._draw_roofline()
            self._draw_efficiency()
            self._draw_tp()
            self._draw_status()
            self._draw_verdicts()
            self._draw_events()
            self._draw_gpu_charts()

    def _draw_efficiency(self) -> None:
        view = self.model.fleet_view
        eff = self.model.energy.efficiency(view.generation_tokens_rate if view else None, self.gpu_cost_per_hour)
        if eff is None:
            self.efficiency.display = False
            return
        self.efficiency.display = True
        self.efficiency.show_text(Text("energy: " + eff.text(self.gpu_cost_per_hour), style="dim"))

    @staticmethod
    def _title(widget: Widget, title: str) -> None:
        if widget.border_title != title:
            widget.border_title = title

    def apply_status(self, status: SourceStatus) -> None:
        self.ingest_status(status)
        if not self.ready or not self.is_attached:
            return
        self._draw_status()
        self._draw_verdicts()
        self._draw_tp()
        self._draw_events()

    def _draw_roofline(self) -> None:
        if self.model.vllm is None:
            return
        names = [g.model for g in self.model.gpu_tick.gpus] if self.model.gpu_tick is not None else []
        gpu = gpu_of(names) if names else None
        mixed = len({n for n in names if n}) > 1
        self.roofline.show(self.model.vllm, gpu, "mixed GPUs" if mixed else "GPU unknown")
        peak = (
            f" vs {gpu.label} peak"
            if gpu
            else (" (mixed GPUs: no single peak)" if mixed else " (GPU unknown: no peak)")
        )
        self._title(self.roofline_panel, f"Roofline per GPU, over {self._vllm_window()}{peak}")

    def _vllm_window(self) -> str:
        tick = self.model.vllm
        if tick is None or not tick.servers:
            return "n/a"
        w = tick.servers[0].total.window
        return "lifetime" if w == "lifetime" else f"last {w}"

    def _draw_tp(self) -> None:
        self.tp.show(self.model.groups, list(self.model.alerts), None)

    def _draw_status(self) -> None:
        statuses = list(self.model.statuses.values())
        self.status.show(statuses, self.paused, self.background, self.clock())
        if self._status_timer is not None:  # pausing or resuming twice is a no-op
            if any(not s.up for s in statuses):
                self._status_timer.resume()
            else:
                self._status_timer.pause()

    def set_background(self, text: str) -> None:
        """A ramp or study running behind the monitor (empty: none)."""
        self.background = text
        if self.ready:
            self._draw_status()

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        self._draw_status()

    def busy(self) -> str | None:
        """What the first server is already doing (see :meth:`MonitorModel.busy`)."""
        return self.model.busy()

    def seen(self) -> tuple[tuple[str, ...], dict[str, str], str | None, int | None] | None:
        """What the first server says of itself (see :meth:`MonitorModel.seen`)."""
        return self.model.seen()

    def summary(self) -> str:
        """A one-line summary (used by tests and the screenshot script)."""
        if self.model.vllm is None or not self.model.vllm.servers:
            return "no data"
        v = self.model.vllm.servers[0].total
        return f"running {fmt.num(v.running)} waiting {fmt.num(v.waiting)} kv {fmt.pct(v.kv_cache_usage)}"
