"""The experiment driver's virtual backend: a simulated engine (the simulator's or the twin's)
under virtual users (:class:`~spoc_tui.sim.virtual.VirtualServer`), in virtual time.

The driver (:class:`spoc_tui.core.ramp.experiment.Driver`) runs the very loop ``spoc ramp`` runs over
it; nothing here waits, so :func:`~spoc_tui.core.ramp.experiment.run_now` runs a whole ramp in
seconds, the same for a seed every time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from spoc_tui.core.ramp.experiment import immediately
from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.ramp.steps import ClientHealth, ReplaySent, RequestSample, ServerWindow
from spoc_tui.sim.engine import SimEngine
from spoc_tui.sim.virtual import VirtualServer

T = TypeVar("T")


def counters(eng: SimEngine) -> dict[str, float]:
    """The engine's cumulative counters a window's rates are differences of."""
    st = eng.stats
    return {
        "preemptions": st.preemptions,
        "generation": st.generation_tokens,
        "prefix_queries": st.prefix_queries,
        "prefix_hits": st.prefix_hits,
        "busy": eng.busy_s,
    }


class PollStats:
    """A window's polls of the engine (requests waiting, running, KV use), and the engine's own view
    over the window as /metrics would have shown it (:meth:`window`, with its :func:`counters` at
    the start and the end): its figures kept as the polls come, the same as from the list of
    them, without walking every poll at every poll (a predicted step polls each virtual second and
    the driver reads the window at each: a ten-speed prediction of a long trace spent a sixth of
    its time walking its polls)."""

    def __init__(self) -> None:
        self.n = 0
        self._waiting = np.empty(64)
        self._waiting_max = 0.0
        self._running_max = 0
        self._kv_max = 0.0
        self._full = 0

    def add(self, waiting: int, running: int, kv: float, seats: int | None = None) -> None:
        """One poll; ``seats``: count it saturated where requests wait or every seat is taken."""
        if self.n == len(self._waiting):
            self._waiting = np.concatenate((self._waiting, np.empty(self.n)))
        self._waiting[self.n] = float(waiting)
        if not self.n or waiting > self._waiting_max:
            self._waiting_max = float(waiting)
        if not self.n or running > self._running_max:
            self._running_max = running
        if not self.n or kv > self._kv_max:
            self._kv_max = kv
        self.n += 1
        if seats is not None and (waiting > 0 or running >= seats):
            self._full += 1

    @property
    def saturated(self) -> float:
        """The share of the polls with requests waiting or every seat taken (of those ``add`` was told the seats)."""
        return self._full / self.n if self.n else 0.0

    def window(self, start: dict[str, float], end: dict[str, float], secs: float) -> ServerWindow:
        """The window's figures: the polls so far, the counters' rates over ``secs``."""
        q = end["prefix_queries"] - start["prefix_queries"]
        secs = max(secs, 1e-9)
        waiting = self._waiting[: self.n]
        return ServerWindow(
            seen=True,
            waiting=float(waiting[-1]) if self.n else None,
            waiting_max=self._waiting_max if self.n else None,
            waiting_mean=float(np.mean(waiting)) if self.n else None,
            running_max=float(self._running_max) if self.n else None,
            kv_cache_usage_max=self._kv_max if self.n else None,
            preemptions_per_s=(end["preemptions"] - start["preemptions"]) / secs,
            generation_tokens_per_s=(end["generation"] - start["generation"]) / secs,
            prefix_cache_hit_rate=(end["prefix_hits"] - start["prefix_hits"]) / q if q else None,
            window="predicted",
        )


class VirtualBackend:
    """Virtual users on a simulated engine, as the driver's backend.

    Either one server for the whole ramp (``server``: each step continues the last, as on a real
    server), or a fresh one per step (``fresh(idx, users)``: a study's fast mode, each level on a
    new engine). A twin's trace replay has a backend of its own (:class:`~spoc_tui.twin.predict.TraceBackend`).
    """

    generators = 1

    def __init__(
        self,
        server: VirtualServer | None = None,
        *,
        spawn_rate: Callable[[int], float] | None = None,
        fresh: Callable[[int, int], VirtualServer] | None = None,
    ) -> None:
        """
        Args:
            spawn_rate: users per second for a step that changes the count by its argument (the
                ramp's rule); None: the server's own ``spread_s``.
        """
        self.vs = server
        self.spawn_rate = spawn_rate
        self.fresh = fresh
        self.offset = 0.0
        """A fresh server's clock starts at 0: the time before it, on the driver's clock."""
        self.clock = server.now if server is not None else 0.0
        """The driver's clock: the time it last advanced to. (The engine may have stepped a little
        past it, finishing its step; a window ends where the driver said, not there.)"""
        self.level_at = -math.inf
        self.polls = PollStats()
        self.busy: dict[int, float] = {}
        """Per step: the share of its window the engine was stepping."""
        self.saturated: dict[int, float] = {}
        """Per step: the share of its window's polls with requests waiting or every seat taken."""
        self.peaks: dict[int, int] = {}
        """Per step: the most requests the engine ran at once in its window."""
        self._c0: dict[str, float] = {}
        self._start = 0.0
        self._idx = 0
        self._answered = 0

    @property
    def engine(self) -> SimEngine:
        assert self.vs is not None
        return self.vs.engine

    def now(self) -> float:
        return self.clock

    def samples(self) -> int:
        return self._answered + (len(self.vs.samples) if self.vs is not None else 0)

    def _advance(self, until: float) -> None:
        assert self.vs is not None
        self.vs.advance(until - self.offset)
        self.clock = max(self.clock, until)
        eng = self.vs.engine
        # each advance: reading it costs nothing
        self.polls.add(len(eng.waiting), len(eng.running), eng.kv_usage, eng.cfg.max_num_seqs)

    async def advance(self, until: float) -> None:
        self._advance(until)

    async def set_level(self, idx: int, level: float, prev: float, open_loop: bool) -> str:
        self._idx = idx
        if self.fresh is not None:
            if self.vs is not None:
                self.offset, self._answered = self.clock, self.samples()
            self.vs = self.fresh(idx, int(level))
        elif self.vs is None:
            raise RuntimeError("a VirtualBackend needs a server or a way to make one")
        elif open_loop:
            self.vs.set_rate(level)
        else:
            change = int(level - prev)
            if self.spawn_rate is not None:
                self.vs.spread_s = abs(change) / self.spawn_rate(change) if change else 0.0
            self.vs.set_users(int(level))
        self.level_at = self.now()
        return ""

    async def drain(self, most_s: float, say: Callable[[str], None]) -> float:
        assert self.vs is not None
        self.vs.drain(most_s)
        self.clock = max(self.clock, self.offset + self.vs.now)
        return self.clock

    async def begin_window(self) -> None:
        self.polls = PollStats()
        self._c0 = counters(self.engine)
        self._start = self.now()
        self.engine.running_peak = len(self.engine.running)

    async def poll(self) -> ServerWindow:
        eng = self.engine
        secs = self.now() - self._start
        if self.polls.n:
            self.saturated[self._idx] = self.polls.saturated
        c1 = counters(eng)
        self.peaks[self._idx] = eng.running_peak
        self.busy[self._idx] = min(1.0, (c1["busy"] - self._c0["busy"]) / max(secs, 1e-9))
        return self.polls.window(self._c0, c1, secs)

    def window(self, idx: int, start: float, end: float, sent_from: float) -> list[RequestSample]:
        assert self.vs is not None
        o = self.offset
        return self.vs.window(start - o, end - o, max(sent_from, self.level_at) - o)

    def client(self, start: float, end: float, limits: Sequence[Limit]) -> ClientHealth:
        return ClientHealth()

    async def start_replay(self, idx: int, speed: float) -> float:
        raise RuntimeError("virtual users hold levels; a twin's trace replay is its own backend (twin.predict)")

    def replayed(self, idx: int) -> ReplaySent:
        raise RuntimeError("virtual users hold levels; a twin's trace replay is its own backend (twin.predict)")

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        return await immediately(fn, *args)

    async def stop(self) -> None:
        pass
