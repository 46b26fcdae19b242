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
