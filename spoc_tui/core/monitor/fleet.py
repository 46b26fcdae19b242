"""Replicas compared: which one lags the fleet.

Rule: with two replicas or more, a replica **lags** when its requests waiting are above
:data:`LAG_FACTOR` (1.5) times its peers' median (the other live replicas), at least
:data:`MIN_WAITING` (1) and :data:`MIN_WAITING_GAP` (2) more; or its TTFT p99 over the window
is above 1.5 times its peers' median TTFT p99 (and at least 10 ms above it: a few ms apart is
noise); or its ITL p99 likewise (5 ms). Waiting per replica is also the autoscaling signal
(``spoc plan``): the fleet's mean is shown with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spoc_tui.core.metrics.stats import median
from spoc_tui.core.metrics.vllm import ServerView

LAG_FACTOR = 1.5
MIN_WAITING = 1.0
MIN_WAITING_GAP = 2.0
"""Waiting counts are small whole numbers: 2 against a peer's 1 is not a lagging replica."""
MIN_TTFT_GAP_S = 0.010
MIN_ITL_GAP_S = 0.005


@dataclass(frozen=True, slots=True)
class Lag:
    source: str
    reason: str


def lagging(servers: Sequence[ServerView], stale: frozenset[str] = frozenset()) -> list[Lag]:
    """Replicas more than :data:`LAG_FACTOR` times their peers' median (the other live replicas):
    in requests waiting, TTFT p99 or ITL p99, each with its figure."""
    live = [s for s in servers if s.source not in stale]
    if len(live) < 2:
        return []
    out: list[Lag] = []
    for s in live:
        peers = [p for p in live if p is not s]
        why: list[str] = []
        w = s.total.waiting
        waits = [p.total.waiting for p in peers if p.total.waiting is not None]
        if waits and w is not None:
            med_w = median(waits)
            if med_w is not None and w >= MIN_WAITING and w > LAG_FACTOR * med_w and w - med_w >= MIN_WAITING_GAP:
                why.append(f"{w:.0f} waiting vs its peers' median {med_w:.1f}")
        for metric, name, gap in (("ttft", "TTFT", MIN_TTFT_GAP_S), ("itl", "ITL", MIN_ITL_GAP_S)):
            v = s.total.latency[metric].p99
            others = [x for p in peers if (x := p.total.latency[metric].p99) is not None]
            if v is None or not others:
                continue
            med = median(others)
            if med is not None and v > LAG_FACTOR * med and v - med >= gap:
                why.append(f"{name} p99 {v * 1e3:.0f} ms vs its peers' median {med * 1e3:.0f} ms")
        if why:
            out.append(Lag(s.source, "; ".join(why)))
    return out


def waiting_per_replica(servers: Sequence[ServerView], stale: frozenset[str] = frozenset()) -> float | None:
    waits = [s.total.waiting for s in servers if s.source not in stale and s.total.waiting is not None]
    return sum(waits) / len(waits) if waits else None


def _host(url: str) -> str:
    from urllib.parse import urlsplit

    try:
        return (urlsplit(url if "://" in url else "http://" + url).hostname or "").lower()
    except ValueError:
        return ""


def replica_of_gpu(
    gpu_source: str, gpu_hostname: str | None, servers: Sequence[str], gpu_sources: Sequence[str]
) -> str | None:
    """Which replica (server source) a GPU serves, or None when nothing says.

    1. One server: all GPUs are its.
    2. The GPU's hostname (DCGM's ``Hostname`` label) is the host of exactly one server's URL.
    3. As many GPU sources (``--dcgm``) as servers (``--url``): they pair up in the order given
       (``--url A --url B --dcgm A-exporter --dcgm B-exporter``), as the fleet demo passes them.
    """
    if len(servers) == 1:
        return servers[0]
    if gpu_hostname:
        by_host = [s for s in servers if _host(s) == gpu_hostname.lower()]
        if len(by_host) == 1:
            return by_host[0]
    if len(gpu_sources) == len(servers) and gpu_source in gpu_sources:
        return servers[list(gpu_sources).index(gpu_source)]
    return None
