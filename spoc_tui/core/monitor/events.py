"""The monitor's event log: what changed and when, so a flapping condition leaves a record.

:class:`EventDetector` compares each tick with the one before and says what started or ended:

- a source going down or coming back (from the pollers' status changes);
- a server restart: a lifetime counter (prompt or generated tokens) went backwards;
- a preemption burst: the preemption counter grew after at least ``QUIET_S`` without growth
  (one event per burst, its size told when the burst ends);
- the KV cache filling: usage reached ``KV_ENTER`` (ends when it falls below ``KV_LEAVE``);
- a GPU throttling for a reason other than idling (thermal, power, other): starts at the first
  sample that throttles, ends once ``THROTTLE_HOLD_S`` passed without throttling, so a clock
  that flickers in and out of a cap reads as one episode with its length;
- milestones the app adds itself (a ramp or study started, a step, a knee, the end).

Pure: times are given by the caller (wall-clock seconds), nothing is read here.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from spoc_tui.core.fmt import short_source
from spoc_tui.core.hardware.gpu import GpuSample
from spoc_tui.core.monitor.snapshots import SourceStatus, VllmTick

KV_ENTER = 0.90
KV_LEAVE = 0.80
QUIET_S = 30.0
"""A preemption burst ends after this long without a new preemption."""
THROTTLE_HOLD_S = 10.0
"""A throttle episode ends after this long without throttling."""


@dataclass(frozen=True, slots=True)
class Event:
    t: float
    """Wall-clock seconds."""
    severity: str
    """``info``, ``warning`` or ``error``."""
    kind: str
    """source, restart, preempt, kv, throttle, ramp, tune, profile."""
    text: str

    def clock(self) -> str:
        return time.strftime("%H:%M:%S", time.localtime(self.t))

    def as_dict(self) -> dict[str, object]:
        return {"t": round(self.t, 3), "severity": self.severity, "kind": self.kind, "text": self.text}


class EventLog:
    """The newest ``size`` events, oldest first."""

    def __init__(self, size: int = 500) -> None:
        self._items: deque[Event] = deque(maxlen=size)
        self.added = 0
        """Events ever added (a widget redraws only when this moves)."""

    def add(self, event: Event) -> None:
        self._items.append(event)
        self.added += 1

    def extend(self, events: Iterable[Event]) -> None:
        for e in events:
            self.add(e)

    def note(self, kind: str, text: str, severity: str = "info", t: float | None = None) -> Event:
        """Add a milestone (a ramp step, a study's end) and return it."""
        e = Event(time.time() if t is None else t, severity, kind, text)
        self.add(e)
        return e

    def clear(self) -> None:
        self._items.clear()
        self.added += 1

    def recent(self, n: int | None = None) -> list[Event]:
        items = list(self._items)
        return items if n is None else items[-n:]

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class _Burst:
    start: float
    last: float
    count: float


@dataclass
class _Throttle:
    start: float
    last: float
    kind: str
    reasons: set[str] = field(default_factory=set)


def _dur(s: float) -> str:
    s = max(0.0, s)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


class EventDetector:
    """Turns successive ticks into :class:`Event` s (see the module's rules)."""

    def __init__(self) -> None:
        self._totals: dict[str, tuple[float | None, float | None]] = {}
        self._preempt: dict[str, float] = {}
        self._bursts: dict[str, _Burst] = {}
        self._kv_full: set[str] = set()
        self._throttles: dict[str, _Throttle] = {}
        self._down: set[str] = set()

    def status(self, s: SourceStatus, now: float) -> list[Event]:
        """A source's status change: down (with the reason) or back up."""
        if not s.up:
            if s.source in self._down:
                return []
            self._down.add(s.source)
            return [Event(now, "error", "source", f"{short_source(s.source)} down: {s.reason or 'no answer'}")]
        if s.source not in self._down:
            return []  # first contact is not news
        self._down.discard(s.source)
        return [Event(now, "info", "source", f"{short_source(s.source)} back up")]

    def servers(self, tick: VllmTick, now: float) -> list[Event]:
        out: list[Event] = []
        for server in tick.servers:
            if server.source in tick.stale:
                continue
            src, v, name = server.source, server.total, short_source(server.source)
            prev = self._totals.get(src)
            totals = (v.prompt_tokens_total, v.generation_tokens_total)
            self._totals[src] = totals
            if prev is not None and any(a is not None and b is not None and b < a for a, b in zip(prev, totals)):
                out.append(Event(now, "warning", "restart", f"{name} restarted (its lifetime counters went back)"))
                self._preempt.pop(src, None)
                self._kv_full.discard(src)
            out += self._preemptions(src, name, v.preemptions_total, now)
            kv = v.kv_cache_usage
            if kv is not None:
                if src not in self._kv_full and kv >= KV_ENTER:
                    self._kv_full.add(src)
                    out.append(Event(now, "warning", "kv", f"{name}: KV cache {kv:.0%} full, new requests wait"))
                elif src in self._kv_full and kv < KV_LEAVE:
                    self._kv_full.discard(src)
                    out.append(Event(now, "info", "kv", f"{name}: KV cache back to {kv:.0%}"))
        return out

    def _preemptions(self, src: str, name: str, total: float | None, now: float) -> list[Event]:
        out: list[Event] = []
        before = self._preempt.get(src)
        if total is not None:
            self._preempt[src] = total
        burst = self._bursts.get(src)
        grew = before is not None and total is not None and total > before
        if grew and total is not None and before is not None:
            if burst is None:
                self._bursts[src] = _Burst(now, now, total - before)
                out.append(Event(now, "error", "preempt", f"{name}: preemptions started (+{total - before:.0f})"))
            else:
                burst.last, burst.count = now, burst.count + (total - before)
        elif burst is not None and now - burst.last >= QUIET_S:
            del self._bursts[src]
            out.append(
                Event(
                    now,
                    "info",
                    "preempt",
                    f"{name}: preemption burst over: {burst.count:.0f} in {_dur(burst.last - burst.start)}",
                )
            )
        return out

    def gpus(self, gpus: Iterable[GpuSample], stale: frozenset[str], now: float) -> list[Event]:
        out: list[Event] = []
        for g in gpus:
            if g.source in stale:
                continue
            name = f"GPU {g.hostname + ':' if g.hostname else ''}{g.gpu}"
            kind = g.throttle_kind() if g.throttling else None
            ep = self._throttles.get(g.key)
            if kind is not None and kind != "idle":
                reasons = set(g.throttle_reasons or [])
                if ep is None:
                    self._throttles[g.key] = _Throttle(now, now, kind, reasons)
                    detail = ", ".join(sorted(reasons)) or "violation counters"
                    clock = f" at {g.sm_clock_mhz:.0f} MHz" if g.sm_clock_mhz is not None else ""
                    severity = "error" if kind == "thermal" else "warning"
                    out.append(Event(now, severity, "throttle", f"{name} throttling ({kind}: {detail}){clock}"))
                else:
                    ep.last = now
                    ep.reasons |= reasons
            elif ep is not None and now - ep.last >= THROTTLE_HOLD_S:
                del self._throttles[g.key]
                out.append(
                    Event(
                        now, "info", "throttle", f"{name} throttle over ({ep.kind}, lasted {_dur(ep.last - ep.start)})"
                    )
                )
        return out

    def throttling(self) -> set[str]:
        """GPU keys in a throttle episode now (hysteresis included)."""
        return set(self._throttles)
