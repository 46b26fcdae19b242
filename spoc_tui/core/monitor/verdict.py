"""One verdict per server, on one ladder, and the SLA check of the monitor's latency cells.

The ladder (issue 35), the first rung that holds is the headline; every lower rung that also
holds is listed beneath it as a cause, each with its figure:

1. ``down``: its source does not answer (the last figures are kept, dimmed, never called healthy).
2. ``shedding load``: the queue keeps growing (never emptying, rising over the last refreshes),
   or the server turns requests away (admission rejections, 5xx answers).
3. ``KV-bound``: KV-cache use at or above 90 %, or preemptions over the window.
4. ``throttled``: a GPU serving it throttles for a thermal or power reason (or an unnamed one).
5. ``straggler``: a GPU of one of its tensor-parallel groups runs slower than its peers and
   holds the whole group back.
6. ``lagging``: a replica whose TTFT (or queue) is more than 1.5x its peers' median.
7. ``queue-bound``: requests wait (in every one of the last few refreshes) while the KV cache
   has room: the batch limits (max-num-seqs, max-num-batched-tokens) hold them.
8. ``SLA broken``: no rung above, but a latency limit of the SLA is exceeded over the window.
9. ``idle``: nothing running or waiting.
10. ``healthy``.

A verdict says when the SLA is broken (``KV-bound, SLA broken``). With fewer observations in the
window than a percentile needs (:meth:`LatencySummary.few`) the SLA is not judged on it: a p99 of
30 requests is not evidence either way. :class:`VerdictTracker` keeps the verdict shown from
flickering: a new rung must hold for :data:`HOLD_POLLS` refreshes (``down`` at once) and the
shown verdict says since when it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from spoc_tui.core.metrics.vllm import EngineView
from spoc_tui.core.ramp.sla import Limit

KV_BOUND = 0.90


@dataclass(frozen=True, slots=True)
class Verdict:
    word: str
    severity: str
    """``ok``, ``warning`` or ``error``."""
    reason: str
    """The headline's figure (``632 waiting, up from 232``)."""
    causes: tuple[str, ...] = ()
    """Lower rungs that also hold, each with its figure, in ladder order."""
    since: float | None = None
    """When this verdict began to hold (wall clock; set by :class:`VerdictTracker`)."""

    @property
    def text(self) -> str:
        return f"{self.word}: {self.reason}" if self.reason else self.word

    @property
    def rung(self) -> str:
        """The ladder's rung, without the SLA suffix (``KV-bound, SLA broken`` -> ``KV-bound``)."""
        return self.word.split(",")[0]

    def as_dict(self) -> dict[str, object]:
        return {
            "verdict": self.word,
            "severity": self.severity,
            "reason": self.reason,
            "causes": list(self.causes),
            "since": self.since,
        }


@dataclass(frozen=True, slots=True)
class Breach:
    limit: Limit
    value: float

    def __str__(self) -> str:
        v = f"{self.value * 1000:.0f}ms" if self.value < 1 else f"{self.value:.2f}s"
        if self.limit.metric == "error_rate":
            v = f"{self.value:.1%}"
        return f"{self.limit.key} {v} > {str(self.limit).split('<=')[1]}"


def observed(view: EngineView, limit: Limit) -> float | None:
    """The view's figure for one SLA limit (None: not measured, or too few observations)."""
    if limit.metric == "error_rate":
        bad = sum(view.finished_rates.get(r, 0.0) for r in ("abort", "error"))
        total = sum(view.finished_rates.values())
        return bad / total if total > 0 else None
    lat = view.latency.get(limit.metric)
    if lat is None:
        return None
    if limit.stat == "mean":
        return lat.mean
    if limit.stat not in ("p50", "p90", "p99") or lat.few(limit.stat):
        return None  # p95 is not among the histogram summaries; a thin window judges nothing
    value: float | None = getattr(lat, limit.stat)
    return value


def breaches(view: EngineView | None, limits: Sequence[Limit]) -> list[Breach]:
    if view is None:
        return []
    out = []
    for lim in limits:
        v = observed(view, lim)
        if v is not None and v > lim.value:
            out.append(Breach(lim, v))
    return out


GROWING_POLLS = 5
"""The queue is growing when it never emptied and rose over this many refreshes (and no reading fell)."""


def queue_growing(queue: Sequence[float | None]) -> str | None:
    """``232 -> 632 waiting over the last 5 refreshes`` when the recent queue readings (oldest
    first) never emptied and kept rising, else None."""
    recent = list(queue)[-GROWING_POLLS - 1 :]
    if len(recent) <= GROWING_POLLS or any(w is None for w in recent):
        return None
    ws = [float(w) for w in recent if w is not None]
    if ws[0] > 0 and all(b >= a for a, b in zip(ws, ws[1:], strict=False)) and ws[-1] > ws[0]:
        return f"{ws[0]:.0f} -> {ws[-1]:.0f} waiting over the last {len(ws) - 1} refreshes"
    return None


def _shedding(view: EngineView) -> str | None:
    parts = []
    if view.rejections_rate:
        parts.append(f"admission rejections {view.rejections_rate:.2g}/s")
    for status, r in sorted(view.http_rates.items()):
        if status.startswith("5") and r:
            parts.append(f"HTTP {status} {r:.2g}/s")
    return ", ".join(parts) or None


