"""Many decode steps at once: the engine's steps while nothing changes its batch but the answers
growing and ending, worked out as arrays instead of request by request (issue 73).

Between two events a server's batch only decodes: every running request adds one token a step,
its context grows by one, a new KV block is taken every ``block_size`` tokens, and a request
leaves when its answer ends. So the steps' sizes follow in closed form (the decodes of step ``j``
and their context: the requests whose answers have not ended by then, each ``j`` tokens longer),
their times from the cost model as one array (:meth:`~spoc_tui.sim.engine.SimEngine._decode_costs`),
the blocks each step takes from where each request's next block begins, and each request's tokens
are the steps' end times it was in. What the step-by-step path does per request per step is done
here per step (a float or two) or per request leaving (its finish, as the step path finishes it).

A run stops where the step path would do anything else: before a step that needs more KV blocks
than are free (a preemption), after the first answer that ends while requests wait for a seat (an
admission follows), and at the caller's next event (an arrival, a user's next turn, a poll). It
starts only from a batch of decodes alone: no request waiting that could be admitted, none in its
prefill, none aborted, none streamed token by token (``on_token``: the live server's), every decode
within the token budget. Its figures are the step path's, step for step (the same floats in the
same order: the same samples, the same random draws); only the histograms' sums may differ in
their last bits, being summed per step rather than per token.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

import numpy as np

from spoc_tui.core.hardware.capacity import (
    ALLREDUCE_LATENCY_S,
    COMPUTE_EFFICIENCY,
    ITERATION_OVERHEAD_S,
    MEM_EFFICIENCY,
    IterationCost,
)
from spoc_tui.core.hardware.presets import GpuSpec, ModelSpec


class _Request(Protocol):
    """What a run reads and writes of a request (:class:`~spoc_tui.sim.engine.SimRequest`)."""

    prompt: Sequence[int]
    target_tokens: int
    on_token: Callable[[int, float], None] | None
    times: list[float] | None
    computed: int
    generated: int
    blocks: int
    last_token: float | None
    finished: float | None


R = TypeVar("R", bound=_Request)


class _Flags(Protocol):
    @property
    def block_size(self) -> int: ...

    @property
    def max_num_seqs(self) -> int: ...

    @property
    def tp(self) -> int: ...


class _Cache(Protocol):
    def evict_to(self, capacity: int) -> None: ...


class _Hist(Protocol):
    def observe_many(self, values: np.ndarray, weights: np.ndarray | None = None) -> None: ...

    def observe_times(self, v: float, times: int) -> None: ...


class _Stats(Protocol):
    iterations: int
    generation_tokens: int
    flops_per_gpu: float
    read_bytes_per_gpu: float
    write_bytes_per_gpu: float

    @property
    def iteration_tokens(self) -> _Hist: ...

    @property
    def itl(self) -> _Hist: ...


class _Engine(Protocol[R]):
    """What a run reads and writes of its engine (:class:`~spoc_tui.sim.engine.SimEngine`; this
    module is below it, the engine's :meth:`decode_run` calls in)."""

    running: list[R]
    waiting: deque[R]
    budget: int
    max_len: int
    num_blocks: int
    used_blocks: int
    running_peak: int
    kv_per_token: float
    busy_s: float
    last_iteration_s: float
    clock: Callable[[], float]
    _abort_pending: bool
    _last_cost: IterationCost
    _pending: tuple[list[R], list[tuple[R, int]]]

    @property
    def cfg(self) -> _Flags: ...

    @property
    def cache(self) -> _Cache: ...

    @property
    def stats(self) -> _Stats: ...

    def _decode_costs(
        self, decodes: np.ndarray, contexts: np.ndarray, shared: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def _jitter_draw(self, n: int) -> list[float] | None: ...

    def _jitter_mark(self) -> object: ...

    def _jitter_rewind(self, mark: object, used: int) -> None: ...

    def _times_shared(self) -> bool: ...

    def _shared(self, decodes: list[R]) -> int: ...

    def _answered(self, req: R, now: float) -> None: ...

    def wake_all(self) -> None: ...


def roofline_decode_costs(
    model: ModelSpec,
    tp: int,
    decodes: np.ndarray,
    contexts: np.ndarray,
    weights_per_gpu: float,
    kv_per_token: float,
    gpu: GpuSpec,
    clock_ratio: float = 1.0,
    flops_scale: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`iteration_time` of many steps of decodes alone, as arrays: step ``j`` has
    ``decodes[j]`` decoding sequences holding ``contexts[j]`` tokens of context in all. The same
    operations in the same order, so each step's seconds, bytes read and FLOPs are
    :func:`iteration_time`'s to the last bit. Returns (seconds, FLOPs, bytes read) per step."""
    tokens = decodes.astype(np.int64)
    ctx = contexts.astype(np.int64)
    w_bytes: np.ndarray | float = weights_per_gpu
    if model.num_experts:
        # Python's power per distinct batch size, not NumPy's: its SIMD power (AVX-512) differs from
        # the C library's in the last bit for some sizes, and the steps must cost iteration_time's
        base = 1 - model.experts_per_token / model.num_experts
        sizes, at = np.unique(tokens, return_inverse=True)
        frac = 1 - np.array([base ** int(t) for t in sizes], float)[at]
        expert_bytes = weights_per_gpu * 0.95
        w_bytes = weights_per_gpu - expert_bytes + expert_bytes * frac
    kv_read = kv_per_token / tp * ctx
    bytes_read = w_bytes + kv_read
    attn_flops_per_ctx = 4 * model.num_layers * model.num_heads * model.head_dim
    flops = (2 * model.active_params * tokens + attn_flops_per_ctx * ctx) / tp
    mem_s = bytes_read / (gpu.mem_bw_bytes_s * MEM_EFFICIENCY)
    comp_s = flops / (gpu.bf16_flops * flops_scale * COMPUTE_EFFICIENCY)
    r = max(0.05, min(1.0, clock_ratio))
    kernel_s = np.maximum(mem_s / (0.6 + 0.4 * r), comp_s / r)
    comm_s: np.ndarray | float = 0.0
    if tp > 1:
        msg = tokens * model.hidden_size * 2
        comm_s = 2 * model.num_layers * (ALLREDUCE_LATENCY_S + msg * 2 * (tp - 1) / tp / gpu.interconnect_bytes_s)
    secs = kernel_s + comm_s + ITERATION_OVERHEAD_S / r
    return np.asarray(secs, float), np.asarray(flops, float), np.broadcast_to(np.asarray(bytes_read, float), secs.shape)


WORTH_STEPS = 4
"""A run is tried only where the next event is at least this many steps away: it costs about
what two steps of the step path cost per request (laying the batch out as arrays and back), so
shorter runs, where arrivals come every step or two, cost more than they save."""
MOST_STEPS = 4096
"""Steps one run works out at most (its arrays' length); a longer quiet spell is several runs."""


class Run:
    """What :func:`decode_run` did: ``steps`` completed (0: nothing, the step path goes on), and
    ``pending_end``: with ``strict``, the end of one more step it scheduled (its tokens delivered
    by :meth:`SimEngine.complete`, as a step from :meth:`SimEngine.step` is), else None."""

    __slots__ = ("pending_end", "steps")

    def __init__(self, steps: int, pending_end: float | None = None) -> None:
        self.steps = steps
        self.pending_end = pending_end


NOTHING = Run(0)


def _eligible(eng: _Engine[R]) -> bool:
    run = eng.running
    n = len(run)
    if not n or eng._abort_pending or n > eng.budget:
        return False
    if eng.waiting and n < eng.cfg.max_num_seqs:
        return False  # a seat is free: the next step may admit
    newest = run[-1]  # the one most likely still in its prefill
    if newest.computed != len(newest.prompt) + newest.generated - 1:
        return False
    for r in run:
        if r.on_token is not None or r.times is None or r.computed != len(r.prompt) + r.generated - 1:
            return False
    return True


def decode_run(
    eng: _Engine[R],
    until: float,
    horizon: Callable[[], float],
    clock_to: Callable[[float], None],
    *,
    strict: bool = False,
) -> Run:
    """Run ``eng``'s decode steps from its clock's now on, while nothing but the answers changes.

    Args:
        until: stop after the step that ends at or past it (the caller's ``advance(until)``).
        horizon: the caller's next event (math.inf for none), asked again after each answer ends
            (its ``on_finish`` may bring the next turn nearer).
        clock_to: sets the caller's clock (the engine's ``clock``) to a step's end, before the
            answers that end there are finished.
        strict: the caller delivers its events at their times, mid-step (a fleet's event loop):
            only steps that end before the next event are completed here; the one across it is
            scheduled and left for :meth:`SimEngine.complete` (``Run.pending_end``). Else the caller
            reads its events between steps (:meth:`VirtualServer.advance`): the step that reaches
            ``horizon`` or ``until`` is the last completed.
    """
    ahead = min(until, horizon()) - eng.clock()
    if ahead < WORTH_STEPS * eng.last_iteration_s:
        return NOTHING
    eng.wake_all()  # the lazy decodes' fields as the step path has them (sim/lazy.py)
    if not _eligible(eng):
        return NOTHING
    running = list(eng.running)
    n = len(running)
    bs = eng.cfg.block_size
    c = np.fromiter((r.computed for r in running), np.int64, n)
    g = np.fromiter((r.generated for r in running), np.int64, n)
    p = c - g + 1
    tgt = np.fromiter((r.target_tokens for r in running), np.int64, n)
    b = np.fromiter((r.blocks for r in running), np.int64, n)
    # f: the steps each answer has left, its last included (it ends at step f - 1)
    f = np.minimum(tgt - g, eng.max_len - p - g)
    if f.min() < 1:
        return NOTHING
    k = min(MOST_STEPS, int(f.max()))
    if math.isfinite(ahead) and eng.last_iteration_s > 0:  # about as many steps as reach the next event
        k = min(k, int(ahead / eng.last_iteration_s * 1.5) + 8)
    if eng.waiting:
        k = min(k, int(f.min()))  # seats full: the first answer to end lets a waiting request in
    # KV blocks: request i takes its next block at step s_i, then every bs steps, while it runs
    start = np.maximum(b * bs - c, 0)
    span = np.minimum(f, k)
    takes = np.maximum(0, -(-(span - start) // bs))
    alloc = np.zeros(k + 1, np.int64)
    total = int(takes.sum())
    if total:
        first = np.cumsum(takes) - takes
        at = np.repeat(start, takes) + bs * (np.arange(total) - np.repeat(first, takes))
        alloc[:k] = np.bincount(at, minlength=k)[:k]
    ends = f <= k
    freed = np.zeros(k + 1, np.int64)
    if ends.any():
        freed[:k] = np.bincount(f[ends] - 1, weights=(b + takes)[ends], minlength=k)[:k].astype(np.int64)
    used_before = np.cumsum(freed) - freed  # freed by the steps before
    used = eng.used_blocks + np.cumsum(alloc)[:k] - used_before[:k]
    over = np.flatnonzero(used > eng.num_blocks)
    if over.size:
        k = int(over[0])  # that step preempts: the step path's
    if k < 1:
        return NOTHING
    # the steps' decodes and their context: those not ended before step j, each j tokens on
    order = np.argsort(f, kind="stable")
    f_sorted = f[order]
    c_done = np.concatenate(([0], np.cumsum(c[order])))
    steps = np.arange(k)
    gone = np.searchsorted(f_sorted, steps, side="right")
    decodes = n - gone
    ctx = (int(c.sum()) - c_done[gone]) + steps * decodes
    shared = np.full(k, eng._shared(running), np.int64) if eng._times_shared() else None
    secs, flops, read = eng._decode_costs(decodes, ctx, shared)
    if not np.all(secs > 0) or not np.all(np.isfinite(secs)):
        return NOTHING  # a model that times a step at nothing: the step path's own handling
    eng.running_peak = max(eng.running_peak, n)  # as each step's schedule counts it
    batch = _Batch(running, c, g, b, f, takes, start, used, decodes, ctx, secs, flops, read)
    return _walk(eng, batch, k, until, horizon, clock_to, strict)


class _Batch(Generic[R]):
    """The run's requests (in the batch's order) and their arrays, and its steps' arrays."""

    def __init__(self, running: list[R], *arrays: np.ndarray) -> None:
        self.running = running
        c, g, b, f, takes, start, used, decodes, ctx, secs, flops, read = arrays
        self.c, self.g, self.b, self.f, self.takes, self.start = c, g, b, f, takes, start
        self.used, self.decodes, self.ctx, self.secs, self.flops, self.read = used, decodes, ctx, secs, flops, read
        self.last0 = [r.last_token for r in running]


def _walk(
    eng: _Engine[R],
    batch: _Batch[R],
    k: int,
    until: float,
    horizon: Callable[[], float],
    clock_to: Callable[[float], None],
    strict: bool,
) -> Run:
    """The steps one by one in time (a float each, and the jitter's draw where the engine has one),
    the answers that end finished at their step, stopping at the caller's next event."""
    ending: dict[int, list[int]] = {}
    for i in np.flatnonzero(batch.f <= k).tolist():
        ending.setdefault(int(batch.f[i]) - 1, []).append(i)
    t = eng.clock()
    busy = eng.busy_s
    times: list[float] = []
    durs = batch.secs.tolist()
    shared = eng._times_shared()
    ends = iter(sorted(ending)[1:])
    stop_at = min(until, horizon())
    pending: float | None = None
    done = 0
    mark = eng._jitter_mark()
    factors = _Factors(eng, durs, t, stop_at, k)
    drawn = factors.drawn
    for j in range(k):
        d = durs[j]
        if drawn is not None:
            if j >= len(drawn):
                drawn = factors.more()
            d *= drawn[j]
        end = t + d
        busy += d
        eng.last_iteration_s = d
        if strict and end >= stop_at:
            pending = end
            eng._last_cost = IterationCost(d, 0.0, 0.0, 0.0, float(batch.read[j]), float(batch.flops[j]))
            break
        t = end
        times.append(t)
        done = j + 1
        if j in ending:
            _finish_at(eng, batch, ending[j], j, times, clock_to)
            stop_at = min(until, horizon())
            if shared and not _reshared(eng, batch, durs, j + 1, min(k, next(ends, k) + 1)):
                break
            if eng.waiting and len(eng.running) < eng.cfg.max_num_seqs:
                break  # a seat came free for a request waiting: the step path admits it
        if not strict and t >= stop_at:
            break
    factors.settle(mark, done + (pending is not None))
    eng.busy_s = busy
    _settle(eng, batch, done, pending is not None, times)
    _count(eng, batch, done, times)
    if done:
        clock_to(times[-1])
    if pending is not None:
        eng._pending = ([r for r in batch.running if r.finished is None], [])
        eng.used_blocks = int(batch.used[done])
        eng.cache.evict_to(eng.num_blocks - eng.used_blocks)
    return Run(done, pending)


class _Factors:
    """A run's jitter factors (a twin's), drawn ahead in bulk for about as many steps as it will
    run, more as it needs; at its end the generator goes back to where it began and on by exactly
    the draws of the steps run, so the twin's random stream stands where the step path leaves it."""

    def __init__(self, eng: _Engine[R], durs: list[float], t: float, stop_at: float, k: int) -> None:
        self.eng = eng
        ahead = int(np.searchsorted(np.cumsum(durs), stop_at - t)) + 2 if math.isfinite(stop_at) else k
        self.drawn = eng._jitter_draw(min(k, ahead + ahead // 4 + 2))

    def more(self) -> list[float]:
        """Half as many factors again (at least 16), for a run longer than foreseen."""
        more = self.eng._jitter_draw(max(16, len(self.drawn or ()) // 2))
        assert more is not None and self.drawn is not None
        self.drawn += more
        return self.drawn

    def settle(self, mark: object, used: int) -> None:
        if self.drawn is not None and len(self.drawn) != used:
            self.eng._jitter_rewind(mark, used)


def _reshared(eng: _Engine[R], batch: _Batch[R], durs: list[float], j0: int, j1: int) -> bool:
    """A twin's steps ``j0`` to ``j1`` timed again with the context the decodes still running
    share (it changes only when one leaves; the engine's count of it follows them, as at each step
    of the step path). False where the model then times a step at nothing (the run stops)."""
    if j1 <= j0:
        return True
    shared = np.full(j1 - j0, eng._shared(list(eng.running)), np.int64)
    secs = eng._decode_costs(batch.decodes[j0:j1], batch.ctx[j0:j1], shared)[0]
    if not np.all(secs > 0) or not np.all(np.isfinite(secs)):
        return False
    durs[j0:j1] = secs.tolist()
    return True


def _finish_at(
    eng: _Engine[R], batch: _Batch[R], idx: list[int], j: int, times: list[float], clock_to: Callable[[float], None]
) -> None:
    """The answers that end at step ``j``, finished as the step path finishes them: the blocks of
    every decode of the step taken, then each ending request freed in the batch's order."""
    now = times[j]
    clock_to(now)
    eng.used_blocks = int(batch.used[j])
    eng.cache.evict_to(eng.num_blocks - eng.used_blocks)
    for i in idx:
        r = batch.running[i]
        r.computed = int(batch.c[i]) + j + 1
        r.generated = int(batch.g[i]) + j + 1
        r.blocks = int(batch.b[i] + batch.takes[i])
        r.last_token = now
        assert r.times is not None
        r.times.extend(times)
        eng._answered(r, now)


def _settle(eng: _Engine[R], batch: _Batch[R], done: int, pending: bool, times: list[float]) -> None:
    """The requests still running after ``done`` steps: their tokens, lengths and blocks (those of
    the pending step taken too), and the engine's blocks in use."""
    bs = eng.cfg.block_size
    upto = done + 1 if pending else done
    for i, r in enumerate(batch.running):
        if batch.f[i] <= done:
            continue
        r.computed = int(batch.c[i]) + done
        r.generated = int(batch.g[i]) + done
        if done:
            r.last_token = times[-1]
            assert r.times is not None
            r.times.extend(times)
        r.blocks = int(batch.b[i]) + max(0, -(-(upto - int(batch.start[i])) // bs))
    if not pending and done:
        eng.used_blocks = sum(r.blocks for r in eng.running)
        eng.cache.evict_to(eng.num_blocks - eng.used_blocks)


def _count(eng: _Engine[R], batch: _Batch[R], done: int, times: list[float]) -> None:
    """The engine's counters for ``done`` steps, as :meth:`SimEngine.complete` counts them."""
    if not done:
        return
    st = eng.stats
    n = batch.decodes[:done]
    st.iterations += done
    st.generation_tokens += int(n.sum())
    st.iteration_tokens.observe_many(n.astype(float))
    per_token = eng.kv_per_token / eng.cfg.tp
    fl, rd, wr = st.flops_per_gpu, st.read_bytes_per_gpu, st.write_bytes_per_gpu
    for x, y, m in zip(batch.flops[:done].tolist(), batch.read[:done].tolist(), n.tolist(), strict=True):
        fl += x
        rd += y
        wr += per_token * m
    st.flops_per_gpu, st.read_bytes_per_gpu, st.write_bytes_per_gpu = fl, rd, wr
    # the inter-token gaps: each request's first from its last token before the run, then each
    # step's for every decode in it
    t0 = times[0]
    first = [t0 - x for x in batch.last0 if x is not None]
    if first:
        st.itl.observe_many(np.asarray(first))
    if done > 1:
        st.itl.observe_many(np.diff(np.asarray(times)), n[1:].astype(float))
