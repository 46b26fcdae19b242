"""Replicas compared: which one lags the fleet.

Rule: with two replicas or more, a replica **lags** when its requests waiting are above
:data:`LAG_FACTOR` (1.5) times the fleet's median and at least :data:`MIN_WAITING` (1), or its
TTFT p99 over the window is above 1.5 times the fleet's median TTFT p99 (and at least 10 ms
above it: a few ms apart is noise). Waiting per replica is also the autoscaling signal
(``spoc plan``): the fleet's mean is shown with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spoc_tui.core.stats import median
from spoc_tui.core.vllm import ServerView

LAG_FACTOR = 1.5
MIN_WAITING = 1.0
MIN_TTFT_GAP_S = 0.010


@dataclass(frozen=True, slots=True)
class Lag:
    source: str
    reason: str


def lagging(servers: Sequence[ServerView], stale: frozenset[str] = frozenset()) -> list[Lag]:
    live = [s for s in servers if s.source not in stale]
    if len(live) < 2:
        return []
    waits = [s.total.waiting for s in live if s.total.waiting is not None]
    p99s = [p for s in live if (p := s.total.latency["ttft"].p99) is not None]
    med_w = median(waits) if len(waits) >= 2 else None
    med_p = median(p99s) if len(p99s) >= 2 else None
    out: list[Lag] = []
    for s in live:
        why: list[str] = []
        w = s.total.waiting
        if med_w is not None and w is not None and w >= MIN_WAITING and w > LAG_FACTOR * med_w:
            why.append(f"{w:.0f} waiting vs fleet median {med_w:.1f}")
        p = s.total.latency["ttft"].p99
        if med_p is not None and p is not None and p > LAG_FACTOR * med_p and p - med_p >= MIN_TTFT_GAP_S:
            why.append(f"TTFT p99 {p * 1e3:.0f} ms vs fleet median {med_p * 1e3:.0f} ms")
        if why:
            out.append(Lag(s.source, "; ".join(why)))
    return out


def waiting_per_replica(servers: Sequence[ServerView], stale: frozenset[str] = frozenset()) -> float | None:
    waits = [s.total.waiting for s in servers if s.source not in stale and s.total.waiting is not None]
    return sum(waits) / len(waits) if waits else None
