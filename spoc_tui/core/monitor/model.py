"""The monitor's model, without a terminal: it takes the collectors' ticks and keeps what the
screen draws (the latest ticks, chart history, events, energy, each server's verdict and the
held alerts), computing the verdicts and alerts once per tick. The Monitor screen and a
replay feed it the same ticks; the screen only draws what it holds.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from spoc_tui.core.fmt import short_source, sparkline
from spoc_tui.core.hardware.gpu import GpuSample, TpGroupReport
from spoc_tui.core.metrics.vllm import EngineView, ServerView
from spoc_tui.core.monitor.alerts import Alert, gpu_alerts, server_alerts, shed_alerts
from spoc_tui.core.monitor.energy import EnergyMeter
from spoc_tui.core.monitor.events import THROTTLE_HOLD_S, EventDetector, EventLog
from spoc_tui.core.monitor.fleet import lagging, replica_of_gpu
from spoc_tui.core.monitor.series import SeriesStore
from spoc_tui.core.monitor.snapshots import GpuTick, SourceStatus, VllmTick
from spoc_tui.core.monitor.verdict import GROWING_POLLS, Verdict, VerdictTracker, verdict
from spoc_tui.core.ramp.sla import Limit

WAIT_HISTORY = 5
"""Polls of each server's queue a verdict looks back over (queue-bound: waiting in each)."""
HEADROOM_HISTORY = 48
"""Estimates of each server's headroom its history line shows (at one every 4 minutes or more: 3 hours
or more)."""
HEADROOM_ALERT = 1.2
"""A server whose headroom is under this many times its recent traffic is alerted on."""


@dataclass(frozen=True, slots=True)
class HeadroomShown:
    """A server's live headroom as the monitor shows it (:class:`spoc_tui.twin.headroom.Headroom`
    made into what the screen and the alerts need)."""

    line: str
    estimate: float | None
    identified: bool
    ledger: str = ""
    """How the twin's predictions of the minutes since held (``predictions held 27 of 30 windows
    over 2 h``), shown under the line; empty where no ledger is kept."""
    fresh: bool = True
    """A new estimate (False: the same one, its ledger graded again): its time is the estimate's age."""


