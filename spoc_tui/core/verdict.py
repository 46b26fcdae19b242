"""A one-word health verdict per server, and the SLA check of the monitor's latency cells.

The verdict names what limits the server now, the first rule that holds winning:

1. ``down``: its source does not answer (the last figures are kept, dimmed, never called healthy).
2. ``throttled``: a GPU serving it throttles for a thermal or power reason (or an unnamed one).
3. ``KV-bound``: KV-cache use at or above 90 %, or preemptions over the window: the cache, not the
   scheduler's batch limit, keeps requests waiting.
4. ``queue-bound``: requests wait (in every one of the last few refreshes) while the KV cache
   has room: the batch limits (max-num-seqs, max-num-batched-tokens) hold them.
5. ``SLA broken``: no bottleneck above, but a latency limit of the SLA is exceeded over the window.
6. ``idle``: nothing running or waiting.
7. ``healthy``.

A bottleneck verdict also says when the SLA is broken (``KV-bound, SLA broken``). With fewer
observations in the window than a percentile needs (:meth:`LatencySummary.few`) the SLA is
not judged on it: a p99 of 30 requests is not evidence either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spoc_tui.core.sla import Limit
from spoc_tui.core.vllm import EngineView

KV_BOUND = 0.90


@dataclass(frozen=True, slots=True)
class Verdict:
    word: str
    severity: str
    """``ok``, ``warning`` or ``error``."""
    reason: str

    @property
    def text(self) -> str:
        return f"{self.word}: {self.reason}" if self.reason else self.word


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


def verdict(
    view: EngineView | None,
    *,
    down: str | None = None,
    throttled: Sequence[str] = (),
    limits: Sequence[Limit] = (),
    waiting: float | None = None,
) -> Verdict:
    """``down``: why the source is down (None: up); ``throttled``: "GPU 3 thermal"-style names of
    the server's throttling GPUs; ``waiting``: the fewest requests waiting over the last few
    refreshes (a queue that empties between steps is not a bottleneck), else the view's now."""
    if down is not None:
        return Verdict("down", "error", down)
    if view is None:
        return Verdict("waiting for data", "warning", "")
    broken = breaches(view, limits)
    sla = ", ".join(str(b) for b in broken)
    suffix = ", SLA broken" if broken else ""
    if throttled:
        return Verdict("throttled" + suffix, "error", "; ".join([", ".join(throttled), *([sla] if sla else [])]))
    kv = view.kv_cache_usage
    if (kv is not None and kv >= KV_BOUND) or view.preemptions_rate:
        why = [f"KV cache {kv:.0%}" if kv is not None else "KV cache full"]
        if view.preemptions_rate:
            why.append(f"{view.preemptions_rate:.2g} preemptions/s")
        return Verdict("KV-bound" + suffix, "error", "; ".join([", ".join(why), *([sla] if sla else [])]))
    queue = view.waiting if waiting is None else waiting
    if queue and view.waiting:
        wait = f"{view.waiting:.0f} waiting with the KV cache at {kv:.0%}" if kv is not None else "requests waiting"
        return Verdict(
            "queue-bound" + suffix,
            "warning",
            "; ".join([wait + " (max-num-seqs / batch tokens)", *([sla] if sla else [])]),
        )
    if broken:
        return Verdict("SLA broken", "error", sla)
    if not view.running:
        return Verdict("idle", "ok", "")
    return Verdict("healthy", "ok", f"{view.running:.0f} running" + (", within the SLA" if limits else ""))
