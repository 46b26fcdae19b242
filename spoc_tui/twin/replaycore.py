"""The compiled replay's ground (issue 73, :mod:`~spoc_tui.twin.replaykernel` builds on it): the
layout of its state in arrays of machine ints and floats, Python's Mersenne Twister as
``random.random`` and ``random.gauss`` draw from it, the event heap as ``heapq`` orders
:class:`~spoc_tui.twin.fleet.FleetSim`'s events, and the prefix cache's LRU
(:class:`~spoc_tui.sim.prefix.PrefixCache`) as a linked list of the same entries.

numba's cache of the kernel is kept under a folder named by these two modules' sources together
(:func:`spoc_tui.twin.fastreplay.kernel`): a change to either compiles both again.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# -- the engine's settings (cfg_i, cfg_f) -------------------------------------------------------
NUM_BLOCKS, BUDGET, MAX_SEQS, MAX_LEN, BS, CHUNKED, CACHING, RIDGE_MOVES, NKEYS, SHARING = range(10)
B0, B_PREFILL, B_ATTN, B_DECODE, B_CONTEXT, B_MIXED, RIDGE, A0, A_PROMPT, SIGMA, MU, POLL_S, SHARED_CUT = range(13)

# -- its state (st_i, st_f) --------------------------------------------------------------------
(USED, RUN_N, WQ_HEAD, WQ_LEN, HEAP_N, SEQ, MOVING, STEPPING, PEND_ND, PEND_NP, LRU_HEAD, LRU_TAIL, LRU_LEN,
 LRU_EXTRA, RUNS, SKIPPED, TOO_BIG, STALLED, OVER, FIN_N, POLL_N, ITERATIONS, GEN_TOKENS, PREEMPTIONS,
 PREFIX_QUERIES, PREFIX_HITS, PEAK, MTI, GAUSS_HELD, PROMPT_TOKENS, S_TOTAL, S_DISTINCT, S_LEN, S_STAMP,
 REL_N) = range(35)  # fmt: skip
ST_I = 35
NOW, BUSY, GAUSS_NEXT, LAST_STEP = range(4)
ST_F = 4

# -- each request (req_i, req_f) ---------------------------------------------------------------
(PLEN, TARGET, COMPUTED, GENERATED, BLOCKS, CACHED, SHARED, NTIMES, HLEN, OWN, KOFF, KLEN, TOFF, HASHED, REASON,
 OUTRAW, SCOUNTED, SSTAMP, GROUP) = range(19)  # fmt: skip
REQ_I = 19
SEND, START, FINISHED, THINK, HELD = range(5)
REQ_F = 5

STOP, LENGTH, ABORT = 0, 1, 2
"""A request's finish reason (``REASON``)."""
ROW, ADD, STEP, POLL = 0, 1, 2, 3
"""Events: a row due, a request reaching its engine, a step's end, a poll (a timer)."""
RAN_OUT, NEED_POLLS, FAILED = 0, 1, 2
"""What :func:`run_until` stopped at: nothing left due by then, the polls' room full, a state
the Python engine would not reach (a key missing: the caller replays it there instead)."""