class MonitorModel:
    """What the monitor knows, fed tick by tick (:meth:`servers`, :meth:`gpus`, :meth:`status`)."""

    def __init__(
        self,
        window_s: float,
        limits: tuple[Limit, ...] = (),
        events: EventLog | None = None,
        vllm_urls: Sequence[str] = (),
        dcgm_sources: Sequence[str] = (),
        clock: Callable[[], float] = time.time,
        headroom_alert: float = HEADROOM_ALERT,
    ) -> None:
        self.window_s = window_s
        self.headroom_alert = headroom_alert
        self.limits = limits
        self.events = events if events is not None else EventLog()
        self.vllm_urls = tuple(vllm_urls)
        """The servers asked for (a source that never answered is still one)."""
        self.dcgm_sources = tuple(dcgm_sources)
        """The dcgm-exporters as shown (passwords redacted): which replica each GPU serves."""
        self.clock = clock
        self.vllm: VllmTick | None = None
        self.gpu_tick: GpuTick | None = None
        self.groups: tuple[TpGroupReport, ...] = ()
        self.gpu_note: str | None = None
        self.models: dict[str, dict[str, int | None]] = {}
        self.headroom: dict[str, HeadroomShown] = {}
        """Each server's latest live headroom (empty until the first estimate)."""
        self.reset()

    def reset(self) -> None:
        """Forget history, events and alerts (a replay seeking back)."""
        self.series = SeriesStore()
        self.events.clear()
        self.detector = EventDetector()
        self.energy = EnergyMeter(self.window_s)
        self.server_hist: deque[tuple[float | None, float | None, float | None]] = deque(maxlen=30)
        self.headroom_history: dict[str, deque[tuple[float, float | None]]] = {}
        """Each server's estimates as they came (time, estimate; None where it could not say)."""
        self.waits: dict[str, deque[float | None]] = {}
        self.queues: dict[str, deque[float | None]] = {}
        """Each server's recent queue readings (the ladder's "queue keeps growing")."""
        self.tracker = VerdictTracker()
        self.statuses: dict[str, SourceStatus] = {}
        self._alert_seen: dict[str, tuple[float, Alert]] = {}
        self.verdicts: tuple[tuple[str, Verdict], ...] = ()
        self.alerts: tuple[Alert, ...] = ()
        self.headroom = {}

    # -- feeding --------------------------------------------------------------------------
    def servers(self, tick: VllmTick) -> None:
        """A server tick: history, events, then the verdicts and alerts."""
        self.vllm = tick
        for s in tick.statuses:
            self.statuses[s.source] = s
        now = self.clock()
        self.events.extend(self.detector.servers(tick, now))
        view = self.live_view
        add = self.series.add
        add("running", now, view.running if view else None)
        add("waiting", now, view.waiting if view else None)
        add("kv", now, None if view is None or view.kv_cache_usage is None else view.kv_cache_usage * 100)
        add("out", now, view.generation_tokens_rate if view else None)
        add("in", now, view.prompt_tokens_rate if view else None)
        add("ttft", now, view.latency["ttft"].p99 if view else None)
        add("itl", now, view.latency["itl"].p99 if view else None)
        for server in tick.servers:
            w = self.waits.setdefault(server.source, deque(maxlen=WAIT_HISTORY))
            w.append(None if server.source in tick.stale else server.total.waiting)
            q = self.queues.setdefault(server.source, deque(maxlen=GROWING_POLLS + 1))
            q.append(None if server.source in tick.stale else server.total.waiting)
        if view is not None:
            self.server_hist.append((view.waiting, view.kv_cache_usage, view.preemptions_total))
        self._judge(poll=True)

    def gpus(self, tick: GpuTick, groups: tuple[TpGroupReport, ...], note: str | None) -> None:
        """A GPU tick: energy, events and chart history, then the verdicts and alerts."""
        self.gpu_tick = tick
        self.groups = groups
        self.gpu_note = note
        for s in tick.statuses:
            self.statuses[s.source] = s
        now = self.clock()
        live = [g for g in tick.gpus if g.source not in tick.stale]
        if live:
            self.energy.add(now, live)
        self.events.extend(self.detector.gpus(tick.gpus, tick.stale, now))
        for g in tick.gpus:
            up = g.source not in tick.stale
            self.series.add(f"clock:{g.key}", now, g.sm_clock_mhz if up else None)
            self.series.add(f"temp:{g.key}", now, g.temp_c if up else None)
            self.series.add(f"power:{g.key}", now, g.power_w if up else None)
        self._judge()

    def status(self, status: SourceStatus) -> None:
        """A source went down or came back."""
        self.statuses[status.source] = status
        self.events.extend(self.detector.status(status, self.clock()))
        self._judge()

    def set_headroom(self, results: Mapping[str, HeadroomShown]) -> None:
        """Each server's headroom as just worked out (in a worker thread): shown, and alerted on
        when it is under :attr:`headroom_alert`."""
        self.headroom = dict(results)
        now = self.clock()
        for src, h in results.items():
            if src and h.fresh:  # "" is a failure said for every server, not a server's estimate
                hist = self.headroom_history.setdefault(src, deque(maxlen=HEADROOM_HISTORY))
                hist.append((now, h.estimate if h.identified else None))
        self._judge()

    def headroom_trend(self, src: str) -> str | None:
        """``history x5.9 ▅▆▇█ x6.4 over 40 min``: a server's estimates so far, oldest first, once
        there are two (``·`` where one could not say); None before."""
        hist = self.headroom_history.get(src)
        if not hist or len(hist) < 2:
            return None
        values = [v for _, v in hist]
        known = [v for v in values if v is not None]
        if not known:
            return None
        first = next(v for v in values if v is not None)
        last = next(v for v in reversed(values) if v is not None)
        mins = (hist[-1][0] - hist[0][0]) / 60
        spark = sparkline(values, low=0.8 * min(known))
        return f"history x{first:.2g} {spark} x{last:.2g} over {mins:.0f} min"

    def headroom_age(self, src: str) -> str | None:
        """``worked out 3 min ago``: how old a server's latest estimate is (an operator in an
        incident must not take an hour-old figure for today's); None before the first."""
        hist = self.headroom_history.get(src)
        if not hist:
            return None
        mins = max(0.0, self.clock() - hist[-1][0]) / 60
        return "worked out just now" if mins < 1 else f"worked out {mins:.0f} min ago"

    def fleet_headroom(self) -> str | None:
        """With more than one server: the fleet's headroom, that of its weakest replica (traffic
        split evenly, the first replica to break the SLA is where the fleet does), or why there
        is none yet; None with one server."""
        if len(self.headroom) < 2:
            return None
        known = {src: h.estimate for src, h in self.headroom.items() if h.identified and h.estimate is not None}
        if len(known) < len(self.headroom):
            missing = len(self.headroom) - len(known)
            return f"fleet: no headroom yet ({missing} of {len(self.headroom)} replicas not identified)"
        weakest = min(known, key=lambda src: known[src])
        return (
            f"fleet: headroom x{known[weakest]:.2g}, its weakest replica's ({short_source(weakest)}), "
            "with the traffic split evenly"
        )

    def set_models(self, source: str, models: dict[str, int | None]) -> None:
        """What /v1/models says of a server (max-model-len per model)."""
        self.models[source] = models

    # -- views ----------------------------------------------------------------------------
    @property
    def fleet_view(self) -> EngineView | None:
        """All replicas merged, or the one server's view."""
        tick = self.vllm
        if tick is None:
            return None
        return tick.total if tick.total is not None else (tick.servers[0].total if tick.servers else None)

    @property
    def live_view(self) -> EngineView | None:
        """The fleet's view (or the one server's), None while its source is stale."""
        tick = self.vllm
        if tick is None or (tick.total is None and tick.servers and tick.servers[0].source in tick.stale):
            return None
        return self.fleet_view

    @property
    def gpu_samples(self) -> tuple[GpuSample, ...]:
        return self.gpu_tick.gpus if self.gpu_tick is not None else ()

    def replicas(self) -> dict[str, str]:
        """GPU key -> the replica it serves, with several servers (see :func:`replica_of_gpu`)."""
        if self.vllm is None or len(self.vllm.servers) <= 1 or self.gpu_tick is None:
            return {}
        servers = [s.source for s in self.vllm.servers]
        out = {}
        for g in self.gpu_tick.gpus:
            r = replica_of_gpu(g.source, g.hostname, servers, list(self.dcgm_sources))
            if r is not None:
                out[g.key] = r
        return out

    def server_gpus(self, server: ServerView) -> list[GpuSample]:
        """The GPUs that serve ``server``: all of them with one server, else those mapped to it."""
        gpus = list(self.gpu_samples)
        if self.vllm is None or len(self.vllm.servers) <= 1:
            return gpus
        mapping = self.replicas()
        return [g for g in gpus if mapping.get(g.key) == server.source]

    def is_server(self, source: str) -> bool:
        return any(source == u or source.startswith(u.rstrip("/")) for u in self.vllm_urls)

    def busy(self) -> str | None:
        """What the first server is already doing, when it serves traffic of its own (None: idle or
        unknown): a ramp started now would be measured on top of it."""
        tick = self.vllm
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
        if self.vllm is None or not self.vllm.servers:
            return None
        server = self.vllm.servers[0]
        gpus = self.gpu_samples
        label = gpus[0].model if gpus else None
        tp = len(self.groups[0].members) if self.groups else None
        return server.model_names, server.cache_config, label, tp

    # -- judging, once per tick -------------------------------------------------------------
    def _judge(self, poll: bool = False) -> None:
        """``poll``: a server tick (the verdicts' hysteresis counts those, not GPU ticks)."""
        now = self.clock()
        raw = self._verdicts()
        self.verdicts = tuple((src, self.tracker.update(src, v, now, count=poll)) for src, v in raw)
        self.tracker.forget({src for src, _ in raw})
        self.alerts = tuple(self._alerts())

    def _verdicts(self) -> list[tuple[str, Verdict]]:
        """One verdict per server: those that answered, then those that never did."""
        out: list[tuple[str, Verdict]] = []
        tick = self.vllm
        known: set[str] = set()
        throttling = self.detector.throttling()
        lags = {lag.source: lag.reason for lag in lagging(tick.servers, tick.stale)} if tick is not None else {}
        for server in tick.servers if tick is not None else ():
            known.add(server.source)
            st = self.statuses.get(server.source)
            down = None
            if tick is not None and server.source in tick.stale:
                down = (st.reason if st and st.reason else "no answer") + (
                    f"; figures from {self.clock() - st.last_ok:.0f} s ago" if st and st.last_ok else ""
                )
            hot = [
                f"GPU {g.gpu} {g.throttle_kind() or 'throttled'}"
                for g in self.server_gpus(server)
                if g.key in throttling
            ]
            waits = [w for w in self.waits.get(server.source, ()) if w is not None]
            mine = {g.key for g in self.server_gpus(server)}
            drags = [
                f"GPU {m.gpu.gpu} holds TP group {rep.name} back ({m.reason})"
                for rep in self.groups
                for m in rep.draggers
                if m.gpu.key in mine
            ]
            v = verdict(
                server.total,
                down=down,
                throttled=hot,
                limits=self.limits,
                waiting=min(waits, default=None),
                queue=tuple(self.queues.get(server.source, ())),
                straggler="; ".join(drags) or None,
                lagging=lags.get(server.source),
            )
            out.append((server.source, v))
        for src, st in self.statuses.items():
            if not st.up and src not in known and self.is_server(src):
                out.append((src, Verdict("down", "error", (st.reason or "no answer") + "; never answered")))
        return out

    def _alerts(self) -> list[Alert]:
        alerts = [
            Alert(f"down:{src}", "error", f"{short_source(src)} is down: {v.reason}")
            for src, v in self.verdicts
            if v.word == "down"
        ]
        alerts += server_alerts(list(self.server_hist))
        if self.vllm is not None:
            tick = self.vllm
            alerts += [
                Alert(f"lag:{lag.source}", "warning", f"replica {lag.source} lags the fleet: {lag.reason}")
                for lag in lagging(tick.servers, tick.stale)
            ]
            alerts += shed_alerts(self.fleet_view)
        if self.gpu_tick is not None:
            alerts += self._held(gpu_alerts(self.gpu_tick.gpus, self.groups))
        for src, h in self.headroom.items():
            if h.identified and h.estimate is not None and h.estimate < self.headroom_alert:
                alerts.append(
                    Alert(
                        f"headroom:{src}",
                        "warning",
                        f"{short_source(src)} has little headroom: x{h.estimate:.2g} of its recent traffic "
                        f"(under x{self.headroom_alert:g})",
                    )
                )
        return alerts

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
        dragging = {f"gpu:{m.gpu.key}" for g in self.groups for m in g.draggers}
        for key, (t, a) in list(self._alert_seen.items()):
            if key in live or key in dragging:
                continue
            if now - t >= THROTTLE_HOLD_S:
                del self._alert_seen[key]
            else:
                out.append(Alert(a.key, a.severity, f"{a.text} ({now - t:.0f} s ago)"))
        return out
