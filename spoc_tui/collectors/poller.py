"""Polling many sources with per-source history, back-off and status (no UI here).

The monitor's workers call :meth:`VllmPoller.poll` / :meth:`DcgmPoller.poll` once per tick
and post what comes back. A source that fails keeps its last data (shown as stale) and recovers
by itself. Only what is expensive backs off: a read that failed fast (connection refused, an
HTTP error answered at once: a server restarting) is tried again on the next poll, so a server
that comes back is seen within two polls; a read that cost time (a timeout, a host that does not
answer, a huge body) is retried after 1, 2, 4 ... 30 s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from spoc_tui.collectors.http import new_client
from spoc_tui.collectors.lighthttp import ScrapeClient, needs_httpx
from spoc_tui.collectors.scrape import DEFAULT_TIMEOUT, Reading, SourceError, fetch
from spoc_tui.core.errors import first_line
from spoc_tui.core.hardware.gpu import GpuSample, ThrottleWindow, dcgm_gpus
from spoc_tui.core.metrics.promparse import Exposition
from spoc_tui.core.metrics.vllm import Scrape, ServerView, ServerWindows, replicas_view
from spoc_tui.core.monitor.snapshots import GpuTick, SourceStatus, VllmTick
from spoc_tui.core.redact import redact_url

logger = logging.getLogger(__name__)

BACKOFF_MAX_S = 30.0
CHEAP_FAILURE_S = 0.25
"""A failed read that took less than this is retried at the next poll, without back-off."""


@dataclass
class _SourceState:
    source: str
    failures: int = 0
    next_try: float = 0.0
    up: bool | None = None
    reason: str | None = None
    last_ok: float | None = None


class _Backoff:
    def __init__(self, sources: list[str], clock: Callable[[], float]) -> None:
        self.clock = clock
        self.states = {s: _SourceState(s) for s in sources}
        self.names = {s: redact_url(s) for s in sources}
        """What a source is called in everything handed out: its URL without a password."""

    def due(self) -> list[str]:
        now = self.clock()
        return [s for s, st in self.states.items() if st.next_try <= now]

    def ok(self, source: str, wall: float) -> SourceStatus | None:
        st = self.states[source]
        changed = st.up is not True
        st.up, st.reason, st.failures, st.next_try, st.last_ok = True, None, 0, 0.0, wall
        return SourceStatus(self.names[source], True, None, wall) if changed else None

    def failed(self, source: str, reason: str, cost_s: float = float("inf")) -> SourceStatus | None:
        """``cost_s``: how long the failed read took; a cheap one is retried at the next poll."""
        st = self.states[source]
        if cost_s < CHEAP_FAILURE_S:
            delay = 0.0
        else:
            st.failures += 1
            delay = min(BACKOFF_MAX_S, 2.0 ** (st.failures - 1))
        st.next_try = self.clock() + delay
        changed = st.up is not False or st.reason != reason
        st.up, st.reason = False, reason
        return SourceStatus(self.names[source], False, reason, st.last_ok, delay) if changed else None

    def status(self) -> list[SourceStatus]:
        now = self.clock()
        return [
            SourceStatus(
                self.names[s],
                bool(st.up),
                st.reason,
                st.last_ok,
                max(0.0, st.next_try - now) if st.up is False else None,
            )
            for s, st in self.states.items()
        ]

    def down(self) -> set[str]:
        """The sources (raw URLs) whose last read failed."""
        return {s for s, st in self.states.items() if st.up is False}


class _Poller:
    """Shared fetch of the sources that are due, with back-off and kind checking."""

    kind = ""

    def __init__(
        self,
        urls: list[str],
        clock: Callable[[], float],
        client: httpx.AsyncClient | ScrapeClient | None,
        api_key: str | None = None,
    ) -> None:
        self.urls = list(urls)
        self.clock = clock
        self.api_key = api_key
        self.backoff = _Backoff(self.urls, clock)
        self._client: httpx.AsyncClient | ScrapeClient | None = client
        self._inflight: dict[str, asyncio.Task[Reading | SourceError]] = {}
        self._cost: dict[str, float] = {}
        """How long each source's last failed read took (seconds)."""

    async def aclose(self) -> None:
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._inflight.clear()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _read_due(self, wait_s: float | None) -> tuple[list[tuple[str, Reading]], list[SourceStatus]]:
        """Start a read of every due source (one at a time per source), wait up to ``wait_s``
        (None: until each has answered or hit its deadline), and return the good readings and
        the status changes of the failed ones. A read still going on keeps going; it is
        collected by a later call, so a slow source never holds the others back."""
        if self._client is None:
            # httpx only where the environment routes a source through a proxy
            light = not any(needs_httpx(u) for u in self.urls)
            self._client = ScrapeClient() if light else new_client(DEFAULT_TIMEOUT)
        client = self._client

        async def one(url: str) -> Reading | SourceError:
            t0 = self.clock()  # the poller's clock, as its back-off's: a test's virtual clock times both
            try:
                r = await fetch(client, url, self.api_key, derive=self._derive(url))
            except SourceError as e:
                self._cost[url] = self.clock() - t0
                return e
            except Exception as e:  # anything unforeseen is this source's failure, never the poller's
                logger.exception("reading %s", url)
                return SourceError(f"{url}: {type(e).__name__} ({first_line(e, 100)})")
            if r.kind != self.kind:
                return SourceError(
                    f"{url}: serves {r.kind} metrics, not {self.kind.upper() if self.kind == 'dcgm' else 'vLLM'}"
                )
            return r

        for url in self.backoff.due():
            if url not in self._inflight:
                self._inflight[url] = asyncio.create_task(one(url))
        if self._inflight:
            await asyncio.wait(list(self._inflight.values()), timeout=wait_s)
        good: list[tuple[str, Reading]] = []
        changes: list[SourceStatus] = []
        for url in [u for u, t in self._inflight.items() if t.done()]:
            res = self._inflight.pop(url).result()
            if isinstance(res, SourceError):
                ch = self.backoff.failed(url, str(res), self._cost.pop(url, float("inf")))
            else:
                good.append((url, res))
                ch = self.backoff.ok(url, res.wall_time)
            if ch:
                changes.append(ch)
        return good, changes

    def _derive(self, url: str) -> tuple[str, Callable[[Exposition], object]] | None:
        """What to work out from a source's exposition in the thread that parsed it (None: nothing)."""
        return None

    def slow(self) -> frozenset[str]:
        """Sources whose read is still going on."""
        return frozenset(self._inflight)


