"""The monitor's panels. Each takes a frozen snapshot and draws it; none does I/O."""

from __future__ import annotations

import math
import time

from rich.cells import cell_len
from rich.text import Text
from textual.widgets import Static

from spoc_tui.core import fmt
from spoc_tui.core.hardware.gpu import GpuSample, TpGroupReport
from spoc_tui.core.hardware.kernels import CLASSES, IDLE
from spoc_tui.core.hardware.presets import GpuSpec
from spoc_tui.core.hardware.roofline import Roofline, of_view, rates
from spoc_tui.core.metrics.stats import LatencySummary
from spoc_tui.core.metrics.vllm import LATENCY_LABELS, EngineView
from spoc_tui.core.monitor.alerts import Alert
from spoc_tui.core.monitor.events import THROTTLE_HOLD_S
from spoc_tui.core.monitor.fleet import lagging
from spoc_tui.core.monitor.snapshots import GpuTick, SourceStatus, VllmTick
from spoc_tui.core.ramp.sla import Limit
from spoc_tui.profile.analyze import Breakdown
from spoc_tui.tui.textual_mode import LeanRefresh
from spoc_tui.tui.widgets.tables import Cell, DiffTable, Styled


class ServerTable(DiffTable):
    """The fleet total on top (several replicas), then one row per server, one per engine when a
    server has several; a replica that lags the fleet is marked ▲ (see :mod:`spoc_tui.core.monitor.fleet`)."""

    COLUMNS = [
        # what tells replicas apart first (at 80 columns the last ones are off-screen)
        ("src", "Server / engine", 18),
        ("run", "Run", 4),
        ("wait", "Wait", 5),
        ("kv", "KV", 6),
        ("ttft", "TTFT p99", 8),
        ("out", "Out t/s", 7),
        ("pre", "Preempt", 9),
        ("hit", "Prefix", 6),
        ("in", "In t/s", 7),
        ("shed", "Shed/s", 6),
    ]

    @staticmethod
    def _cells(label: str, v: EngineView, stale: bool, label_style: str = "", lagging: bool = False) -> list[Cell]:
        style = "dim" if stale else ""
        ttft_style = "bold yellow" if lagging else style
        kv_style = "bold red" if (v.kv_cache_usage or 0) >= 0.9 else style
        wait_style = "bold yellow" if (v.waiting or 0) > 0 else style
        pre = fmt.count(v.preemptions_total)
        if v.preemptions_rate:
            r = v.preemptions_rate
            pre += f" +{r:.0f}/s" if r >= 9.5 else f" +{r:.1f}/s"
        shed = v.shed_rate
        return [
            Styled(label, label_style or style),
            Styled(fmt.num(v.running), style),
            Styled(fmt.num(v.waiting), wait_style),
            Styled(fmt.pct(v.kv_cache_usage, digits=1), kv_style),
            Styled(fmt.seconds(v.latency["ttft"].p99), ttft_style),
            Styled(fmt.rate(v.generation_tokens_rate, ""), style),
            Styled(pre, "bold red" if v.preemptions_rate else style),
            Styled(fmt.pct(v.prefix_cache_hit_rate), style),
            Styled(fmt.rate(v.prompt_tokens_rate, ""), style),
            Styled("n/a" if shed is None else f"{shed:.2g}", "bold red" if shed else style),
        ]

    def show(self, tick: VllmTick) -> None:
        rows: dict[str, list[Cell]] = {}
        lags = {lag.source for lag in lagging(tick.servers, tick.stale)}
        if tick.total is not None:
            rows["__all__"] = self._cells(f"fleet of {len(tick.servers)}", tick.total, False, "bold")
        for s in tick.servers:
            stale = s.source in tick.stale
            mark = "✖ " if stale else ("▲ " if s.source in lags else "")
            label = mark + fmt.short_source(s.source)
            lag = s.source in lags
            rows[s.source] = self._cells(label, s.total, stale, "bold yellow" if lag else "", lagging=lag)
            if len(s.engines) > 1:
                for e in s.engines:
                    rows[f"{s.source}#{e.engine}"] = self._cells(f"  engine {e.engine}", e, stale)
        self.sync(rows)


_READING_STYLE = {
    "memory-bound": "bold cyan",
    "compute-bound": "bold green",
    "overhead-bound": "bold yellow",
    "idle": "dim",
    "n/a": "dim",
}


