"""The Monitor screen: servers, latency, GPUs, TP groups and alerts, source status."""

from __future__ import annotations

import time
from collections import deque

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

from spoc_tui.core import fmt
from spoc_tui.core.alerts import Alert, gpu_alerts, server_alerts, shed_alerts
from spoc_tui.core.energy import EnergyMeter
from spoc_tui.core.fleet import lagging, waiting_per_replica
from spoc_tui.core.gpu import TpGroupReport
from spoc_tui.core.roofline import gpu_of
from spoc_tui.core.snapshots import GpuTick, SourceStatus, VllmTick
from spoc_tui.core.vllm import EngineView
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


class MonitorScreen(Screen[None]):
    """Live view. Handlers apply whole ticks; widgets never fetch anything."""

    BINDINGS = [
        ("p", "app.toggle_pause", "Pause"),
        ("l", "app.load", "Load ramp"),
        ("c", "app.capacity", "Capacity"),
        ("t", "app.tune", "Tune"),
        ("question_mark", "app.push_screen('help')", "Help"),
        ("f8", "app.screenshot", "Screenshot"),
        ("q", "app.quit", "Quit"),
    ]

    def __init__(self, title: str, window_s: float, gpu_cost_per_hour: float | None = None) -> None:
        super().__init__()
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
                yield ServerTable(id="servers")
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
        # "stale N s" and "retry in N s" count every second, not only when a tick arrives
        self.set_interval(1.0, self._draw_status)

    # -- message handlers ---------------------------------------------------------------
    def apply_servers(self, msg: ServersSampled) -> None:
        if not self.ready or not self.is_attached:
            return
        tick = msg.tick
        self._vllm = tick
        for s in tick.statuses:
            self._statuses[s.source] = s
        with self.app.batch_update():
            self.servers.show(tick)
            view = tick.total if tick.total is not None else (tick.servers[0].total if tick.servers else None)
            if view is not None:
                stale = tick.total is None and bool(tick.servers) and tick.servers[0].source in tick.stale
                self.latency.show(view, stale)
                win = "lifetime" if view.window == "lifetime" else f"last {view.window} (window {self.window_s:g}s)"
                self._title(self.latency_panel, f"Latency over {win}")
                if not stale:
                    self._server_hist.append((view.waiting, view.kv_cache_usage, view.preemptions_total))
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

    def apply_gpus(self, msg: GpusSampled) -> None:
        if not self.ready or not self.is_attached:
            return
        self._gpus = msg.tick
        self._groups = msg.groups
        self._gpu_note = msg.note
        for s in msg.tick.statuses:
            self._statuses[s.source] = s
        draggers = {m.gpu.key for g in msg.groups for m in g.draggers}
        live = [g for g in msg.tick.gpus if g.source not in msg.tick.stale]
        if live:
            self.energy.add(time.monotonic(), live)
        with self.app.batch_update():
            self.gpus.show(msg.tick, draggers)
            if self.gpus.display != bool(msg.tick.gpus):
                self.gpus.display = bool(msg.tick.gpus)
                self.gpu_note.display = not msg.tick.gpus
            if not msg.tick.gpus:
                self.gpu_note.show_text(Text(msg.note or "No GPU data yet.", style="dim"))
            sim = any(g.simulated for g in msg.tick.gpus)
            self._title(self.gpu_panel, "GPUs" + (" — SIMULATED" if sim else ""))
            self._draw_roofline()
            self._draw_efficiency()
            self._draw_tp()
            self._draw_status()

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
        self._statuses[status.source] = status
        if not self.ready or not self.is_attached:
            return
        self._draw_status()

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
        alerts = server_alerts(list(self._server_hist))
        if self._vllm is not None:
            tick = self._vllm
            alerts += [
                Alert(f"lag:{lag.source}", "warning", f"replica {lag.source} lags the fleet: {lag.reason}")
                for lag in lagging(tick.servers, tick.stale)
            ]
            alerts += shed_alerts(self._fleet_view())
        if self._gpus is not None:
            alerts += gpu_alerts(self._gpus.gpus, self._groups)
        self.tp.show(self._groups, alerts, None)

    def _draw_status(self) -> None:
        self.status.show(list(self._statuses.values()), self.paused)

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        self._draw_status()

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