LRU = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""The prefix cache's LRU: each node's previous and next (-1: none), whether a key's node is in it,
a run node's count of blocks (nodes below the count of keys are keys, the rest runs)."""
Heap = tuple[np.ndarray, np.ndarray, np.ndarray]
"""The event heap: each entry's time, sequence number, and (kind, object)."""
Family = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Follow-up turns: per parent (a row's ``GROUP``) where its children start in the next array, the
children's rows in the trace's order, and whether they were released (at the parent's first end)."""
Run = tuple[np.ndarray, np.ndarray, np.ndarray]
"""A decode run's arrays: the requests' token times, the run's step ends, and how many running
requests stand at each place in their last block."""
Sharing = tuple[np.ndarray, np.ndarray]
"""The decodes' shared prompt blocks (SharedBlocks): each key's count among the counted decodes'
leading blocks, and the counted requests."""

_UPPER, _LOWER, _MATRIX = 0x80000000, 0x7FFFFFFF, 0x9908B0DF
_TWOPI = 2.0 * math.pi


# -- Python's Mersenne Twister (random.random, random.gauss) -------------------------------------
@njit(cache=True, nogil=True)
def _genrand(mt: np.ndarray, st_i: np.ndarray) -> int:
    if st_i[MTI] >= 624:
        for kk in range(624):
            y = (mt[kk] & _UPPER) | (mt[(kk + 1) % 624] & _LOWER)
            v = mt[(kk + 397) % 624] ^ (y >> 1)
            if y & 1:
                v ^= _MATRIX
            mt[kk] = v
        st_i[MTI] = 0
    y = mt[st_i[MTI]]
    st_i[MTI] += 1
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    y ^= y >> 18
    return int(y & 0xFFFFFFFF)


@njit(cache=True, nogil=True)
def _random(mt: np.ndarray, st_i: np.ndarray) -> float:
    a = _genrand(mt, st_i) >> 5
    b = _genrand(mt, st_i) >> 6
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)


@njit(cache=True, nogil=True)
def _gauss(mt: np.ndarray, st_i: np.ndarray, st_f: np.ndarray, mu: float, sigma: float) -> float:
    if st_i[GAUSS_HELD]:
        z = st_f[GAUSS_NEXT]
        st_i[GAUSS_HELD] = 0
    else:
        x2pi = _random(mt, st_i) * _TWOPI
        g2rad = math.sqrt(-2.0 * math.log(1.0 - _random(mt, st_i)))
        z = math.cos(x2pi) * g2rad
        st_f[GAUSS_NEXT] = math.sin(x2pi) * g2rad
        st_i[GAUSS_HELD] = 1
    return float(mu + z * sigma)


# -- the event heap: (time, sequence) ordered, as heapq orders FleetSim's tuples -----------------
@njit(cache=True, nogil=True)
def _less(h_at: np.ndarray, h_seq: np.ndarray, a: int, b: int) -> bool:
    return bool(h_at[a] < h_at[b] or (h_at[a] == h_at[b] and h_seq[a] < h_seq[b]))


@njit(cache=True, nogil=True)
def _swap(h_at: np.ndarray, h_seq: np.ndarray, h_ev: np.ndarray, a: int, b: int) -> None:
    h_at[a], h_at[b] = h_at[b], h_at[a]
    h_seq[a], h_seq[b] = h_seq[b], h_seq[a]
    h_ev[a, 0], h_ev[b, 0] = h_ev[b, 0], h_ev[a, 0]
    h_ev[a, 1], h_ev[b, 1] = h_ev[b, 1], h_ev[a, 1]


@njit(cache=True, nogil=True)
def _push(
    st_i: np.ndarray, h_at: np.ndarray, h_seq: np.ndarray, h_ev: np.ndarray, at: float, kind: int, obj: int
) -> None:
    st_i[SEQ] += 1
    if kind != POLL:
        st_i[MOVING] += 1
    j = st_i[HEAP_N]
    st_i[HEAP_N] = j + 1
    h_at[j], h_seq[j], h_ev[j, 0], h_ev[j, 1] = at, st_i[SEQ], kind, obj
    while j > 0:
        parent = (j - 1) // 2
        if not _less(h_at, h_seq, j, parent):
            break
        _swap(h_at, h_seq, h_ev, j, parent)
        j = parent


@njit(cache=True, nogil=True)
def _pop(st_i: np.ndarray, h_at: np.ndarray, h_seq: np.ndarray, h_ev: np.ndarray) -> None:
    """The heap's first entry out: moved to the slot past the heap's end, where the caller reads it."""
    n = st_i[HEAP_N] - 1
    st_i[HEAP_N] = n
    _swap(h_at, h_seq, h_ev, 0, n)
    j = 0
    while True:
        c = 2 * j + 1
        if c >= n:
            break
        if c + 1 < n and _less(h_at, h_seq, c + 1, c):
            c += 1
        if not _less(h_at, h_seq, c, j):
            break
        _swap(h_at, h_seq, h_ev, j, c)
        j = c


# -- the prefix cache: an LRU of keys and of runs of unasked blocks (PrefixCache) ----------------
@njit(cache=True, nogil=True)
def _unlink(st_i: np.ndarray, prev: np.ndarray, nxt: np.ndarray, node: int) -> None:
    p, q = prev[node], nxt[node]
    if p >= 0:
        nxt[p] = q
    else:
        st_i[LRU_HEAD] = q
    if q >= 0:
        prev[q] = p
    else:
        st_i[LRU_TAIL] = p
    st_i[LRU_LEN] -= 1


@njit(cache=True, nogil=True)
def _attach(st_i: np.ndarray, inward: np.ndarray, outward: np.ndarray, node: int, end: int, other: int) -> None:
    """``node`` linked at the list's ``end`` (the slot of st_i holding it), ``other`` the opposite
    end's slot: ``inward`` points from a node towards the middle, ``outward`` towards ``end``."""
    was = st_i[end]
    inward[node], outward[node] = was, -1
    if was >= 0:
        outward[was] = node
    else:
        st_i[other] = node
    st_i[end] = node
    st_i[LRU_LEN] += 1


@njit(cache=True, nogil=True)
def _append(st_i: np.ndarray, prev: np.ndarray, nxt: np.ndarray, node: int) -> None:
    _attach(st_i, prev, nxt, node, LRU_TAIL, LRU_HEAD)


@njit(cache=True, nogil=True)
def _prepend(st_i: np.ndarray, prev: np.ndarray, nxt: np.ndarray, node: int) -> None:
    _attach(st_i, nxt, prev, node, LRU_HEAD, LRU_TAIL)


@njit(cache=True, nogil=True)
def _evict_to(
    st_i: np.ndarray, prev: np.ndarray, nxt: np.ndarray, inlru: np.ndarray, count: np.ndarray, nkeys: int, capacity: int
) -> None:
    over = st_i[LRU_LEN] + st_i[LRU_EXTRA] - max(0, capacity)
    while over > 0:
        node = st_i[LRU_HEAD]
        _unlink(st_i, prev, nxt, node)
        if node < nkeys:
            inlru[node] = False
            over -= 1
        elif count[node] > over:  # part of a run: the rest stays the oldest
            count[node] -= over
            _prepend(st_i, prev, nxt, node)
            st_i[LRU_EXTRA] -= over
            return
        else:
            st_i[LRU_EXTRA] -= count[node] - 1
            over -= count[node]


@njit(cache=True, nogil=True)
def _insert(st_i: np.ndarray, prev: np.ndarray, nxt: np.ndarray, inlru: np.ndarray, count: np.ndarray,
        nkeys: int, keys: np.ndarray, k0: int, k1: int, unasked: int) -> None:  # fmt: skip
    for j in range(k0, k1):
        h = keys[j]
        if inlru[h]:
            _unlink(st_i, prev, nxt, h)
        inlru[h] = True
        _append(st_i, prev, nxt, h)
    if unasked > 0:
        st_i[RUNS] += 1
        node = nkeys + st_i[RUNS] - 1
        count[node] = unasked
        _append(st_i, prev, nxt, node)
        st_i[LRU_EXTRA] += unasked - 1