class RooflineTable(DiffTable):
    """Per server (and engine): achieved FLOP/s and memory traffic per GPU from vLLM's estimates,
    their share of the GPU's peak, tokens per engine step and the one-word reading."""

    COLUMNS = [
        ("src", "Server / engine", 16),
        ("flops", "FLOP/s (peak)", 17),
        ("bw", "Mem B/s (peak)", 15),
        ("ai", "FLOP/B", 6),
        ("tps", "tok/step", 8),
        ("read", "Reading", 14),
        ("why", "Why", 58),
    ]

    @staticmethod
    def _cells(label: str, r: Roofline, stale: bool) -> list[Cell]:
        style = "dim" if stale else ""
        f, b = rates(r, " {:.0%}")
        ai = r.intensity
        return [
            Styled(label, style),
            Styled(f, style),
            Styled(b, style),
            Styled("n/a" if ai is None else f"{ai:.3g}", style),
            Styled("n/a" if r.tokens_per_step is None else f"{r.tokens_per_step:.1f}", style),
            Styled(r.reading, "dim" if stale else _READING_STYLE.get(r.reading, "")),
            Styled(r.why, "dim"),
        ]

    def show(self, tick: VllmTick, gpu: GpuSpec | None, no_gpu: str = "GPU unknown") -> None:
        rows: dict[str, list[Cell]] = {}
        for s in tick.servers:
            stale = s.source in tick.stale
            rows[s.source] = self._cells(fmt.short_source(s.source), of_view(s.total, gpu, no_gpu), stale)
            if len(s.engines) > 1:
                for e in s.engines:
                    r = of_view(e, gpu, no_gpu)
                    rows[f"{s.source}#{e.engine}"] = self._cells(f"  engine {e.engine}", r, stale)
        self.sync(rows)


class LatencyTable(DiffTable):
    """TTFT/ITL/TPOT/E2E/queue percentiles over the stated window, with a p99 trend."""

    COLUMNS = [
        ("m", "Metric", 6),
        ("p50", "p50", 7),
        ("p90", "p90", 7),
        ("p99", "p99", 7),
        ("mean", "mean", 7),
        ("n", "count", 6),
    ]

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.window = "n/a"
        self.limits: tuple[Limit, ...] = ()
        """The SLA: a cell it judges turns red past its limit, green within it."""

    def show(self, view: EngineView, stale: bool = False) -> None:
        self.window = view.window
        rows: dict[str, list[Cell]] = {}
        style = "dim" if stale else ""
        for key, label in LATENCY_LABELS.items():
            L = view.latency[key]
            judged = {lim.stat: lim for lim in self.limits if lim.metric == key}
            rows[key] = [
                Styled(label, "bold " + style),
                _percentile(L, "p50", style, judged.get("p50")),
                _percentile(L, "p90", style, judged.get("p90")),
                _percentile(L, "p99", "bold " + style, judged.get("p99")),
                _judged(Text(fmt.seconds(L.mean), style=style), L.mean, judged.get("mean"), stale),
                Styled(fmt.count(L.count), style),
            ]
        self.sync(rows)


def _judged(cell: Text, value: float | None, limit: Limit | None, stale: bool) -> Text:
    if limit is None or value is None or stale:
        return cell
    cell.stylize("bold red" if value > limit.value else "green")
    return cell


def _percentile(L: LatencySummary, name: str, style: str, limit: Limit | None = None) -> Text:
    """A percentile cell: ``≤`` when it is the mean's bound, dim italic when the window holds too
    few observations for it (and then not judged against the SLA)."""
    value: float | None = getattr(L, name)
    few = value is not None and L.few(name)
    cell = Text(fmt.seconds(value, L.is_bound(name)), style=f"{style} dim italic" if few else style)
    return cell if few else _judged(cell, value, limit, "dim" in style)


def _reason_text(g: GpuSample) -> Styled:
    names = g.throttle_reasons
    if names is None:
        if g.throttled_pct:
            top = max(g.throttled_pct.items(), key=lambda kv: kv[1])
            if top[1] >= 1:
                return Styled(f"{top[0]} {top[1]:.0f}%", "bold red")
        return Styled(fmt.NA, "dim")
    windowed = ""
    if g.throttled_pct:
        top = max(g.throttled_pct.items(), key=lambda kv: kv[1])
        if top[1] >= 5:
            windowed = f"{top[0]} {top[1]:.0f}% of win"
    if not names:
        if windowed:
            return Styled(windowed, "yellow")
        idle = g.reasons_mask is not None and g.reasons_mask & 0x1
        return Styled("idle" if idle else "none", "green")
    kind = g.throttle_kind()
    pct = ""
    if g.throttled_pct and kind in g.throttled_pct:
        pct = f" {g.throttled_pct[kind]:.0f}%"
    return Styled(",".join(names) + pct, "bold red" if kind == "thermal" else "bold yellow")


