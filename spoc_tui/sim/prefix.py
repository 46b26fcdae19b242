"""The simulated engine's prefix cache: an LRU of the keys of blocks whose KV is still resident in
free blocks, each key naming every token up to its block's end (as vLLM chains its block hashes)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np

from spoc_tui.core.tuning.engineflags import BLOCK_SIZES

BlockHash = int
"""A block's key in the prefix cache: a hash of the tokens up to the block's end."""

_HASH = np.random.default_rng(0x5EED_B10C)
_IN_BLOCK = _HASH.integers(1, 1 << 63, size=max(BLOCK_SIZES), dtype=np.uint64) | np.uint64(1)
"""A multiplier per position in a block (odd: each one a bijection of the 64-bit ring)."""
_POWERS = np.cumprod(np.full(4096, 0x9E3779B97F4A7C15, dtype=np.uint64))
"""A multiplier per block of a prompt (grown as longer prompts come)."""


def _block_powers(n: int) -> np.ndarray:
    global _POWERS
    while len(_POWERS) < n:
        _POWERS = np.concatenate(
            (_POWERS, _POWERS[-1] * np.cumprod(np.full(len(_POWERS), 0x9E3779B97F4A7C15, np.uint64)))
        )
    return _POWERS[:n]


class PrefixCache:
    """LRU of block hashes whose KV is still resident in free blocks, and of runs of blocks no
    request will ever ask for (:meth:`insert`'s ``unasked``: kept as a count, in their place)."""

    def __init__(self) -> None:
        self._lru: OrderedDict[BlockHash, int | None] = OrderedDict()
        """Each key (None), or a run's own negative key and its count of blocks."""
        self._extra = 0
        """The runs' blocks beyond one entry each."""
        self._runs = 0

    def __len__(self) -> int:
        return len(self._lru) + self._extra

    @staticmethod
    def hashes(tokens: Sequence[int], block_size: int, limit: int | None = None) -> list[BlockHash]:
        """Each full block's key: a hash of every token up to its end, so two prompts share a
        block's key exactly when they share every token up to it (vLLM chains its block hashes so).
        A polynomial over the 64-bit ring, as arrays (a cryptographic chain per block took a third
        of a virtual run): each token weighed by its place in its block, each block by its place in
        the prompt, the sums running. At most ``limit`` keys."""
        n = len(tokens) // block_size
        return PrefixCache.continued([], tokens, block_size, n if limit is None else min(n, limit))

    @staticmethod
    def continued(
        known: list[BlockHash], tail: Sequence[int] | np.ndarray, block_size: int, limit: int
    ) -> list[BlockHash]:
        """:meth:`hashes` of tokens whose leading blocks' keys are ``known``, given only the tokens
        after them (``tail``; a finished request's: its prompt's last part and its answer), at most
        ``limit`` keys: the same keys without laying the whole prompt out again."""
        m = len(known)
        n = min(limit, m + len(tail) // block_size)
        if n <= m:
            return list(known[: max(0, n)])
        ids = np.asarray(tail[: (n - m) * block_size], dtype=np.uint64).reshape(n - m, block_size)
        keys = np.cumsum((ids @ _IN_BLOCK[:block_size]) * _block_powers(n)[m:n], dtype=np.uint64)
        if m:
            keys = keys + np.uint64(known[m - 1])
        out: list[BlockHash] = keys.tolist()
        return list(known) + out

    @staticmethod
    def of_runs(
        prompts: Sequence[tuple[Sequence[int], Sequence[int]]], block_size: int, limits: Sequence[int] | None = None
    ) -> list[list[BlockHash]]:
        """:meth:`hashes` of many prompts at once, each given as runs of consecutive token ids
        (their first ids, their lengths): the same keys, to the bit, without laying any prompt out
        as a list (a trace replay's prompts are runs: a row's blocks, then ids of its own).
        ``limits``: per prompt, the most keys worked out."""
        bs = block_size
        runs = np.fromiter((len(sizes) for _, sizes in prompts), np.int64, len(prompts))
        first = np.fromiter(chain.from_iterable(starts for starts, _ in prompts), np.int64, int(runs.sum()))
        size = np.fromiter(chain.from_iterable(sizes for _, sizes in prompts), np.int64, len(first))
        owner = np.repeat(np.arange(len(prompts)), runs)
        length = np.bincount(owner, size, len(prompts)).astype(np.int64)
        blocks = length // bs
        if limits is not None:
            blocks = np.minimum(blocks, np.fromiter(limits, np.int64, len(prompts)))
        total = int(blocks.sum())
        if not total:
            return [[] for _ in prompts]
        # each run's place in its prompt, and what of it lies in the prompt's full blocks
        place = np.cumsum(size) - size - np.repeat(np.cumsum(length) - length, runs)
        run = np.clip((blocks * bs)[owner] - place, 0, size)
        offsets = first - (np.cumsum(run) - run)
        ids = (np.repeat(offsets, run) + np.arange(total * bs)).astype(np.uint64).reshape(total, bs)
        start = np.cumsum(blocks) - blocks  # each prompt's first block among all
        at_block = np.arange(total) - np.repeat(start, blocks)
        # each prompt's running sums: one over all, less the sum before the prompt's first block
        # (the same sums modulo 2**64)
        sums = np.cumsum((ids @ _IN_BLOCK[:bs]) * _block_powers(int(blocks.max()))[at_block], dtype=np.uint64)
        before = np.zeros(len(prompts), np.uint64)
        inner = (blocks > 0) & (start > 0)
        before[inner] = sums[start[inner] - 1]
        counts: list[int] = blocks.tolist()
        keys: list[BlockHash] = (sums - np.repeat(before, blocks)).tolist()
        out: list[list[BlockHash]] = []
        at = 0
        for n in counts:
            out.append(keys[at : at + n])
            at += n
        return out

    def match(self, hashes: list[BlockHash], live: Mapping[BlockHash, int] | None = None) -> int:
        """Leading blocks found: resident in free blocks, or (``live``) held by a running request."""
        n = 0
        lru = self._lru
        move = lru.move_to_end
        for h in hashes:
            if h in lru:
                move(h)
            elif live is None or h not in live:
                break
            n += 1
        return n

    def insert(self, hashes: list[BlockHash], unasked: int = 0) -> None:
        """The keys made the most recent, in their order (a key already in moved to the end), then
        ``unasked`` blocks after them that no request will ever look up (a trace row's own blocks
        and its answer's, which no other row's prompt holds): held as one count, evicted in their
        turn as the same number of keys would be, never matched, never hashed."""
        lru = self._lru
        move = lru.move_to_end
        for h in hashes:
            if h in lru:
                move(h)
            else:
                lru[h] = None
        if unasked > 0:
            self._runs += 1
            lru[-self._runs] = unasked  # block keys are 64-bit sums, never negative
            self._extra += unasked - 1

    def evict_to(self, capacity: int) -> None:
        """The least recently used blocks let go until ``capacity`` are left (a run's in part)."""
        lru = self._lru
        over = len(lru) + self._extra - max(0, capacity)
        while over > 0:
            key, run = lru.popitem(last=False)
            if run is None:
                over -= 1
            elif run > over:  # part of a run: the rest stays the oldest
                lru[key] = run - over
                lru.move_to_end(key, last=False)
                self._extra -= over
                return
            else:
                self._extra -= run - 1
                over -= run

    def clear(self) -> None:
        self._lru.clear()
        self._extra = 0