class VllmPoller(_Poller):
    kind = "vllm"

    def __init__(
        self,
        urls: list[str],
        window_s: float = 60.0,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        client: httpx.AsyncClient | ScrapeClient | None = None,
    ) -> None:
        super().__init__(urls, clock, client, api_key)
        self.windows = ServerWindows(window_s)
        self.latest: dict[str, tuple[ServerView, Scrape]] = {}
        self.on_scrape: Callable[[str, float, Exposition], None] | None = None
        """Called with each server's name, time and scrape, in the thread that parsed it (the
        monitor's live headroom learns from them)."""

    def reset(self) -> None:
        """Forget every earlier scrape: the next window starts at the next poll."""
        self.windows.clear()
        self.latest.clear()

    def _derive(self, url: str) -> tuple[str, Callable[[Exposition], object]]:
        # the server's view, in the thread that parsed the scrape (a body with thousands of
        # engines takes a while to reduce; a second hop to a thread cost more than the view)
        return ("vllm", lambda exp: self._view(url, exp))

    def _view(self, url: str, exp: Exposition) -> tuple[ServerView, Scrape]:
        t, name = self.clock(), self.backoff.names[url]
        if self.on_scrape is not None:
            self.on_scrape(name, t, exp)
        return self.windows.view(url, name, t, exp)

    async def poll(self, wait_s: float | None = None) -> VllmTick:
        """One tick; ``wait_s`` bounds how long a slow source may hold it up (None: each read's
        own deadline)."""
        good, changes = await self._read_due(wait_s)
        for url, res in good:
            if isinstance(res.derived, Exception):
                raise res.derived  # the view failed (a defect): shown as the poller's, as ever
            assert isinstance(res.derived, tuple)
            self.latest[url] = res.derived
        statuses = self.backoff.status()
        down = {u for u in self.backoff.down() if u in self.latest}
        stale = frozenset(self.backoff.names[u] for u in down)
        servers = tuple(self.latest[u][0] for u in self.urls if u in self.latest)
        fresh = [self.latest[u][1] for u in self.urls if u in self.latest and u not in down]
        total = replicas_view(fresh) if len(self.urls) > 1 and fresh else None
        return VllmTick(servers, total, stale, tuple(changes), tuple(statuses))


class DcgmPoller(_Poller):
    kind = "dcgm"

    def __init__(
        self,
        urls: list[str],
        clock: Callable[[], float] = time.monotonic,
        client: httpx.AsyncClient | ScrapeClient | None = None,
        window_s: float = 60.0,
    ) -> None:
        super().__init__(urls, clock, client)
        self.latest: dict[str, tuple[float, list[GpuSample]]] = {}
        self.throttle = ThrottleWindow(window_s)

    async def poll(self, wait_s: float | None = None) -> GpuTick:
        good, changes = await self._read_due(wait_s)
        for url, res in good:
            t = self.clock()
            self.latest[url] = (
                t,
                [self.throttle.add(t, g) for g in dcgm_gpus(res.exposition, self.backoff.names[url])],
            )
        statuses = self.backoff.status()
        stale = frozenset(self.backoff.names[u] for u in self.backoff.down() if u in self.latest)
        seen: set[str] = set()
        gpus_out: list[GpuSample] = []
        for u in self.urls:
            for g in self.latest.get(u, (0.0, []))[1]:
                if g.key not in seen:  # dedupe by UUID across exporters
                    seen.add(g.key)
                    gpus_out.append(g)
        return GpuTick(tuple(gpus_out), stale, tuple(changes), tuple(statuses))
