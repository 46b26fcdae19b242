"""A one-replica trace replay on a twin, compiled (issue 73): :class:`~spoc_tui.twin.fleet.FleetSim`'s
event loop and :class:`~spoc_tui.twin.engine.TwinEngine`'s engine (vLLM's scheduler, the paged KV
cache with its LRU prefix cache, preemption, the calibrated step time and its jitter) over arrays
of machine ints and floats in numba's compiled code; the decode steps between two events taken at
once where no request joins or ends (:func:`_decode_run`). The same run as the Python one, event
for event and float for float: the same scheduler decisions in the same order, each step's time
summed term by term as :meth:`StepModel.step_s` sums it, the jitter drawn from the engine's own
Mersenne Twister (its state handed over) as ``random.gauss`` draws it, the same LRU entries
(``tests/unit/test_replay_kernel.py`` compares the two, sample for sample).

Its state is arrays held by :class:`~spoc_tui.twin.fastreplay.CompiledReplay` between calls, so a
replay cut at any time (:meth:`FleetSim.run_until`) goes on where it stopped. numba compiles it on
first use and keeps the machine code for the next process (:func:`~spoc_tui.twin.fastreplay.kernel`).
The arrays' layout, the Mersenne Twister, the event heap and the LRU: :mod:`~spoc_tui.twin.replaycore`.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from spoc_tui.twin.replaycore import (
    A0,
    A_PROMPT,
    ABORT,
    ADD,
    B0,
    B_ATTN,
    B_CONTEXT,
    B_DECODE,
    B_MIXED,
    B_PREFILL,
    BLOCKS,
    BS,
    BUDGET,
    BUSY,
    CACHED,
    CACHING,
    CHUNKED,
    COMPUTED,
    FAILED,
    FIN_N,
    FINISHED,
    GEN_TOKENS,
    GENERATED,
    GROUP,
    HASHED,
    HEAP_N,
    HELD,
    HLEN,
    ITERATIONS,
    KLEN,
    KOFF,
    LAST_STEP,
    LENGTH,
    LRU,
    MAX_LEN,
    MAX_SEQS,
    MOVING,
    MU,
    NEED_POLLS,
    NKEYS,
    NOW,
    NTIMES,
    NUM_BLOCKS,
    OUTRAW,
    OVER,
    OWN,
    PEAK,
    PEND_ND,
    PEND_NP,
    PLEN,
    POLL,
    POLL_N,
    POLL_S,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    RAN_OUT,
    REASON,
    REL_N,
    RIDGE,
    RIDGE_MOVES,
    ROW,
    RUN_N,
    S_DISTINCT,
    S_LEN,
    S_STAMP,
    S_TOTAL,
    SCOUNTED,
    SEND,
    SHARED,
    SHARED_CUT,
    SHARING,
    SIGMA,
    SKIPPED,
    SSTAMP,
    STALLED,
    START,
    STEP,
    STEPPING,
    STOP,
    TARGET,
    THINK,
    TOFF,
    TOO_BIG,
    USED,
    WQ_HEAD,
    WQ_LEN,
    Family,
    Heap,
    Run,
    Sharing,
    _append,
    _evict_to,
    _gauss,
    _insert,
    _pop,
    _push,
    _unlink,
)


# -- the engine --------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _blocks_for(tokens: int, bs: int) -> int:
    return -(-tokens // bs)


@njit(cache=True, nogil=True)
def _unshare(req_i: np.ndarray, keys: np.ndarray, live: np.ndarray, i: int) -> None:
    k0 = req_i[i, KOFF]
    for j in range(req_i[i, SHARED] if req_i[i, HASHED] else 0):
        h = keys[k0 + j]
        live[h] = live[h] - 1 if live[h] > 1 else 0
    req_i[i, SHARED] = 0


@njit(cache=True, nogil=True)
def _share(req_i: np.ndarray, keys: np.ndarray, live: np.ndarray, i: int, bs: int) -> None:
    if not req_i[i, HASHED]:
        return
    full = min(req_i[i, HLEN], req_i[i, COMPUTED] // bs)
    k0 = req_i[i, KOFF]
    for j in range(req_i[i, SHARED], full):
        live[keys[k0 + j]] += 1
    req_i[i, SHARED] = max(req_i[i, SHARED], full)


@njit(cache=True, nogil=True)
def _grow(cfg_i: np.ndarray, st_i: np.ndarray, req_i: np.ndarray, lru: LRU, i: int, new_len: int) -> bool:
    need = _blocks_for(new_len, cfg_i[BS]) - req_i[i, BLOCKS]
    if need <= 0:
        return True
    if st_i[USED] + need > cfg_i[NUM_BLOCKS]:
        return False
    st_i[USED] += need
    req_i[i, BLOCKS] += need
    prev, nxt, inlru, count = lru
    _evict_to(st_i, prev, nxt, inlru, count, cfg_i[NKEYS], cfg_i[NUM_BLOCKS] - st_i[USED])
    return True


@njit(cache=True, nogil=True)
def _finish(cfg_i: np.ndarray, st_i: np.ndarray, st_f: np.ndarray, req_i: np.ndarray, req_f: np.ndarray,
        keys: np.ndarray, live: np.ndarray, lru: LRU, fin: np.ndarray, i: int, reason: int) -> None:  # fmt: skip
    """A request out (finished at the clock's now): its blocks freed and offered to the prefix
    cache (SimEngine._finish, _free), noted for its sample (FleetSim's on_finish)."""
    now = st_f[NOW]
    req_f[i, FINISHED] = now
    req_i[i, REASON] = reason
    _unshare(req_i, keys, live, i)
    st_i[USED] -= req_i[i, BLOCKS]
    prev, nxt, inlru, count = lru
    nkeys = cfg_i[NKEYS]
    if reason != ABORT and cfg_i[CACHING]:
        m = req_i[i, HLEN] if req_i[i, HASHED] else 0
        n = req_i[i, COMPUTED] // cfg_i[BS]
        own = req_i[i, OWN]
        if own >= 0 and own <= m:
            cut = min(own, n)
        else:
            cut = n  # the prompt's keys then the answer's (worked out ahead, as far as it can reach)
            if n > req_i[i, KLEN]:
                st_i[OVER] = -1
                cut = req_i[i, KLEN]
        k0 = req_i[i, KOFF]
        _insert(st_i, prev, nxt, inlru, count, nkeys, keys, k0, k0 + cut, n - cut)
    req_i[i, BLOCKS] = 0
    _evict_to(st_i, prev, nxt, inlru, count, nkeys, cfg_i[NUM_BLOCKS] - st_i[USED])
    req_i[i, HASHED] = 0
    fin[st_i[FIN_N]] = i
    st_i[FIN_N] += 1


@njit(cache=True, nogil=True)
def _remove_running(st_i: np.ndarray, running: np.ndarray, i: int) -> None:
    n = st_i[RUN_N]
    at = 0
    while running[at] != i:
        at += 1
    for j in range(at, n - 1):
        running[j] = running[j + 1]
    st_i[RUN_N] = n - 1


@njit(cache=True, nogil=True)
def _decode_seconds(cfg_f: np.ndarray, nd: int, ctx_sum: int) -> float:
    """StepModel.decode_step_s: a step of ``nd`` decodes alone holding ``ctx_sum`` tokens."""
    return float(
        0.0
        + cfg_f[B0] * 1.0
        + cfg_f[B_PREFILL] * 0.0
        + cfg_f[B_ATTN] * 0.0
        + cfg_f[B_DECODE] * float(nd)
        + cfg_f[B_CONTEXT] * (ctx_sum / 1e3)
        + cfg_f[B_MIXED] * 0.0
    )


@njit(cache=True, nogil=True)
def _step_seconds(
    cfg_f: np.ndarray, cfg_i: np.ndarray, nd: int, ctx_sum: int, pend: np.ndarray, np_: int, req_i: np.ndarray
) -> float:
    """StepModel.step_s of the step: its decodes (``nd``, holding ``ctx_sum`` tokens) and prefill
    chunks (``pend[j] = (request, tokens)``, each at its request's computed tokens), term by term."""
    if nd == 0 and np_ == 0:
        return 0.0
    if np_ == 0:
        return _decode_seconds(cfg_f, nd, ctx_sum)
    ridge = cfg_f[RIDGE]
    if cfg_i[RIDGE_MOVES]:
        ridge = cfg_f[RIDGE] + cfg_f[B_CONTEXT] * (ctx_sum / 1e3) / cfg_f[B_PREFILL]
    n_p = 0
    attn = 0.0
    for j in range(np_):
        n = pend[j, 1]
        n_p += n
        attn = attn + n * (req_i[pend[j, 0], COMPUTED] + n / 2)
    attn = attn / 1e6
    inner = ridge - nd
    inner = inner if inner > 0.0 else 0.0
    past = n_p - inner
    past = past if past > 0.0 else 0.0
    mixed = 1.0 if nd > 0 else 0.0
    return float(
        0.0
        + cfg_f[B0] * 1.0
        + cfg_f[B_PREFILL] * past
        + cfg_f[B_ATTN] * attn
        + cfg_f[B_DECODE] * float(nd)
        + cfg_f[B_CONTEXT] * (ctx_sum / 1e3)
        + cfg_f[B_MIXED] * mixed
    )


@njit(cache=True, nogil=True)
def _match(st_i: np.ndarray, req_i: np.ndarray, keys: np.ndarray, live: np.ndarray, lru: LRU, r: int, bs: int) -> int:
    """Tokens of the request's prompt the prefix cache holds, or running requests computed
    (PrefixCache.match): its keys, less the last token's block, in order up to the first not held."""
    prev, nxt, inlru, _ = lru
    req_i[r, HASHED] = 1
    usable = min(req_i[r, HLEN], max(0, (req_i[r, PLEN] - 1) // bs))
    k0 = req_i[r, KOFF]
    hit = 0
    for j in range(usable):
        h = keys[k0 + j]
        if inlru[h]:
            _unlink(st_i, prev, nxt, h)
            _append(st_i, prev, nxt, h)
        elif live[h] == 0:
            break
        hit += bs
    return hit


@njit(cache=True, nogil=True)
def _admit(cfg_i: np.ndarray, st_i: np.ndarray, st_f: np.ndarray, req_i: np.ndarray, req_f: np.ndarray,
        keys: np.ndarray, live: np.ndarray, lru: LRU, running: np.ndarray, wq: np.ndarray, pend_p: np.ndarray,
        fin: np.ndarray, budget: int, npf: int) -> int:  # fmt: skip
    """SimEngine.schedule's second part: new requests in arrival order while seats, the token
    budget and blocks last (those that can never run refused). Returns the prefill chunks now."""
    bs = cfg_i[BS]
    chunked = cfg_i[CHUNKED]
    cap = wq.shape[0]
    while st_i[WQ_LEN] > 0 and budget > 0 and st_i[RUN_N] < cfg_i[MAX_SEQS]:
        r = wq[st_i[WQ_HEAD]]
        plen = req_i[r, PLEN]
        target = plen + req_i[r, GENERATED]
        if target > cfg_i[MAX_LEN] or _blocks_for(plen + req_i[r, TARGET], bs) > cfg_i[NUM_BLOCKS]:
            st_i[WQ_HEAD] = (st_i[WQ_HEAD] + 1) % cap
            st_i[WQ_LEN] -= 1
            _finish(cfg_i, st_i, st_f, req_i, req_f, keys, live, lru, fin, r, ABORT)
            continue
        hit = _match(st_i, req_i, keys, live, lru, r, bs) if cfg_i[CACHING] and req_i[r, COMPUTED] == 0 else 0
        base = req_i[r, COMPUTED] if req_i[r, COMPUTED] != 0 else hit
        remaining = target - base
        chunk = min(remaining, budget) if chunked else remaining
        if chunk > budget:
            break
        if not _grow(cfg_i, st_i, req_i, lru, r, base + chunk):
            break
        st_i[WQ_HEAD] = (st_i[WQ_HEAD] + 1) % cap
        st_i[WQ_LEN] -= 1
        if req_i[r, COMPUTED] == 0:
            req_i[r, COMPUTED] = hit
            req_i[r, CACHED] = hit
            st_i[PREFIX_QUERIES] += plen
            st_i[PREFIX_HITS] += hit
        running[st_i[RUN_N]] = r
        st_i[RUN_N] += 1
        budget -= chunk
        pend_p[npf, 0] = r
        pend_p[npf, 1] = chunk
        npf += 1
    return npf


@njit(cache=True, nogil=True)
def _schedule(cfg_i: np.ndarray, st_i: np.ndarray, st_f: np.ndarray, req_i: np.ndarray, req_f: np.ndarray,
        keys: np.ndarray, live: np.ndarray, lru: LRU, running: np.ndarray, wq: np.ndarray, pend_d: np.ndarray,
        pend_p: np.ndarray, fin: np.ndarray) -> None:  # fmt: skip
    """SimEngine.schedule on the step path: the running requests' decodes and prefill chunks,
    preempting the last admitted where blocks run out, then new requests in arrival order."""
    budget = cfg_i[BUDGET]
    bs = cfg_i[BS]
    chunked = cfg_i[CHUNKED]
    nd = 0
    npf = 0
    cap = wq.shape[0]
    i = 0
    while i < st_i[RUN_N] and budget > 0:
        r = running[i]
        plen = req_i[r, PLEN]
        target = plen + req_i[r, GENERATED]
        remaining = target - req_i[r, COMPUTED]
        if remaining <= 1 and req_i[r, COMPUTED] >= plen and req_i[r, COMPUTED] < req_i[r, BLOCKS] * bs:
            budget -= 1
            pend_d[nd] = r
            nd += 1
            i += 1
            continue
        if remaining <= 0:
            remaining = 1
        chunk = min(remaining, budget) if chunked else remaining
        if chunk > budget:
            i += 1
            continue
        gone = False
        while not _grow(cfg_i, st_i, req_i, lru, r, req_i[r, COMPUTED] + chunk):
            if st_i[RUN_N] == 0:
                gone = True
                break
            victim = running[st_i[RUN_N] - 1]  # the last admitted out, back to the queue's head
            st_i[RUN_N] -= 1
            _unshare(req_i, keys, live, victim)
            st_i[USED] -= req_i[victim, BLOCKS]
            req_i[victim, BLOCKS] = 0
            req_i[victim, COMPUTED] = 0
            st_i[PREEMPTIONS] += 1
            st_i[WQ_HEAD] = (st_i[WQ_HEAD] - 1) % cap
            wq[st_i[WQ_HEAD]] = victim
            st_i[WQ_LEN] += 1
            if victim == r:
                gone = True
                break
        if gone:
            continue
        if _blocks_for(req_i[r, COMPUTED] + chunk, bs) > req_i[r, BLOCKS]:
            i += 1
            continue
        budget -= chunk
        if remaining == 1 and req_i[r, COMPUTED] >= plen:
            pend_d[nd] = r
            nd += 1
        else:
            pend_p[npf, 0] = r
            pend_p[npf, 1] = chunk
            npf += 1
        i += 1
    npf = _admit(cfg_i, st_i, st_f, req_i, req_f, keys, live, lru, running, wq, pend_p, fin, budget, npf)
    if st_i[RUN_N] > st_i[PEAK]:
        st_i[PEAK] = st_i[RUN_N]
    st_i[PEND_ND] = nd
    st_i[PEND_NP] = npf


@njit(cache=True, nogil=True)
def _complete(cfg_i: np.ndarray, st_i: np.ndarray, st_f: np.ndarray, req_i: np.ndarray, req_f: np.ndarray,
        keys: np.ndarray, live: np.ndarray, lru: LRU, running: np.ndarray, pend_d: np.ndarray,
        pend_p: np.ndarray, emitted: np.ndarray, times: np.ndarray, fin: np.ndarray) -> None:  # fmt: skip
    """SimEngine.complete of the step scheduled: its tokens out at now, answers ended."""
    now = st_f[NOW]
    st_i[ITERATIONS] += 1
    ne = 0
    for j in range(st_i[PEND_ND]):
        r = pend_d[j]
        req_i[r, COMPUTED] += 1
        emitted[ne] = r
        ne += 1
    for j in range(st_i[PEND_NP]):
        r = pend_p[j, 0]
        req_i[r, COMPUTED] += pend_p[j, 1]
        if cfg_i[CACHING]:
            _share(req_i, keys, live, r, cfg_i[BS])
        if req_i[r, COMPUTED] >= req_i[r, PLEN] + req_i[r, GENERATED]:
            emitted[ne] = r
            ne += 1
    st_i[GEN_TOKENS] += ne
    max_len = cfg_i[MAX_LEN]
    for j in range(ne):
        r = emitted[j]
        req_i[r, GENERATED] += 1
        g = req_i[r, GENERATED]
        if req_i[r, NTIMES] == 0:  # its first token: its prompt counted, as vLLM counts it then
            st_i[PROMPT_TOKENS] += req_i[r, PLEN]
        times[req_i[r, TOFF] + req_i[r, NTIMES]] = now
        req_i[r, NTIMES] += 1
        if g >= req_i[r, TARGET] or req_i[r, PLEN] + g >= max_len:
            _remove_running(st_i, running, r)
            cut = g >= req_i[r, TARGET] or req_i[r, PLEN] + g >= max_len
            _finish(cfg_i, st_i, st_f, req_i, req_f, keys, live, lru, fin, r, LENGTH if cut else STOP)
    st_i[PEND_ND] = 0
    st_i[PEND_NP] = 0


@njit(cache=True, nogil=True)
def _count_keys(st_i: np.ndarray, scount: np.ndarray, keys: np.ndarray, k0: int, k1: int, by: int) -> None:
    for j in range(k0, k1):
        h = keys[j]
        if by > 0 and scount[h] == 0:
            st_i[S_DISTINCT] += 1
        scount[h] += by
        if by < 0 and scount[h] == 0:
            st_i[S_DISTINCT] -= 1
    st_i[S_TOTAL] += by * (k1 - k0)


@njit(cache=True, nogil=True)
def _shared(cfg_i: np.ndarray, st_i: np.ndarray, req_i: np.ndarray, keys: np.ndarray, pend_d: np.ndarray,
        nd: int, sharing: Sharing) -> int:  # fmt: skip
    """SharedBlocks.step of the step's decodes: blocks of their prompts' leading full blocks (as
    far as computed) that another decode of the step holds too, each read once more. Kept as the
    decodes come and go: a decode's count changes by its new blocks, one no longer decoding is
    taken out."""
    scount, slist = sharing
    bs = cfg_i[BS]
    st_i[S_STAMP] += 1
    stamp = st_i[S_STAMP]
    for j in range(nd):
        r = pend_d[j]
        n = min(req_i[r, HLEN], req_i[r, COMPUTED] // bs) if req_i[r, HASHED] else 0
        old = req_i[r, SCOUNTED]
        if old < 0:
            old = 0
            slist[st_i[S_LEN]] = r
            st_i[S_LEN] += 1
        k0 = req_i[r, KOFF]
        if n > old:
            _count_keys(st_i, scount, keys, k0 + old, k0 + n, 1)
        elif n < old:
            _count_keys(st_i, scount, keys, k0 + n, k0 + old, -1)
        req_i[r, SCOUNTED] = n
        req_i[r, SSTAMP] = stamp
    kept = 0
    for j in range(st_i[S_LEN]):
        r = slist[j]
        if req_i[r, SSTAMP] == stamp:
            slist[kept] = r
            kept += 1
        else:
            k0 = req_i[r, KOFF]
            _count_keys(st_i, scount, keys, k0, k0 + req_i[r, SCOUNTED], -1)
            req_i[r, SCOUNTED] = -1
    st_i[S_LEN] = kept
    return int(st_i[S_TOTAL] - st_i[S_DISTINCT])


@njit(cache=True, nogil=True)
def _release(
    st_i: np.ndarray, st_f: np.ndarray, req_i: np.ndarray, req_f: np.ndarray, family: Family, heap: Heap, i: int
) -> None:
    """FleetSim._finish_row: the turns that follow row ``i`` due, each at its time or its think
    time after ``i``'s end, whichever is later (replay.release), once."""
    g = req_i[i, GROUP]
    ch_off, ch_rows, released = family
    if g < 0 or released[g]:
        return
    released[g] = True
    h_at, h_seq, h_ev = heap
    now = st_f[NOW]
    for j in range(ch_off[g], ch_off[g + 1]):
        c = ch_rows[j]
        due = req_f[c, SEND]
        held = now + req_f[c, THINK] - due
        held = held if held > 0.0 else 0.0
        req_f[c, HELD] = held
        _push(st_i, h_at, h_seq, h_ev, due + held, ROW, c)


@njit(cache=True, nogil=True)
def _release_ended(st_i: np.ndarray, st_f: np.ndarray, req_i: np.ndarray, req_f: np.ndarray, family: Family,
        heap: Heap, fin: np.ndarray) -> None:  # fmt: skip
    """:func:`_release` of every request ended since the last call, in the order they ended."""
    for j in range(st_i[REL_N], st_i[FIN_N]):
        _release(st_i, st_f, req_i, req_f, family, heap, fin[j])
    st_i[REL_N] = st_i[FIN_N]


@njit(cache=True, nogil=True)
def _materialize(cfg_i: np.ndarray, st_i: np.ndarray, req_i: np.ndarray, req_f: np.ndarray, running: np.ndarray,
        times: np.ndarray, ends: np.ndarray, k: int) -> None:  # fmt: skip
    """The running requests as the step path leaves them after ``k`` decode steps that ended at
    ``ends[:k]``: a token each at each end, their blocks as many as their tokens fill."""
    bs = cfg_i[BS]
    for i in range(st_i[RUN_N]):
        r = running[i]
        at = req_i[r, TOFF] + req_i[r, NTIMES]
        for t in range(k):
            times[at + t] = ends[t]
        req_i[r, NTIMES] += k
        req_i[r, COMPUTED] += k
        req_i[r, GENERATED] += k
        req_i[r, BLOCKS] = -(-req_i[r, COMPUTED] // bs)


@njit(cache=True, nogil=True)
def _decode_run(cfg_i: np.ndarray, cfg_f: np.ndarray, st_i: np.ndarray, st_f: np.ndarray, req_i: np.ndarray,
        req_f: np.ndarray, keys: np.ndarray, lru: LRU, running: np.ndarray, pend_d: np.ndarray, mt: np.ndarray,
        heap: Heap, sharing: Sharing, run: Run) -> bool:  # fmt: skip
    """The decode steps before the next event at once, where every running request decodes and
    none can join them (no seat, or no request waiting) and none ends: each step's time as the
    step path works it out (its jitter drawn in turn), its blocks taken, and each request's token
    times written once at the end, not walked at every step (issue 73: a step cost the batch).
    The step that reaches the next event is left scheduled, as the step path leaves it (True);
    False where the step path goes on (a step that ends a request, or finds no free block)."""
    n = st_i[RUN_N]
    if n < 1 or n > cfg_i[BUDGET] or (st_i[WQ_LEN] > 0 and n < cfg_i[MAX_SEQS]):
        return False
    times, ends, phase = run
    bs, max_len = cfg_i[BS], cfg_i[MAX_LEN]
    phase[:bs] = 0
    most = ends.shape[0]
    ctx0 = 0
    for i in range(n):
        r = running[i]
        c, plen, g = req_i[r, COMPUTED], req_i[r, PLEN], req_i[r, GENERATED]
        if c != plen + g - 1 or c < plen or req_i[r, BLOCKS] != -(-c // bs):
            return False  # a prefill, or a decode that is not as the step path would find it
        most = min(most, req_i[r, TARGET] - g - 1, max_len - plen - g - 1)  # steps before one ends
        ctx0 += c
        phase[c % bs] += 1
    if most < 1:
        return False
    h_at, h_seq, h_ev = heap
    horizon = h_at[0] if st_i[HEAP_N] > 0 else np.inf
    shared = 0
    if cfg_i[SHARING] and n >= 2:
        shared = _shared(cfg_i, st_i, req_i, keys, running, n, sharing) * bs
    prev, nxt, inlru, count = lru
    t = st_f[NOW]
    k = 0
    while k < most:
        need = phase[(bs - k % bs) % bs]  # those whose tokens fill their blocks: a block more each
        if st_i[USED] + need > cfg_i[NUM_BLOCKS]:
            break  # the step path preempts
        ctx = ctx0 + n * k
        secs = _decode_seconds(cfg_f, n, ctx)
        if shared > 0:
            secs -= cfg_f[SHARED_CUT] * min(shared, ctx) / 1e3
        if secs > 0 and cfg_f[SIGMA] > 0:
            secs = secs * math.exp(_gauss(mt, st_i, st_f, cfg_f[MU], cfg_f[SIGMA]))
        st_f[LAST_STEP] = secs
        if need:
            st_i[USED] += need
            _evict_to(st_i, prev, nxt, inlru, count, cfg_i[NKEYS], cfg_i[NUM_BLOCKS] - st_i[USED])
        st_f[BUSY] += secs
        end = t + secs
        if end >= horizon:  # it reaches the next event: left scheduled, as the step path leaves it
            if k:
                _materialize(cfg_i, st_i, req_i, req_f, running, times, ends, k)
            st_f[NOW] = t
            for i in range(n):
                r = running[i]
                pend_d[i] = r
                req_i[r, BLOCKS] = -(-(req_i[r, COMPUTED] + 1) // bs)
            st_i[PEND_ND], st_i[PEND_NP] = n, 0
            st_i[STEPPING] = 1
            _push(st_i, h_at, h_seq, h_ev, end, STEP, 0)
            return True
        t = end if end > t else t  # as the event loop's clock moves (never back)
        ends[k] = t
        k += 1
        st_i[ITERATIONS] += 1
        st_i[GEN_TOKENS] += n
    if k:
        _materialize(cfg_i, st_i, req_i, req_f, running, times, ends, k)
        st_f[NOW] = t
    return False


@njit(cache=True, nogil=True)
def _kick(cfg_i: np.ndarray, cfg_f: np.ndarray, st_i: np.ndarray, st_f: np.ndarray, req_i: np.ndarray,
        req_f: np.ndarray, keys: np.ndarray, live: np.ndarray, lru: LRU, running: np.ndarray, wq: np.ndarray,
        pend_d: np.ndarray, pend_p: np.ndarray, fin: np.ndarray, mt: np.ndarray, heap: Heap, sharing: Sharing,
        family: Family, run: Run) -> None:  # fmt: skip
    """FleetSim._kick: the replica's next step started, if it is idle and has work."""
    if st_i[STEPPING] or (st_i[RUN_N] == 0 and st_i[WQ_LEN] == 0):
        return
    if _decode_run(cfg_i, cfg_f, st_i, st_f, req_i, req_f, keys, lru, running, pend_d, mt, heap, sharing, run):
        return
    _schedule(cfg_i, st_i, st_f, req_i, req_f, keys, live, lru, running, wq, pend_d, pend_p, fin)
    _release_ended(st_i, st_f, req_i, req_f, family, heap, fin)  # those refused, before the step is due
    nd, npf = st_i[PEND_ND], st_i[PEND_NP]
    ctx = 0
    for j in range(nd):
        ctx += req_i[pend_d[j], COMPUTED]
    secs = _step_seconds(cfg_f, cfg_i, nd, ctx, pend_p, npf, req_i)
    if cfg_i[SHARING] and nd >= 2:
        shared = _shared(cfg_i, st_i, req_i, keys, pend_d, nd, sharing) * cfg_i[BS]
        if shared > 0:
            secs -= cfg_f[SHARED_CUT] * min(shared, ctx) / 1e3
    if secs > 0 and cfg_f[SIGMA] > 0:
        secs = secs * math.exp(_gauss(mt, st_i, st_f, cfg_f[MU], cfg_f[SIGMA]))
    st_f[LAST_STEP] = secs
    if nd == 0 and npf == 0:
        return
    st_f[BUSY] += secs
    st_i[STEPPING] = 1
    h_at, h_seq, h_ev = heap
    _push(st_i, h_at, h_seq, h_ev, st_f[NOW] + secs, STEP, 0)


@njit(cache=True, nogil=True)
def run_until(
    until: float,
    cfg_i: np.ndarray,
    cfg_f: np.ndarray,
    st_i: np.ndarray,
    st_f: np.ndarray,
    req_i: np.ndarray,
    req_f: np.ndarray,
    keys: np.ndarray,
    live: np.ndarray,
    lru_prev: np.ndarray,
    lru_next: np.ndarray,
    lru_in: np.ndarray,
    lru_count: np.ndarray,
    running: np.ndarray,
    wq: np.ndarray,
    pend_d: np.ndarray,
    pend_p: np.ndarray,
    emitted: np.ndarray,
    times: np.ndarray,
    fin: np.ndarray,
    polls: np.ndarray,
    mt: np.ndarray,
    h_at: np.ndarray,
    h_seq: np.ndarray,
    h_ev: np.ndarray,
    scount: np.ndarray,
    slist: np.ndarray,
    ch_off: np.ndarray,
    ch_rows: np.ndarray,
    released: np.ndarray,
    ends: np.ndarray,
    phase: np.ndarray,
) -> int:
    """FleetSim.run_until on one replica: the events due at or before ``until`` played. Returns
    :data:`RAN_OUT`, or :data:`NEED_POLLS` (the next event a poll and ``polls`` full: grow it
    and call again) or :data:`FAILED`."""
    lru = (lru_prev, lru_next, lru_in, lru_count)
    heap = (h_at, h_seq, h_ev)
    sharing = (scount, slist)
    family = (ch_off, ch_rows, released)
    run = (times, ends, phase)
    total = req_i.shape[0]
    while st_i[HEAP_N] > 0 and st_i[OVER] == 0 and h_at[0] <= until:
        if h_ev[0, 0] == POLL and st_i[POLL_N] >= polls.shape[0]:
            return NEED_POLLS
        _pop(st_i, h_at, h_seq, h_ev)
        last = st_i[HEAP_N]
        at, kind, obj = h_at[last], h_ev[last, 0], h_ev[last, 1]
        if at > st_f[NOW]:
            st_f[NOW] = at
        if kind != POLL:
            st_i[MOVING] -= 1
        if kind == ROW:
            plen = req_i[obj, PLEN]
            if plen + req_i[obj, OUTRAW] > cfg_i[MAX_LEN]:  # longer than the context
                st_i[SKIPPED] += 1
                _release(st_i, st_f, req_i, req_f, family, heap, obj)
                continue
            if _blocks_for(plen + req_i[obj, TARGET], cfg_i[BS]) > cfg_i[NUM_BLOCKS]:  # than the cache
                st_i[SKIPPED] += 1
                st_i[TOO_BIG] += 1
                _release(st_i, st_f, req_i, req_f, family, heap, obj)
                continue
            req_f[obj, START] = st_f[NOW]
            outside = cfg_f[A0] + cfg_f[A_PROMPT] * float(plen) / 1e3
            due = st_f[NOW] + outside
            _push(st_i, h_at, h_seq, h_ev, due if not (0.0 > due) else 0.0, ADD, obj)
        elif kind == ADD:
            wq[(st_i[WQ_HEAD] + st_i[WQ_LEN]) % wq.shape[0]] = obj
            st_i[WQ_LEN] += 1
            _kick(cfg_i, cfg_f, st_i, st_f, req_i, req_f, keys, live, lru, running, wq, pend_d, pend_p, fin, mt,
                heap, sharing, family, run)  # fmt: skip
        elif kind == STEP:
            st_i[STEPPING] = 0
            _complete(cfg_i, st_i, st_f, req_i, req_f, keys, live, lru, running, pend_d, pend_p, emitted, times, fin)
            _release_ended(st_i, st_f, req_i, req_f, family, heap, fin)
            _kick(cfg_i, cfg_f, st_i, st_f, req_i, req_f, keys, live, lru, running, wq, pend_d, pend_p, fin, mt,
                heap, sharing, family, run)  # fmt: skip
        else:
            p = st_i[POLL_N]
            polls[p, 0] = st_f[NOW]
            polls[p, 1] = st_i[WQ_LEN]
            polls[p, 2] = st_i[RUN_N]
            polls[p, 3] = st_i[USED] / cfg_i[NUM_BLOCKS] if cfg_i[NUM_BLOCKS] else 0.0
            st_i[POLL_N] = p + 1
            left = total - st_i[FIN_N] - st_i[SKIPPED]  # every request ended is a sample
            if left > 0 and st_i[MOVING] == 0 and not st_i[STEPPING]:
                st_i[STALLED] = left  # nothing in flight, nothing to come: they can never run
                st_i[SKIPPED] += left
                st_i[OVER] = 1
                break
            if left > 0:
                _push(st_i, h_at, h_seq, h_ev, st_f[NOW] + cfg_f[POLL_S], POLL, 0)
        if st_i[OVER] < 0:
            return FAILED
    return FAILED if st_i[OVER] < 0 else RAN_OUT


@njit(cache=True, nogil=True)
def start(st_i: np.ndarray, req_f: np.ndarray, first: np.ndarray, poll_s: float, h_at: np.ndarray,
        h_seq: np.ndarray, h_ev: np.ndarray) -> None:  # fmt: skip
    """FleetSim.start: every row that follows no other (``first``, in the rows' order) due at its
    time, then the first poll."""
    for j in first:
        _push(st_i, h_at, h_seq, h_ev, req_f[j, SEND], ROW, j)
    if poll_s > 0:
        _push(st_i, h_at, h_seq, h_ev, poll_s, POLL, 0)


# -- the replay's traffic: lengths at quantiles (Lengths.at, many at once) ----------------------
@njit(cache=True, nogil=True)
def lengths_at(qs: np.ndarray, cum: np.ndarray, lo: np.ndarray, hi: np.ndarray, shape: np.ndarray,
        tilt: float) -> np.ndarray:  # fmt: skip
    """Lengths.at of each quantile: its bucket by the counts, its place inside by the tilted
    log-uniform; the same operations (Python's min and max as they compare, libm's log1p, expm1
    and pow, round half to even), so the same lengths."""
    out = np.empty(qs.shape[0], np.int64)
    last = cum.shape[0] - 1
    top = cum[last]
    for j in range(qs.shape[0]):
        x = qs[j] * top
        a, b = 0, cum.shape[0]  # bisect_left
        while a < b:
            mid = (a + b) // 2
            if cum[mid] < x:
                a = mid + 1
            else:
                b = mid
        k = min(a, lo.shape[0] - 1)
        below = cum[k - 1] if k else 0.0
        span = cum[k] - below
        span = 1e-12 if 1e-12 > span else span
        v = (x - below) / span
        v = v if v > 0.0 else 0.0
        v = v if v < 1.0 else 1.0
        t = shape[k] + tilt
        u = v if abs(t) < 1e-9 else math.log1p(v * math.expm1(t)) / t
        n = round(lo[k] * math.pow(hi[k] / lo[k], u))
        out[j] = n if n > 1 else 1
    return out
