"""The steps while every running request is a lazy decode (:mod:`spoc_tui.sim.lazy`) and none can
join them, up to the caller's next event or the next answer to end (issue 73): what
:meth:`SimEngine.step` and :meth:`SimEngine.complete` would make of each, without walking the batch.
A long stretch has its steps' costs worked out as one array; the rest go one by one, a few floats
each. The same floats as the step path's, step for step (``tests/unit/test_decode_run.py``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol, TypeVar

import numpy as np

from spoc_tui.core.hardware.capacity import IterationCost
from spoc_tui.sim import decoderun, lazy
from spoc_tui.sim.decoderun import MOST_STEPS, NOTHING, Run


class _Request(decoderun._Request, lazy._Request, Protocol):
    """What a lazy run reads and writes of a request (:class:`~spoc_tui.sim.engine.SimRequest`)."""


R = TypeVar("R", bound=_Request)


class _Engine(decoderun._Engine[R], Protocol[R]):
    """What a lazy run reads and writes of its engine (:class:`~spoc_tui.sim.engine.SimEngine`,
    whose :meth:`decode_run` calls in: this module is below it)."""

    _lazy: lazy.Decoders[R]
    _eager: list[R]
    _step_lazy: int

    def _cost(self, decodes: list[R], prefills: list[tuple[R, int]]) -> IterationCost: ...

    def _lazy_cost(self, n: int, context: int) -> IterationCost: ...


STRETCH = 16
"""Steps a stretch must reach before its costs are worked out as arrays (a few dozen NumPy calls:
about what a dozen steps one by one cost)."""


def lazy_run(
    eng: _Engine[R], until: float, horizon: Callable[[], float], clock_to: Callable[[float], None], strict: bool
) -> Run:
    """The steps while every running request is a lazy decode and none can join them, up to the
    caller's next event (as :func:`~spoc_tui.sim.decoderun.decode_run` stops) or the next answer
    to end: each step what :meth:`step` and :meth:`complete` make of it, in a few operations."""
    lazy, n = eng._lazy, eng._lazy.n
    if not n or eng._eager or eng._abort_pending or n > eng.budget:
        return NOTHING
    if eng.waiting and len(eng.running) < eng.cfg.max_num_seqs:
        return NOTHING  # the next step admits
    eng.running_peak = max(eng.running_peak, len(eng.running))  # as each step's schedule counts it
    stop_at = min(until, horizon())
    t, done, pending = eng.clock(), 0, None
    while True:
        ran, pending, t = _stretch(eng, t, stop_at, strict)
        if not ran and pending is None:
            ran, pending, t = _steps(eng, t, stop_at, strict)
            if not ran and pending is None:
                break  # its blocks are not free: the step path preempts
        done += ran
        if pending is not None:
            break
        if lazy.due and lazy.due[0][0] <= lazy.steps and (ended := lazy.ending()):
            clock_to(t)
            for r in ended:
                eng._answered(r, t)
            break
        if not strict and t >= stop_at:
            break
    if done:
        st = eng.stats
        st.iterations += done
        st.generation_tokens += n * done
        st.iteration_tokens.observe_times(float(n), done)
        clock_to(t)
    return Run(done, pending)


def _steps(eng: _Engine[R], t: float, stop_at: float, strict: bool) -> tuple[int, float | None, float]:
    """Up to the next answer to end, steps one by one, each costed as :meth:`SimEngine.step` costs
    it (a twin's jitter drawn as it does, one a step), then accounted together: as :func:`_walk`
    says, with ``strict`` the step that reaches the caller's next event left scheduled; they stop
    before a step whose blocks are not free (the step path preempts)."""
    lazy, n = eng._lazy, eng._lazy.n
    s0, bs, per_phase = lazy.steps, lazy.block_size, lazy.per_phase
    k = min(lazy.due[0][0] - s0 if lazy.due else MOST_STEPS, MOST_STEPS)
    room = eng.num_blocks - eng.used_blocks
    durs: list[float] = []
    flops: list[float] = []
    read: list[float] = []
    need: list[int] = []
    ends: list[float] = []
    pending = None
    start, context = t, lazy.since + n * s0
    for j in range(k):
        blocks = per_phase[(s0 + j) % bs]
        if blocks > room:
            break
        c = eng._lazy_cost(n, context)
        durs.append(c.seconds)
        flops.append(c.flops)
        read.append(c.bytes_read)
        need.append(blocks)
        if strict and t + c.seconds >= stop_at:
            pending = t + c.seconds
            break
        t += c.seconds
        ends.append(t)
        room -= blocks
        context += n
        if not strict and t >= stop_at:
            break
    return _account(eng, start, durs, flops, read, need, ends, pending)


def _stretch(eng: _Engine[R], t: float, stop_at: float, strict: bool) -> tuple[int, float | None, float]:
    """Up to the next answer to end, the steps' costs as arrays (the engine's :meth:`_decode_costs`,
    to the last bit its step's; a twin's jitter drawn ahead and rewound to the steps run), then
    their ends one by one: as :func:`_steps` says, for as many steps. Nothing where fewer than
    :data:`STRETCH` steps are foreseen (the steps then go one by one)."""
    lazy, n = eng._lazy, eng._lazy.n
    s0, last = lazy.steps, eng.last_iteration_s
    k = min(lazy.due[0][0] - s0 if lazy.due else MOST_STEPS, MOST_STEPS)
    if math.isfinite(stop_at) and last > 0:
        k = min(k, int((stop_at - t) / last * 1.5) + 8)
    if last <= 0 or stop_at - t < STRETCH * last or k < STRETCH:
        return 0, None, t
    steps = np.arange(s0, s0 + k, dtype=np.int64)
    need = np.asarray(lazy.per_phase, np.int64)[steps % lazy.block_size]
    over = np.flatnonzero(eng.used_blocks + np.cumsum(need) > eng.num_blocks)
    if over.size:
        k = int(over[0])  # that step preempts: the step path's
        if k < STRETCH:
            return 0, None, t
    secs, flops, read = eng._decode_costs(np.full(k, n, np.int64), lazy.since + n * steps[:k], None)
    if not np.all(secs > 0) or not np.all(np.isfinite(secs)):
        return 0, None, t
    mark = eng._jitter_mark()
    drawn = eng._jitter_draw(k)
    durs = secs.tolist() if drawn is None else [d * f for d, f in zip(secs.tolist(), drawn, strict=True)]
    ends, pending = _walk(durs, t, stop_at, strict)
    ran = len(ends) + (pending is not None)
    if drawn is not None and len(drawn) != ran:
        eng._jitter_rewind(mark, ran)
    return _account(eng, t, durs, flops.tolist(), read.tolist(), need.tolist(), ends, pending)


def _walk(durs: list[float], t: float, stop_at: float, strict: bool) -> tuple[list[float], float | None]:
    """The steps' ends from ``t``, up to the caller's next event: with ``strict`` the step that
    reaches it is left scheduled (its end the second value), else it is the last one run."""
    ends: list[float] = []
    for d in durs:
        if strict and t + d >= stop_at:
            return ends, t + d
        t += d
        ends.append(t)
        if not strict and t >= stop_at:
            break
    return ends, None


def _account(
    eng: _Engine[R],
    t: float,
    durs: list[float],
    flops: list[float],
    read: list[float],
    need: list[int],
    ends: list[float],
    pending: float | None,
) -> tuple[int, float | None, float]:
    """The steps that ended (``ends``) as :meth:`SimEngine.complete` counts them (their FLOPs, bytes
    and KV written, time busy, inter-token gaps, blocks taken; the step count and the step ends the
    lazy decodes' tokens are), and the one scheduled where ``pending`` as :meth:`SimEngine.step`
    leaves it; ``t`` the time they began at. Returns (steps that ended, ``pending``, the time)."""
    lazy, n, st = eng._lazy, eng._lazy.n, eng.stats
    done = len(ends)
    fl, rd, wr, busy = st.flops_per_gpu, st.read_bytes_per_gpu, st.write_bytes_per_gpu, eng.busy_s
    per_token = eng.kv_per_token / eng.cfg.tp
    prev = lazy.ends[-1]
    for j in range(done):
        fl += flops[j]
        rd += read[j]
        wr += per_token * n
        busy += durs[j]
        st.itl.observe_times(ends[j] - prev, n)
        prev = ends[j]
    st.flops_per_gpu, st.read_bytes_per_gpu, st.write_bytes_per_gpu = fl, rd, wr
    ran = done + (pending is not None)
    taken = sum(need[:ran])
    if taken:
        eng.used_blocks += taken
        eng.cache.evict_to(eng.num_blocks - eng.used_blocks)
    if pending is not None:
        busy += durs[done]
        eng._last_cost = IterationCost(durs[done], 0.0, 0.0, 0.0, read[done], flops[done])
        eng._step_lazy = n
        eng._pending = ([], [])
    else:
        eng._step_lazy = 0
    eng.busy_s = busy
    if ran:
        eng.last_iteration_s = durs[ran - 1]
    if done:
        lazy.ends.extend(ends)
        lazy.steps += done
    return done, pending, ends[-1] if ends else t
