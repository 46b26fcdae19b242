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
    st, bs, per_phase, due = eng.stats, eng.cfg.block_size, lazy.per_phase, lazy.due
    stop_at = min(until, horizon())
    t, done, pending = eng.clock(), 0, None
    if eng.last_iteration_s > 0 and stop_at - t >= STRETCH * eng.last_iteration_s:
        done, pending, t = _stretch(eng, t, stop_at, strict)
        if pending is not None:
            return _ran(eng, n, done, pending, t, clock_to)
        if done and due and due[0][0] <= lazy.steps and (ended := lazy.ending()):
            clock_to(t)
            for r in ended:
                eng._answered(r, t)
            return _ran(eng, n, done, None, t, clock_to)
        if not strict and t >= stop_at:
            return _ran(eng, n, done, None, t, clock_to)
    busy = eng.busy_s
    fl, rd, wr, per_token = (
        st.flops_per_gpu,
        st.read_bytes_per_gpu,
        st.write_bytes_per_gpu,
        eng.kv_per_token / eng.cfg.tp,
    )
    while True:
        need = per_phase[lazy.steps % bs]
        if eng.used_blocks + need > eng.num_blocks:
            break  # the step path preempts
        eng._step_lazy = n
        c = eng._last_cost = eng._cost([], [])
        d = eng.last_iteration_s = c.seconds
        busy += d
        if need:
            eng.used_blocks += need
            eng.cache.evict_to(eng.num_blocks - eng.used_blocks)
        if strict and t + d >= stop_at:  # scheduled, its end the caller's event (step() leaves it so)
            eng._pending = ([], [])
            pending = t + d
            break
        eng._step_lazy = 0
        t += d
        fl += c.flops
        rd += c.bytes_read
        wr += per_token * n
        st.itl.observe_times(t - lazy.ends[-1], n)
        lazy.tick(t)
        done += 1
        if due and due[0][0] <= lazy.steps and (ended := lazy.ending()):
            clock_to(t)
            for r in ended:
                eng._answered(r, t)
            break
        if not strict and t >= stop_at:
            break
    st.flops_per_gpu, st.read_bytes_per_gpu, st.write_bytes_per_gpu = fl, rd, wr
    eng.busy_s = busy
    return _ran(eng, n, done, pending, t, clock_to)


def _ran(eng: _Engine[R], n: int, done: int, pending: float | None, t: float, clock_to: Callable[[float], None]) -> Run:
    """The counters of ``done`` steps of ``n`` lazy decodes (as :meth:`SimEngine.complete` counts them)."""
    if done:
        st = eng.stats
        st.iterations += done
        st.generation_tokens += n * done
        st.iteration_tokens.observe_times(float(n), done)
        clock_to(t)
    return Run(done, pending)


def _stretch(eng: _Engine[R], t: float, stop_at: float, strict: bool) -> tuple[int, float | None, float]:
    """Up to the next answer to end, the steps' costs as arrays (the engine's :meth:`_decode_costs`,
    to the last bit its step's; a twin's jitter drawn ahead and rewound to the steps run), then
    their ends one by one: (steps done, the end of one more left scheduled with ``strict``, the
    time). Nothing where fewer than :data:`STRETCH` steps are foreseen; the step loop goes on."""
    lazy, n = eng._lazy, eng._lazy.n
    s0 = lazy.steps
    k = min(lazy.due[0][0] - s0 if lazy.due else MOST_STEPS, MOST_STEPS)
    if math.isfinite(stop_at):
        k = min(k, int((stop_at - t) / eng.last_iteration_s * 1.5) + 8)
    steps = np.arange(s0, s0 + max(0, k), dtype=np.int64)
    need = np.asarray(lazy.per_phase, np.int64)[steps % lazy.block_size]
    used = eng.used_blocks + np.cumsum(need)
    over = np.flatnonzero(used > eng.num_blocks)
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
    ends: list[float] = []
    pending = None
    for d in durs:
        if strict and t + d >= stop_at:
            pending = t + d
            break
        t += d
        ends.append(t)
        if not strict and t >= stop_at:
            break
    done = len(ends)
    ran = done + (pending is not None)
    if drawn is not None and len(drawn) != ran:
        eng._jitter_rewind(mark, ran)
    st = eng.stats
    fl, rd, wr, busy = st.flops_per_gpu, st.read_bytes_per_gpu, st.write_bytes_per_gpu, eng.busy_s
    per_token = eng.kv_per_token / eng.cfg.tp
    for x, y, d in zip(flops[:done].tolist(), read[:done].tolist(), durs, strict=False):
        fl += x
        rd += y
        wr += per_token * n
        busy += d
    if done:
        prev = lazy.ends[-1]
        gaps = np.diff(np.asarray([prev, *ends]))
        st.itl.observe_many(gaps, np.full(done, float(n)))
        lazy.ends.extend(ends)
        lazy.steps += done
        eng.last_iteration_s = durs[done - 1]
    taken = int(need[:ran].sum())
    if taken:
        eng.used_blocks += taken
        eng.cache.evict_to(eng.num_blocks - eng.used_blocks)
    if pending is not None:
        d = durs[done]
        busy += d
        eng.last_iteration_s = d
        eng._last_cost = IterationCost(d, 0.0, 0.0, 0.0, float(read[done]), float(flops[done]))
        eng._step_lazy = n
        eng._pending = ([], [])
    st.flops_per_gpu, st.read_bytes_per_gpu, st.write_bytes_per_gpu = fl, rd, wr
    eng.busy_s = busy
    return done, pending, t
