"""One-shot (or two-shot, windowed) reading of sources, for ``spoc inspect`` and scripts."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from spoc_tui.collectors.http import new_client
from spoc_tui.collectors.scrape import DEFAULT_TIMEOUT, Reading, SourceError, read_source
from spoc_tui.core.hardware.gpu import GpuSample, dcgm_gpus, with_throttle_window
from spoc_tui.core.metrics.vllm import Scrape, ServerView, server_view
from spoc_tui.core.monitor.fleet import lagging, replica_of_gpu
from spoc_tui.core.monitor.verdict import Verdict, verdict
from spoc_tui.core.redact import redact_url


@dataclass
class InspectResult:
    servers: list[ServerView] = field(default_factory=list)
    gpus: list[GpuSample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    headroom: dict[str, tuple[str, dict[str, object]]] = field(default_factory=dict)
    """Each server's headroom (``spoc inspect --headroom``), by its source as shown: its line
    and its result (:class:`spoc_tui.twin.headroom.Headroom`)."""
    fleet: tuple[str, dict[str, object]] | None = None
    """With more than one server's headroom: the fleet's (its weakest replica's), its line and
    ``{"replica": ..., "headroom": ...}``."""
    history_s: float | None = None
    """How much of Prometheus's history the headroom was learned from (``--prometheus``)."""
    watched_s: float | None = None
    """How long the sources were watched (``--headroom``; less than asked after Ctrl-C)."""
    interrupted: bool = False
    """The watch was ended early by Ctrl-C (what was seen is reported)."""

    def verdicts(self) -> list[Verdict]:
        """Each server's verdict on the monitor's ladder (:mod:`spoc_tui.core.monitor.verdict`), from this
        reading: the GPUs mapped to it (all of them with one server) and its fleet's peers. One
        reading has no queue history, so "the queue keeps growing" needs the monitor."""
        lags = {lag.source: lag.reason for lag in lagging(self.servers)}
        gpu_sources = sorted({g.source for g in self.gpus})
        out = []
        for s in self.servers:
            mine = [
                g
                for g in self.gpus
                if len(self.servers) == 1
                or replica_of_gpu(g.source, g.hostname, [x.source for x in self.servers], gpu_sources) == s.source
            ]
            hot = [f"GPU {g.gpu} {g.throttle_kind() or 'throttled'}" for g in mine if g.throttling]
            out.append(verdict(s.total, throttled=hot, lagging=lags.get(s.source)))
        return out

    def as_dict(self) -> dict[str, object]:
        servers = []
        for s, v in zip(self.servers, self.verdicts(), strict=True):
            d = {**s.as_dict(), **v.as_dict()}
            if s.source in self.headroom:
                d["headroom"] = self.headroom[s.source][1]
            servers.append(d)
        out: dict[str, object] = {"servers": servers, "gpus": [g.as_dict() for g in self.gpus]}
        if self.fleet is not None:
            out["fleet"] = self.fleet[1]
        if self.watched_s is not None:
            out["watched_s"] = round(self.watched_s, 1)
        if self.history_s is not None:
            out["history_s"] = round(self.history_s, 1)
        return out


async def read_all(client: httpx.AsyncClient, sources: list[str], api_key: str | None) -> list[Reading | SourceError]:
    async def one(src: str) -> Reading | SourceError:
        try:
            return await read_source(client, src, api_key)
        except SourceError as e:
            return e

    return list(await asyncio.gather(*(one(s) for s in sources)))


async def inspect_sources(
    sources: list[str], interval: float | None = None, api_key: str | None = None
) -> InspectResult:
    async with new_client(DEFAULT_TIMEOUT) as client:
        first = await read_all(client, sources, api_key)
        second: list[Reading | SourceError] | None = None
        if interval:
            await asyncio.sleep(interval)
            second = await read_all(client, sources, api_key)
    return result_of(sources, first, second)


def result_of(
    sources: Sequence[str], first: list[Reading | SourceError], second: list[Reading | SourceError] | None
) -> InspectResult:
    res = InspectResult()
    for i, src in enumerate(sources):
        a = first[i]
        b = second[i] if second is not None else None
        if isinstance(a, SourceError):
            res.errors.append(str(a))
            continue
        if isinstance(b, SourceError):
            res.errors.append(str(b))
            continue
        now, then = (b, a) if b is not None else (a, None)
        shown = redact_url(src)  # the source as shown and written: never with its password
        if now.kind == "vllm":
            scrape = Scrape(
                now.exposition, now.taken_at, then.exposition if then else None, then.taken_at if then else None
            )
            res.servers.append(server_view(shown, scrape))
        else:
            before = {g.key: g for g in dcgm_gpus(then.exposition, shown)} if then else {}
            dt = now.taken_at - then.taken_at if then else None
            for g in dcgm_gpus(now.exposition, shown):
                res.gpus.append(with_throttle_window(g, before.get(g.key), dt))
    return res
