"""The Monitor screen: servers, latency, GPUs, TP groups and alerts, source status."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

from spoc_tui.core import fmt
from spoc_tui.core.alerts import Alert, gpu_alerts, server_alerts, shed_alerts
from spoc_tui.core.energy import EnergyMeter
from spoc_tui.core.events import THROTTLE_HOLD_S, EventDetector, EventLog
from spoc_tui.core.fleet import lagging, replica_of_gpu, waiting_per_replica
from spoc_tui.core.gpu import GpuSample, TpGroupReport
from spoc_tui.core.redact import redact_url
from spoc_tui.core.roofline import gpu_of
from spoc_tui.core.series import WINDOWS_S, SeriesStore
from spoc_tui.core.sla import Limit
from spoc_tui.core.snapshots import GpuTick, SourceStatus, VllmTick
from spoc_tui.core.verdict import Verdict, verdict
from spoc_tui.core.vllm import EngineView, ServerView
from spoc_tui.tui.messages import GpusSampled, ServersSampled
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

    def __init__(
        self,
        title: str,
        window_s: float,
        gpu_cost_per_hour: float | None = None,
        limits: tuple[Limit, ...] = (),
        events: EventLog | None = None,
    ) -> None:
        super().__init__()
        self.limits = limits
        self.clock: Callable[[], float] = time.time
        """Wall-clock seconds for the events and charts (tests pin it)."""
        self.events = events if events is not None else EventLog()
        self.detector = EventDetector()
        self.series = SeriesStore()
        self.span_s = WINDOWS_S[1]
        self._waits: dict[str, deque[float | None]] = {}
        self._models: dict[str, dict[str, int | None]] = {}
        self._alert_seen: dict[str, tuple[float, Alert]] = {}
        self._events_drawn = -1
        self.background = ""
        """What runs in the background (a ramp, a study), shown in the title."""
        self.energy = EnergyMeter(window_s)
        self.gpu_cost_per_hour = gpu_cost_per_hour
        self.title_text = title
        self.window_s = window_s
        self._server_hist: deque[tuple[float | None, float | None, float | None]] = deque(maxlen=30)
        self._statuses: dict[str, SourceStatus] = {}
        self._vllm: VllmTick | None = None
        self._gpus: GpuTick | None = None
        self._groups: tuple[TpGroupReport, ...] = ()
        self._gpu_note: str | None = None
        self.paused = False
        self.ready = False

    def compose(self) -> ComposeResult:
        yield Static(self.title_text, id="title")
        with VerticalScroll(id="body"):
            with Vertical(id="servers-panel", classes="panel"):
                yield ChangedStatic("", id="server-info")
                yield ServerTable(id="servers")
                yield ChangedStatic("", id="verdicts")
                yield ChangedStatic("", id="spec")
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
        self._draw_status()
        self._draw_events()
        self._draw_charts()
        # "stale N s" and "retry in N s" count every second, not only when a tick arrives
        self.set_interval(1.0, self._draw_status)

    def on_resize(self) -> None:
        self.call_after_refresh(self._fit_charts)

    def _fit_charts(self) -> None:
        """Charts take the rows the panels leave (the terminal's size, not a fixed height): two
        to four per row by width, at least 7 rows each (below the fold at 80x24, scrolled to)."""
        if not self.ready:
            return
        body = self.body
        width = body.size.width
        cols = 4 if width >= 156 else 3 if width >= 108 else 2
        n = len(self.charts.children)
        rows = math.ceil(n / cols)
        used = sum(w.outer_size.height for w in body.children if w is not self.charts and w.display)
        height = max(rows * 7, body.size.height - used)
        if self.charts.styles.grid_size_columns != cols:
            self.charts.styles.grid_size_columns = cols
        if self.charts.styles.height is None or self.charts.styles.height.value != height:
            self.charts.styles.height = height

    # -- message handlers ---------------------------------------------------------------
    def ingest_servers(self, tick: VllmTick) -> None:
        """Take a tick into the state (history, events) without drawing (a replay's seek)."""
        self._vllm = tick
        for s in tick.statuses:
            self._statuses[s.source] = s
        now = self.clock()
        self.events.extend(self.detector.servers(tick, now))
        view = self._live_view()
        self._record_servers(tick, view, now)
        if view is not None:
            self._server_hist.append((view.waiting, view.kv_cache_usage, view.preemptions_total))

    def _live_view(self) -> EngineView | None:
        """The fleet's view (or the one server's), None while its source is stale."""
        tick = self._vllm
        if tick is None or (tick.total is None and tick.servers and tick.servers[0].source in tick.stale):
            return None
        return self._fleet_view()

    def apply_servers(self, msg: ServersSampled) -> None:
        if not self.ready or not self.is_attached:
            return
        self.ingest_servers(msg.tick)
        self._draw_servers()

    def _draw_servers(self) -> None:
        tick = self._vllm
        if tick is None:
            return
        with self.app.batch_update():
            self.servers.show(tick)
            self._draw_info()
            self._draw_verdicts()
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
            self._draw_roofline()
            self._draw_spec()
            self._draw_tp()
            self._draw_status()
            self._draw_events()
            self._draw_charts()
        self._fit_charts()

    def _record_servers(self, tick: VllmTick, v: EngineView | None, now: float) -> None:
        """Chart history: the live view's figures (gaps while it is stale), each server's waiting."""
        add = self.series.add
        add("running", now, v.running if v else None)
        add("waiting", now, v.waiting if v else None)
        add("kv", now, None if v is None or v.kv_cache_usage is None else v.kv_cache_usage * 100)
        add("out", now, v.generation_tokens_rate if v else None)
        add("in", now, v.prompt_tokens_rate if v else None)
        add("ttft", now, v.latency["ttft"].p99 if v else None)
        add("itl", now, v.latency["itl"].p99 if v else None)
        for server in tick.servers:
            w = self._waits.setdefault(server.source, deque(maxlen=5))
            w.append(None if server.source in tick.stale else server.total.waiting)

    def set_models(self, source: str, models: dict[str, int | None]) -> None:
        """What /v1/models says of a server (max-model-len per model)."""
        self._models[source] = models
        if self.ready:
            self._draw_info()

    def _draw_info(self) -> None:
        """What is served: model, engine version and the KV cache it was given."""
        tick = self._vllm
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
            lens = {n for n in self._models.get(server.source, {}).values() if n}
            max_len = f" · max-model-len {max(lens):,}" if lens else ""
            parts.append(f"{key[0] or 'model n/a'} · {version}{max_len}{kv}")
        n = len(tick.servers)
        text = "; ".join(parts) + (f" · {n} replicas" if n > 1 else "")
        self.server_info.show_text(Text(text, style="dim"))

    def _replicas(self) -> dict[str, str]:
        """GPU key -> the replica it serves, with several servers (see :func:`replica_of_gpu`)."""
        if self._vllm is None or len(self._vllm.servers) <= 1 or self._gpus is None:
            return {}
        servers = [s.source for s in self._vllm.servers]
        settings = getattr(self.app, "settings", None)
        gpu_sources = [redact_url(u) for u in getattr(settings, "dcgm_urls", [])]
        out = {}
        for g in self._gpus.gpus:
            r = replica_of_gpu(g.source, g.hostname, servers, gpu_sources)
            if r is not None:
                out[g.key] = r
        return out

    def _server_gpus(self, server: ServerView) -> list[GpuSample]:
        """The GPUs that serve ``server``: all of them with one server, else those mapped to it."""
        gpus = list(self._gpus.gpus) if self._gpus is not None else []
        if self._vllm is None or len(self._vllm.servers) <= 1:
            return gpus
        mapping = self._replicas()
        return [g for g in gpus if mapping.get(g.key) == server.source]

    def verdicts_now(self) -> list[tuple[str, Verdict]]:
        """One verdict per server: those that answered, then those that never did."""
        out: list[tuple[str, Verdict]] = []
        tick = self._vllm
        known: set[str] = set()
        throttling = self.detector.throttling()
        for server in tick.servers if tick is not None else ():
            known.add(server.source)
            st = self._statuses.get(server.source)
            down = None
            if tick is not None and server.source in tick.stale:
                down = (st.reason if st and st.reason else "no answer") + (
                    f"; figures from {self.clock() - st.last_ok:.0f} s ago" if st and st.last_ok else ""
                )
            hot = [
                f"GPU {g.gpu} {g.throttle_kind() or 'throttled'}"
                for g in self._server_gpus(server)
                if g.key in throttling
            ]
            waits = [w for w in self._waits.get(server.source, ()) if w is not None]
            out.append(
                (
                    server.source,
                    verdict(
                        server.total, down=down, throttled=hot, limits=self.limits, waiting=min(waits, default=None)
                    ),
                )
            )
        for src, st in self._statuses.items():
            if not st.up and src not in known and self._is_server(src):
                out.append((src, Verdict("down", "error", (st.reason or "no answer") + "; never answered")))
        return out

    def _is_server(self, source: str) -> bool:
        urls = getattr(self.app, "settings", None)
        vllm = getattr(urls, "vllm_urls", []) or []
        return any(source == u or source.startswith(u.rstrip("/")) for u in vllm)

    def _draw_verdicts(self) -> None:
        t = Text()
        for i, (src, v) in enumerate(self.verdicts_now()):
            if i:
                t.append("\n")
            t.append("● " if v.severity == "ok" else "▲ ", style=_VERDICT_STYLE[v.severity])
            t.append(fmt.short_source(src) + " ", style="bold")
            t.append(v.word, style=_VERDICT_STYLE[v.severity])
            if v.reason:
                t.append(": " + v.reason)
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
        if not self.ready:
            return
        now = self.clock()
        since = now - self.span_s
        pts = self.series.points

        def chart(cid: str) -> TimeChart:
            return self._chart[cid]

        sla = {lim.key: lim.value for lim in self.limits}
        chart("c-requests").show(
            [Line("running", pts("running", since), "green"), Line("waiting", pts("waiting", since), "yellow")],
            now,
            self.span_s,
        )
        chart("c-kv").show([Line("KV", pts("kv", since), "magenta")], now, self.span_s)
        chart("c-tokens").show(
            [Line("out", pts("out", since), "green"), Line("in", pts("in", since), "cyan")], now, self.span_s
        )
        for cid, key in (("c-ttft", "ttft"), ("c-itl", "itl")):
            limit = sla.get(f"{key}_p99")
            chart(cid).show(
                [Line("p99", pts(key, since), "cyan")],
                now,
                self.span_s,
                ("SLA", limit) if limit else None,
                note="" if self.limits else "no SLA set (--sla)",
            )
        gpus = list(self._gpus.gpus) if self._gpus is not None else []
        multi = len({g.hostname for g in gpus}) > 1
        limits = {
            "temp": ("slowdown", gpus[0].slowdown_temp_c) if gpus and gpus[0].slowdown_temp_c else None,
            "power": ("limit", gpus[0].power_limit_w) if gpus and gpus[0].power_limit_w else None,
        }
        for cid, kind in (("c-clock", "clock"), ("c-temp", "temp"), ("c-power", "power")):
            lines = [
                Line(
                    (f"{g.hostname}:" if multi and g.hostname else "") + g.gpu,
                    pts(f"{kind}:{g.key}", since),
                    PALETTE[i % len(PALETTE)],
                )
                for i, g in enumerate(gpus[:8])
            ]
            note = "no GPU source" if not gpus else ""
            chart(cid).show(lines, now, self.span_s, limits.get(kind), note=note)

    def _draw_spec(self) -> None:
        """Speculative decoding, shown only where the server exports its counters."""
        v = self._fleet_view()
        if v is None or v.spec_acceptance is None:
            self.spec.display = False
            return
        self.spec.display = True
        length = f", {v.spec_mean_length:.2f} tokens per draft" if v.spec_mean_length is not None else ""
        self.spec.show_text(
            Text(f"speculative decoding: {v.spec_acceptance:.0%} of draft tokens accepted{length} (window)")
        )

    def ingest_gpus(self, msg: GpusSampled) -> None:
        """Take a GPU tick into the state (history, events, energy) without drawing."""
        self._gpus = msg.tick
        self._groups = msg.groups
        self._gpu_note = msg.note
        for s in msg.tick.statuses:
            self._statuses[s.source] = s
        now = self.clock()
        live = [g for g in msg.tick.gpus if g.source not in msg.tick.stale]
        if live:
            self.energy.add(now, live)
        self.events.extend(self.detector.gpus(msg.tick.gpus, msg.tick.stale, now))
        for g in msg.tick.gpus:
            up = g.source not in msg.tick.stale
            self.series.add(f"clock:{g.key}", now, g.sm_clock_mhz if up else None)
            self.series.add(f"temp:{g.key}", now, g.temp_c if up else None)
            self.series.add(f"power:{g.key}", now, g.power_w if up else None)

    def ingest_status(self, status: SourceStatus) -> None:
        self._statuses[status.source] = status
        self.events.extend(self.detector.status(status, self.clock()))

    def reset_history(self) -> None:
        """Forget charts, events and alerts' history (a replay seeking back)."""
        self.series = SeriesStore()
        self.events.clear()
        self._events_drawn = -1
        self.detector = EventDetector()
        self.energy = EnergyMeter(self.window_s)
        self._server_hist.clear()
        self._waits.clear()
        self._statuses.clear()

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
        tick = self._gpus
        if tick is None:
            return
        draggers = {m.gpu.key for g in self._groups for m in g.draggers}
        with self.app.batch_update():
            self.gpus.show(tick, draggers, self._replicas())
            if self.gpus.display != bool(tick.gpus):
                self.gpus.display = bool(tick.gpus)
                self.gpu_note.display = not tick.gpus
            if not tick.gpus:
                self.gpu_note.show_text(Text(self._gpu_note or "No GPU data yet.", style="dim"))
            sim = any(g.simulated for g in tick.gpus)
            self._title(self.gpu_panel, "GPUs" + (" — SIMULATED" if sim else ""))
            self._draw_roofline()
            self._draw_efficiency()
            self._draw_tp()
            self._draw_status()
            self._draw_verdicts()
            self._draw_events()
            self._draw_charts()

    def _fleet_view(self) -> EngineView | None:
        """All replicas merged, or the one server's view."""
        tick = self._vllm
        if tick is None:
            return None
        return tick.total if tick.total is not None else (tick.servers[0].total if tick.servers else None)

    def _draw_efficiency(self) -> None:
        view = self._fleet_view()
        eff = self.energy.efficiency(view.generation_tokens_rate if view else None, self.gpu_cost_per_hour)
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
        if self._vllm is None:
            return
        names = [g.model for g in self._gpus.gpus] if self._gpus is not None else []
        gpu = gpu_of(names) if names else None
        mixed = len({n for n in names if n}) > 1
        self.roofline.show(self._vllm, gpu, "mixed GPUs" if mixed else "GPU unknown")
        peak = (
            f" vs {gpu.label} peak"
            if gpu
            else (" (mixed GPUs: no single peak)" if mixed else " (GPU unknown: no peak)")
        )
        self._title(self.roofline_panel, f"Roofline per GPU, over {self._vllm_window()}{peak}")

    def _vllm_window(self) -> str:
        tick = self._vllm
        if tick is None or not tick.servers:
            return "n/a"
        w = tick.servers[0].total.window
        return "lifetime" if w == "lifetime" else f"last {w}"

    def _draw_tp(self) -> None:
        alerts = [
            Alert(f"down:{src}", "error", f"{fmt.short_source(src)} is down: {v.reason}")
            for src, v in self.verdicts_now()
            if v.word == "down"
        ]
        alerts += server_alerts(list(self._server_hist))
        if self._vllm is not None:
            tick = self._vllm
            alerts += [
                Alert(f"lag:{lag.source}", "warning", f"replica {lag.source} lags the fleet: {lag.reason}")
                for lag in lagging(tick.servers, tick.stale)
            ]
            alerts += shed_alerts(self._fleet_view())
        if self._gpus is not None:
            alerts += self._held(gpu_alerts(self._gpus.gpus, self._groups))
        self.tp.show(self._groups, alerts, None)

    def _held(self, alerts: list[Alert]) -> list[Alert]:
        """GPU alerts stay up for :data:`THROTTLE_HOLD_S` after their condition last held, marked
        with how long ago, so a GPU hovering at the drag threshold reads as one steady alert
        instead of blinking every few seconds."""
        now = self.clock()
        for a in alerts:
            self._alert_seen[a.key] = (now, a)
        out = list(alerts)
        live = {a.key for a in alerts}
        # a GPU that now drags its group is named by the group's alert: not twice
        dragging = {f"gpu:{m.gpu.key}" for g in self._groups for m in g.draggers}
        for key, (t, a) in list(self._alert_seen.items()):
            if key in live or key in dragging:
                continue
            if now - t >= THROTTLE_HOLD_S:
                del self._alert_seen[key]
            else:
                out.append(Alert(a.key, a.severity, f"{a.text} ({now - t:.0f} s ago)"))
        return out

    def _draw_status(self) -> None:
        self.status.show(list(self._statuses.values()), self.paused, self.background)

    def set_background(self, text: str) -> None:
        """A ramp or study running behind the monitor (empty: none)."""
        self.background = text
        if self.ready:
            self._draw_status()

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        self._draw_status()

    def busy(self) -> str | None:
        """What the first server is already doing, when it serves traffic of its own (None: idle or
        unknown): a ramp started now would be measured on top of it."""
        tick = self._vllm
        if tick is None or not tick.servers or tick.servers[0].source in tick.stale:
            return None
        v = tick.servers[0].total
        running, waiting = v.running or 0, v.waiting or 0
        if running + waiting < 1:
            return None
        return f"{running:.0f} running, {waiting:.0f} waiting"

    def seen(self) -> tuple[tuple[str, ...], dict[str, str], str | None, int | None] | None:
        """What the first server says of itself, for the Capacity screen: its model names, its
        ``cache_config_info``, the first GPU's name and the first TP group's size (None: no server yet)."""
        if self._vllm is None or not self._vllm.servers:
            return None
        server = self._vllm.servers[0]
        gpus = self._gpus.gpus if self._gpus is not None else ()
        label = gpus[0].model if gpus else None
        tp = len(self._groups[0].members) if self._groups else None
        return server.model_names, server.cache_config, label, tp

    def summary(self) -> str:
        """A one-line summary (used by tests and the screenshot script)."""
        if self._vllm is None or not self._vllm.servers:
            return "no data"
        v = self._vllm.servers[0].total
        return f"running {fmt.num(v.running)} waiting {fmt.num(v.waiting)} kv {fmt.pct(v.kv_cache_usage)}"