def verdict(
    view: EngineView | None,
    *,
    down: str | None = None,
    throttled: Sequence[str] = (),
    limits: Sequence[Limit] = (),
    waiting: float | None = None,
    queue: Sequence[float | None] = (),
    straggler: str | None = None,
    lagging: str | None = None,
) -> Verdict:
    """The server's verdict on the ladder (see the module): ``down``: why its source is down
    (None: up); ``throttled``: "GPU 3 thermal"-style names of its throttling GPUs; ``waiting``:
    the fewest requests waiting over the last few refreshes (a queue that empties between steps is
    not a bottleneck), else the view's now; ``queue``: its recent queue readings, oldest first;
    ``straggler``: a GPU holding one of its TP groups back, in words; ``lagging``: how it lags
    its fleet's peers, in words."""
    if down is not None:
        return Verdict("down", "error", down)
    if view is None:
        return Verdict("waiting for data", "warning", "")
    broken = breaches(view, limits)
    sla = ", ".join(str(b) for b in broken)
    suffix = ", SLA broken" if broken else ""
    rungs: list[tuple[str, str, str]] = []  # (word, severity, figure) of every rung that holds
    growing = queue_growing(queue)
    shed = _shedding(view)
    if growing or shed:
        rungs.append(("shedding load", "error", "; ".join(x for x in (growing and f"queue {growing}", shed) if x)))
    kv = view.kv_cache_usage
    if (kv is not None and kv >= KV_BOUND) or view.preemptions_rate:
        why = [f"KV cache {kv:.0%}" if kv is not None else "KV cache full"]
        if view.preemptions_rate:
            why.append(f"{view.preemptions_rate:.2g} preemptions/s")
        rungs.append(("KV-bound", "error", ", ".join(why)))
    if throttled:
        rungs.append(("throttled", "error", ", ".join(throttled)))
    if straggler:
        rungs.append(("straggler", "warning", straggler))
    if lagging:
        rungs.append(("lagging", "warning", lagging))
    queued = view.waiting if waiting is None else waiting
    if queued and view.waiting:
        wait = f"{view.waiting:.0f} waiting with the KV cache at {kv:.0%}" if kv is not None else "requests waiting"
        rungs.append(("queue-bound", "warning", wait + " (max-num-seqs / batch tokens)"))
    if rungs:
        (word, severity, figure), rest = rungs[0], rungs[1:]
        causes = tuple(f"{w}: {f}" for w, _, f in rest)
        if sla:
            causes += (f"SLA broken: {sla}",)
        return Verdict(word + suffix, "error" if broken else severity, figure, causes)
    if broken:
        return Verdict("SLA broken", "error", sla)
    if not view.running:
        return Verdict("idle", "ok", "")
    return Verdict("healthy", "ok", f"{view.running:.0f} running" + (", within the SLA" if limits else ""))


HOLD_POLLS = 3
"""A new verdict must hold for this many refreshes in a row before it is shown (``down`` at once)."""

CALM_FIGURE_S = 5.0
"""A calm verdict's figure (``healthy: 13 running``) is refreshed at most this often: the count
changing every second read as flicker, and the servers table shows it live."""


class VerdictTracker:
    """The verdict shown per server, kept from flickering: a change of rung is shown once the
    new rung has held for :data:`HOLD_POLLS` refreshes in a row (a server going down is shown at
    once), and the shown verdict carries since when its rung holds. The figures of the shown
    verdict are refreshed every poll while its rung holds (a calm one's, ``ok``, every
    :data:`CALM_FIGURE_S` at most)."""

    def __init__(self, hold: int = HOLD_POLLS) -> None:
        self.hold = hold
        self._shown: dict[str, Verdict] = {}
        self._pending: dict[str, tuple[str, int, float]] = {}
        """A candidate rung per server: (rung, refreshes it held in a row, when it began)."""
        self._figured: dict[str, float] = {}
        """When each shown verdict's figure was last refreshed."""

    def update(self, source: str, v: Verdict, now: float, count: bool = True) -> Verdict:
        """The verdict to show for ``source`` now that ``v`` holds; ``count``: this is a poll of
        the server (a GPU tick re-judges without counting towards a change)."""
        shown = self._shown.get(source)
        if shown is None or shown.rung == v.rung or v.rung == "down" or shown.rung == "waiting for data":
            self._pending.pop(source, None)
            since: float | None = now
            if shown is not None and shown.rung == v.rung:
                calm = v.severity == shown.severity == "ok" and v.word == shown.word
                if calm and now - self._figured.get(source, now) < CALM_FIGURE_S:
                    return shown  # a calm verdict keeps its figure a few seconds
                since = shown.since
            out = replace(v, since=since)
            self._shown[source] = out
            self._figured[source] = now
            return out
        if not count:
            return shown
        rung, n, began = self._pending.get(source, (v.rung, 0, now))
        if rung != v.rung:
            rung, n, began = v.rung, 0, now
        n += 1
        if n >= self.hold:
            self._pending.pop(source, None)
            out = replace(v, since=began)
            self._shown[source] = out
            self._figured[source] = now
            return out
        self._pending[source] = (rung, n, began)
        return shown

    def forget(self, keep: set[str]) -> None:
        for d in (self._shown, self._pending, self._figured):
            for k in [k for k in d if k not in keep]:
                del d[k]