def _short_model(model: str | None) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``H100 80GB HBM3``."""
    return (model or "?").removeprefix("NVIDIA ").strip()


class GpuTable(DiffTable):
    COLUMNS = [
        ("gpu", "GPU", 7),
        ("rep", "Replica", 0),
        ("model", "Model", 0),
        ("t", "Temp", 4),
        ("mt", "Mem", 4),
        ("sm", "SM MHz", 9),
        ("p", "Power W", 8),
        ("u", "Util", 4),
        ("fb", "FB GiB", 6),
        ("thr", "Throttle", 18),
    ]

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._throttled: dict[str, tuple[float, Styled]] = {}
        """Each GPU's last throttle reason and when it was seen: a GPU whose reason comes and goes
        from one sample to the next keeps it shown (dimmed) for THROTTLE_HOLD_S, not blinking."""

    def _held_reason(self, g: GpuSample, now: float) -> Styled:
        cell = _reason_text(g)
        if g.throttle_reasons:
            self._throttled[g.key] = (now, cell)
            return cell
        seen = self._throttled.get(g.key)
        if seen is not None and now - seen[0] < THROTTLE_HOLD_S:
            return Styled(seen[1].plain, "dim yellow")
        self._throttled.pop(g.key, None)
        return cell

    def show(self, tick: GpuTick, draggers: set[str], replicas: dict[str, str] | None = None) -> None:
        """``replicas``: GPU key -> the replica it serves (several servers; a column appears)."""
        rows: dict[str, list[Cell]] = {}
        replicas = replicas or {}
        now = time.monotonic()
        multi_host = len({g.hostname for g in tick.gpus}) > 1
        # several hosts: the GPU names its host in full; mixed models: a column says which is which
        width = max((len(f"{g.hostname}:{g.gpu} sim") for g in tick.gpus if g.hostname), default=7)
        width = width if multi_host else 7
        mixed = len({g.model for g in tick.gpus}) > 1
        rep_w = max((len(fmt.short_source(r)) for r in replicas.values()), default=0)
        self.set_widths(
            {
                "gpu": min(width + 2, 28) if multi_host else 7,
                "model": 14 if mixed else 0,
                "rep": min(rep_w, 22) if replicas else 0,
            }
        )
        for g in tick.gpus:
            stale = g.source in tick.stale
            style = "dim" if stale else ""
            name = f"{g.hostname}:{g.gpu}" if multi_host and g.hostname else g.gpu
            if g.simulated:
                name += " sim"
            temp_style = style
            if g.temp_c is not None and g.slowdown_temp_c is not None and g.temp_c >= g.slowdown_temp_c - 5:
                temp_style = "bold red"
            sm = fmt.plain(g.sm_clock_mhz) + ("/" + fmt.plain(g.sm_clock_max_mhz) if g.sm_clock_max_mhz else "")
            pw = fmt.plain(g.power_w) + ("/" + fmt.plain(g.power_limit_w) if g.power_limit_w else "")
            fb = fmt.num(None if g.fb_used_mib is None else g.fb_used_mib / 1024, 1)
            rows[g.key] = [
                Styled(("▶ " if g.key in draggers else "") + name, "bold red" if g.key in draggers else style),
                Styled(fmt.short_source(replicas[g.key]) if g.key in replicas else "?", style or "cyan"),
                Styled(_short_model(g.model), style),
                Styled(fmt.plain(g.temp_c, "C"), temp_style),
                Styled(fmt.plain(g.mem_temp_c, "C"), style),
                Styled(sm, "bold red" if g.key in draggers else style),
                Styled(pw, style),
                Styled(fmt.pct(g.util_pct, fraction=False), style),
                Styled(fb, style),
                self._held_reason(g, now),
            ]
        self.sync(rows)


class ChangedStatic(LeanRefresh, Static):
    """A Static that skips the update when the text is unchanged, and the re-layout of the whole
    screen when its height is (a figure changing every second is a repaint of these lines, not a
    reflow of every panel: that reflow was most of the monitor's CPU)."""

    # Textual finds a widget's default CSS along its first base only (LeanRefresh), so Static's
    # ``height: auto`` never reached this class: a line without its own rule in app.tcss (the
    # headroom's) was laid out below its panel's edge and never painted
    DEFAULT_CSS = "ChangedStatic { height: auto; }"

    _last: tuple[object, ...] | None = None
    _rows: int | None = None

    def show_text(self, t: Text) -> None:
        sig = (t.plain, tuple(t.spans))
        if sig == self._last:
            return
        self._last = sig
        width = self.content_size.width
        rows = sum(max(1, -(-cell_len(line) // width)) for line in t.plain.split("\n")) if width > 0 else None
        layout = rows is None or rows != self._rows
        self._rows = rows
        self.update(t, layout=layout)

    def on_resize(self) -> None:
        self._rows = None  # wraps differently: the next text lays out again


class TpPanel(ChangedStatic):
    """TP groups compared with their median GPU, and the active alerts."""

    def show(self, groups: tuple[TpGroupReport, ...], alerts: list[Alert], note: str | None) -> None:
        t = Text()
        if note:
            t.append(note + "\n", style="dim")
        if not groups:
            t.append("TP groups: none (give --tp-groups 0-3,4-7 or run beside vLLM with NVML)\n", style="dim")
        held = {a.key for a in alerts}
        for rep in groups:
            med = fmt.num(rep.median_clock_mhz)
            pct = rep.slowdown_pct
            # under half a per cent is no slowdown, not "-0 %"
            slow = fmt.NA if pct is None else ("none" if pct < 0.5 else f"-{pct:.0f}%")
            t.append(
                f"TP {rep.name}: median SM {med} MHz, median {fmt.num(rep.median_temp_c, unit='C')}, slowest "
                f"GPU {slow}  "
            )
            if rep.draggers:
                t.append("DRAGGED\n", style="bold red")
            elif f"tp:{rep.name}" in held:  # the drag ended moments ago: its alert is still held below
                t.append("recovered (alert held)\n", style="yellow")
            else:
                t.append("ok\n", style="green")
        for a in alerts:
            t.append(
                "▲ " if a.severity == "error" else "△ ", style="bold red" if a.severity == "error" else "bold yellow"
            )
            t.append(a.text + "\n", style="red" if a.severity == "error" else "yellow")
        if not alerts:
            t.append("no alerts", style="green")
        self.show_text(t)


class StatusLine(ChangedStatic):
    """One entry per source: up, stale since, error and retry."""

    def show(self, statuses: list[SourceStatus], paused: bool, background: str, now: float) -> None:
        """``now``: the monitor's wall clock (a replay's, or a test's pinned one), for "stale N s"
        and "retry N s"."""
        t = Text()
        if paused:
            t.append(" PAUSED ", style="bold black on yellow")
            t.append(" ")
        if background:
            t.append(f" {background} ", style="bold black on cyan")
            t.append(" ")
        for i, s in enumerate(statuses):
            if i:
                t.append("  ")
            name = fmt.short_source(s.source)
            if s.up:
                t.append("● ", style="green")
                t.append(name)
            else:
                t.append("✖ ", style="bold red")
                since = f" stale {now - s.last_ok:.0f}s" if s.last_ok else ""
                left = s.retry_left(now)
                retry = f", retry {math.ceil(left)}s" if left else ""
                reason = (s.reason or "down").removeprefix(s.source + ": ")
                t.append(f"{name}{since}: {reason}{retry}", style="red")
        self.show_text(t)


_CLASS_STYLE = {
    "GEMM": "green",
    "attention": "cyan",
    "KV-cache write": "magenta",
    "communication": "red",
    "sampling & logits": "yellow",
    "norms/activations/elementwise": "blue",
    "memory copies": "bright_black",
    "other": "white",
    "idle": "dim",
}


def profile_text(b: Breakdown, width: int = 30) -> Text:
    """A profile's class shares as bars, its step kinds, and the decode step against the roofline."""
    t = Text()
    t.append(f"{b.timeline}: {', '.join(b.lanes)} · {b.events:,} events · span {b.span_s:.2f} s\n", style="dim")
    shares = b.shares
    for cls in (*CLASSES, IDLE):
        share = shares.get(cls, 0.0)
        t.append(f"{cls:<30}", style="bold" if share >= 0.2 else "")
        t.append(f"{share:>6.1%} ")
        t.append("█" * round(share * width), style=_CLASS_STYLE.get(cls, ""))
        t.append("\n")
    for p in b.phases:
        top = sorted(((v, k) for k, v in p.shares.items() if k != IDLE), reverse=True)[:2]
        lead = ", ".join(f"{k} {v:.0%}" for v, k in top)
        t.append(
            f"{p.kind}: {p.steps:,} steps, {p.mean_step_s * 1e3:.2f} ms mean, {p.tokens_per_step:.1f} tok/step; "
            f"{lead}, idle {p.shares[IDLE]:.0%}\n"
        )
    measured = b.decode_step_s
    if b.roofline_step_s is not None and measured is not None:
        t.append(
            f"decode step {measured * 1e3:.2f} ms = {measured / b.roofline_step_s:.2f}x the roofline "
            f"{b.roofline_step_s * 1e3:.2f} ms ({b.roofline_basis})",
            style="bold",
        )
    elif b.roofline_step_s is not None:
        t.append(f"decode roofline {b.roofline_step_s * 1e3:.2f} ms; no decode-only step profiled", style="dim")
    else:
        m = f"decode step {measured * 1e3:.2f} ms; " if measured is not None else ""
        t.append(m + "roofline n/a (model or GPU not among the presets)", style="dim")
    for n in b.notes:
        t.append(f"\nnote: {n}", style="dim")
    return t
