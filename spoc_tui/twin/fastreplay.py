"""A one-replica trace replay on a twin, run by the compiled engine (:mod:`~spoc_tui.twin.replaykernel`,
issue 73): what :class:`~spoc_tui.twin.fleet.FleetSim` plays event by event in Python, the same
run to the last float, in a fraction of the time. The headroom's replays, the ledger's and a
predicted trace ramp's steps are such replays.

:func:`compiled` says whether a replay can run compiled: one replica, no autoscaler, and numba importable.
Others, and any run with ``SPOC_REPLAY_ENGINE=python`` in the environment, play in Python.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Sequence
from itertools import chain
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np  # the CLI loads this module only when a replay starts (FleetSim.start)
import platformdirs

from spoc_tui import APP_NAME
from spoc_tui.core.errors import first_line
from spoc_tui.core.ramp.steps import RequestSample
from spoc_tui.core.traces.read import TraceRow
from spoc_tui.core.tuning.engineflags import BLOCK_SIZES
from spoc_tui.sim.engine import SimRequest
from spoc_tui.sim.prefix import PrefixCache
from spoc_tui.sim.virtual import client_sample

if TYPE_CHECKING:
    from spoc_tui.twin.engine import TwinEngine
    from spoc_tui.twin.rowprompts import RowPrompts

logger = logging.getLogger(__name__)

ENV = "SPOC_REPLAY_ENGINE"
"""``python``: every replay plays in Python (the compiled engine's reference, and a way around it)."""

_POLL_ROOM = 256
_RUN_STEPS = 4096
"""The most decode steps one decode run takes at once (then another)."""


KERNEL_SOURCES = ("replaycore.py", "replaykernel.py")
"""The modules numba compiles: its cache of them is kept under a folder named by their sources."""
_loaded: dict[str, ModuleType | None] = {}


def kernel() -> ModuleType | None:
    """The compiled kernel's module, or None where replays play in Python (``SPOC_REPLAY_ENGINE=python``,
    or numba missing)."""
    if os.environ.get(ENV, "").strip().lower() == "python":
        return None
    if "kernel" not in _loaded:
        _loaded["kernel"] = _load()
    return _loaded["kernel"]


def _load() -> ModuleType | None:
    try:
        import numba
    except ImportError:
        return None
    if not os.environ.get("NUMBA_CACHE_DIR"):
        numba.config.CACHE_DIR = str(cache_folder())  # type: ignore[attr-defined]
    from spoc_tui.twin import replaykernel

    return replaykernel


def cache_folder() -> Path:
    """Where numba keeps the kernel's machine code: a folder of the user's cache named by the
    kernel's sources (a change to either module compiles both again: numba's own check looks at
    each function's module alone), not beside a source tree that may not be writable."""
    here = Path(__file__).parent
    digest = hashlib.sha1(b"".join((here / name).read_bytes() for name in KERNEL_SOURCES)).hexdigest()[:16]
    return Path(platformdirs.user_cache_dir(APP_NAME)) / "numba" / digest


def compiled(replicas: int, autoscaled: bool) -> bool:
    """Whether a replay on ``replicas`` (or an autoscaler's) can run compiled (this module's docstring)."""
    return replicas == 1 and not autoscaled and kernel() is not None


def compiled_replay(
    engine: TwinEngine, rows: Sequence[TraceRow], speed: float, prompts: RowPrompts, poll_s: float | None
) -> CompiledReplay | None:
    """The replay set up compiled and its loop compiled too (a process that finds numba's cache
    loads it), or None where numba fails to build it on this machine: said once in the log, and
    every replay of the process then plays in Python (the same figures, its old cost)."""
    try:
        fast = CompiledReplay(engine, rows, speed, prompts, poll_s)
        fast.run_until(-math.inf)  # nothing is due yet: compiles the loop now, where Python can take over
    except Exception as e:  # numba's errors (a compiler that cannot serve this machine), whatever their class
        logger.warning("the compiled replay could not be built (%s): replays play in Python", first_line(e, 200))
        _loaded["kernel"] = None
        return None
    return fast


class CompiledReplay:
    """One replay's state as arrays, played by :func:`replaykernel.run_until` as far as asked."""

    def __init__(
        self, engine: TwinEngine, rows: Sequence[TraceRow], speed: float, prompts: RowPrompts, poll_s: float | None
    ) -> None:
        from spoc_tui.twin import replaycore as lay
        from spoc_tui.twin import replaykernel as k

        self.k, self.lay, self.engine, self.rows, self.speed = k, lay, engine, rows, speed
        cfg = engine.cfg
        bs = cfg.block_size
        caching = bool(cfg.enable_prefix_caching)
        n = len(rows)
        req_i = np.zeros((n, lay.REQ_I), np.int64)
        req_f = np.full((n, lay.REQ_F), np.nan)
        key_lists: list[list[int]] = []
        key_len = np.zeros(n, np.int64)
        for j, row in enumerate(rows):
            prompt, keys, own = prompts.take(row)
            plen, out = len(prompt), row.output_tokens
            own_from = -1 if own is None else own // bs
            req_i[j, lay.PLEN], req_i[j, lay.OUTRAW], req_i[j, lay.TARGET] = plen, out, max(1, out)
            req_i[j, lay.OWN], req_i[j, lay.HLEN] = own_from, len(keys)
            if caching and not (0 <= own_from <= len(keys)):
                # its blocks past the prompt are hashed at its end (SimEngine._free): worked out
                # ahead as far as its answer can reach, the engine takes as many as it computed
                m, most = len(keys), (plen + max(1, out)) // bs
                if most > m:
                    tail = np.concatenate((np.asarray(prompt[m * bs :], np.int64), _answer(most * bs - plen)))
                    keys = PrefixCache.continued(keys, tail, bs, most)
            key_lists.append(keys if caching else [])
            key_len[j] = len(key_lists[-1])
        flat = np.fromiter(chain.from_iterable(key_lists), np.uint64, int(key_len.sum()))
        uniq, dense = np.unique(flat, return_inverse=True)
        self.keys = dense.astype(np.int64)
        req_i[:, lay.KLEN] = key_len
        req_i[:, lay.KOFF] = np.cumsum(key_len) - key_len
        target = req_i[:, lay.TARGET]
        req_i[:, lay.TOFF] = np.cumsum(target) - target
        req_f[:, lay.SEND] = np.fromiter((r.t / speed for r in rows), np.float64, n)
        req_f[:, lay.THINK] = np.fromiter((r.think_s or 0.0 for r in rows), np.float64, n)
        req_f[:, lay.HELD] = 0.0
        # follow-up turns: each parent's children, released at its end (FleetSim._finish_row)
        ids = {r.id for r in rows if r.id is not None}
        children: dict[str, list[int]] = {}
        first: list[int] = []
        for j, row in enumerate(rows):
            if row.parent is not None and row.parent in ids:
                children.setdefault(row.parent, []).append(j)
            else:
                first.append(j)
        group = {parent: g for g, parent in enumerate(children)}
        req_i[:, lay.GROUP] = [group.get(r.id, -1) if r.id is not None else -1 for r in rows]
        sizes = np.fromiter((len(c) for c in children.values()), np.int64, len(children))
        self.family = (
            np.concatenate(([0], np.cumsum(sizes))).astype(np.int64),
            np.fromiter(chain.from_iterable(children.values()), np.int64, int(sizes.sum())),
            np.zeros(max(1, len(children)), np.bool_),
        )
        self.req_i, self.req_f = req_i, req_f
        nkeys = len(uniq)
        model = engine.model
        sigma = float(engine._sigma)
        self.cfg_i = np.array(
            [engine.num_blocks, engine.budget, cfg.max_num_seqs, engine.max_len, bs, int(cfg.enable_chunked_prefill),
             int(caching), int(bool(model.ridge_moves) and model.b_prefill > 0), nkeys, int(engine._times_shared())],
            np.int64,
        )  # fmt: skip
        self.cfg_f = np.array(
            [model.b0, model.b_prefill, model.b_attn, model.b_decode, model.b_context, model.b_mixed, model.ridge,
             model.a0, model.a_prompt, sigma, -(sigma**2) / 2, poll_s or 0.0, min(model.b_shared, model.b_context)],
            np.float64,
        )  # fmt: skip
        self.st_i = np.zeros(lay.ST_I, np.int64)
        self.st_f = np.zeros(lay.ST_F, np.float64)
        self.st_i[lay.LRU_HEAD] = self.st_i[lay.LRU_TAIL] = -1
        state = engine._jitter_rng.getstate()
        self.mt = np.array(state[1][:624], np.int64)
        self.st_i[lay.MTI] = state[1][624]
        if state[2] is not None:
            self.st_i[lay.GAUSS_HELD], self.st_f[lay.GAUSS_NEXT] = 1, state[2]
        self.live = np.zeros(max(1, nkeys), np.int64)
        req_i[:, lay.SCOUNTED] = -1
        self.sharing = (np.zeros(max(1, nkeys), np.int64), np.zeros(n + 1, np.int64))
        nodes = nkeys + n + 1
        self.lru = (np.full(nodes, -1, np.int64), np.full(nodes, -1, np.int64), np.zeros(nodes, np.bool_),
                    np.zeros(nodes, np.int64))  # fmt: skip
        self.running = np.zeros(n + 1, np.int64)
        self.wq = np.zeros(n + 1, np.int64)
        self.pend_d = np.zeros(n + 1, np.int64)
        self.pend_p = np.zeros((n + 1, 2), np.int64)
        self.emitted = np.zeros(n + 1, np.int64)
        self.times = np.zeros(int(target.sum()) + 1, np.float64)
        self.fin = np.zeros(n + 1, np.int64)
        self.ends = np.zeros(_RUN_STEPS, np.float64)
        self.phase = np.zeros(max(BLOCK_SIZES), np.int64)
        self.polls = np.zeros((_POLL_ROOM, 4), np.float64)
        events = 2 * n + 4
        self.heap = (np.zeros(events, np.float64), np.zeros(events, np.int64), np.zeros((events, 2), np.int64))
        self._taken = 0
        self._polls_taken = 0
        k.start(self.st_i, req_f, np.asarray(first, np.int64), poll_s or 0.0, *self.heap)

    def run_until(self, until: float) -> bool:
        """The events due by ``until`` played; False where the kernel reached a state the Python
        engine never does (a request's blocks past the keys laid out for it: a bug the caller raises)."""
        k, lay = self.k, self.lay
        while True:
            got = k.run_until(
                until, self.cfg_i, self.cfg_f, self.st_i, self.st_f, self.req_i, self.req_f, self.keys, self.live,
                *self.lru, self.running, self.wq, self.pend_d, self.pend_p, self.emitted, self.times, self.fin,
                self.polls, self.mt, *self.heap, *self.sharing, *self.family, self.ends, self.phase,
            )  # fmt: skip
            if got != lay.NEED_POLLS:
                return bool(got == lay.RAN_OUT)
            grown = np.zeros((2 * len(self.polls), 4), np.float64)
            grown[: len(self.polls)] = self.polls
            self.polls = grown

    @property
    def over(self) -> bool:
        return bool(self.st_i[self.lay.OVER])

    @property
    def events_left(self) -> bool:
        return bool(self.st_i[self.lay.HEAP_N])

    @property
    def now(self) -> float:
        return float(self.st_f[self.lay.NOW])

    def new_samples(self, step: int) -> list[RequestSample]:
        """The requests answered (or refused) since the last call, as a client saw them, in the
        order they ended (FleetSim's on_finish)."""
        lay, ri, rf = self.lay, self.req_i, self.req_f
        upto = int(self.st_i[lay.FIN_N])
        out: list[RequestSample] = []
        if upto == self._taken:
            return out
        idx = self.fin[self._taken : upto]
        counts = ri[idx, lay.NTIMES]
        ends = np.cumsum(counts)
        starts = ends - counts
        # every request's token times one after another, and the gaps between them (those across
        # two requests unread): two lists for the lot, where each request took two of its own
        at = np.repeat(ri[idx, lay.TOFF] - starts, counts) + np.arange(int(ends[-1]) if len(ends) else 0)
        laid = self.times[at]
        all_times: list[float] = laid.tolist()
        all_gaps: list[float] = np.diff(laid).tolist()
        figures = zip(idx.tolist(), starts.tolist(), ends.tolist(), ri[idx, lay.REASON].tolist(),
                      ri[idx, lay.GENERATED].tolist(), ri[idx, lay.PLEN].tolist(), ri[idx, lay.CACHED].tolist(),
                      rf[idx, lay.START].tolist(), rf[idx, lay.FINISHED].tolist(), rf[idx, lay.HELD].tolist(),
                      strict=True)  # fmt: skip
        for i, a, b, why, generated, plen, cached, start, end, held in figures:
            row = self.rows[i]
            reason = "abort" if why == lay.ABORT else ("length" if why == lay.LENGTH else "stop")
            out.append(
                client_sample((reason, generated, plen, cached), start, all_times[a:b], end, step=step, users=1,
                              conversation=row.conversation or f"r{row.index}", turn=row.turn, last=row.last,
                              trace_index=row.index, scheduled=row.t / self.speed, held_s=held or None,
                              cut_counts=False, itl=tuple(all_gaps[a : b - 1]) if b > a else ())
            )  # fmt: skip
        self._taken = upto
        return out

    def new_polls(self) -> list[tuple[float, int, int, float]]:
        upto = int(self.st_i[self.lay.POLL_N])
        got = [(t, int(w), int(r), kv) for t, w, r, kv in self.polls[self._polls_taken : upto].tolist()]
        self._polls_taken = upto
        return got

    def counters(self) -> None:
        """The engine's counters as the Python engine would hold them now (its queues are the
        arrays': nothing reads them of a replay but its polls)."""
        lay, eng, st = self.lay, self.engine, self.st_i
        s = eng.stats
        s.iterations, s.generation_tokens = int(st[lay.ITERATIONS]), int(st[lay.GEN_TOKENS])
        s.preemptions, s.prompt_tokens = int(st[lay.PREEMPTIONS]), int(st[lay.PROMPT_TOKENS])
        s.prefix_queries, s.prefix_hits = int(st[lay.PREFIX_QUERIES]), int(st[lay.PREFIX_HITS])
        eng.busy_s, eng.running_peak, eng.used_blocks = float(self.st_f[lay.BUSY]), int(st[lay.PEAK]), int(st[lay.USED])
        eng.last_iteration_s = float(self.st_f[lay.LAST_STEP])

    def counts(self) -> tuple[int, int, int]:
        """(skipped, of them too big for the cache, of them stalled)."""
        st, lay = self.st_i, self.lay
        return int(st[lay.SKIPPED]), int(st[lay.TOO_BIG]), int(st[lay.STALLED])


def _answer(n: int) -> np.ndarray:
    """The first ``n`` token ids of an answer, as the engine makes them (:meth:`SimRequest.output_array`)."""
    return SimRequest(rid="", prompt=[], max_tokens=1, target_tokens=1, arrival=0.0).output_array(max(0, n))
