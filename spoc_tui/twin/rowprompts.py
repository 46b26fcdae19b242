"""A trace replay's prompts (:class:`~spoc_tui.twin.fleet.FleetSim`): each row's token ids, its
named blocks' the same wherever its hash ids recur (:func:`block_layout`), then ids no other
prompt of the replay has. The prefix cache only compares ids, so a prompt is a few runs of
consecutive ids (:class:`RunPrompt`), never laid out as a list, and its blocks' keys are worked
out for many rows at once (:meth:`~spoc_tui.sim.prefix.PrefixCache.of_runs`): issue 73, where
laying each prompt out and hashing it took a sixth of a headroom's estimate."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain
from typing import overload

import numpy as np

from spoc_tui.core.traces.read import TraceRow
from spoc_tui.sim.prefix import BlockHash, PrefixCache

CHUNK = 256
"""Rows whose prompts and keys are worked out together, as the replay first needs one of them."""


Runs = tuple[list[int], list[int]]
"""Runs of consecutive token ids: their first ids, their lengths."""


def block_layout(rows: Sequence[TraceRow], first_id: int) -> tuple[dict[int, Runs], int, dict[int, int]]:
    """Token ids for every block the rows name by hash id, worked out for all rows at once: per
    row (by its index) its named blocks as runs of ids (a block is ``block_tokens`` ids in a run;
    the same ids wherever the same hash id, scope and length recur; blocks named together lie in
    one run), the first id no block has, and per row whose named blocks include one no other row
    names, where the first such begins (tokens into its prompt: from there on its prompt is its
    own). A row names as many of its hash ids as its prompt fills (the last one perhaps in part,
    which makes it a block of its own)."""
    chained = _one_chain(rows, first_id)
    return chained if chained is not None else _any_layout(rows, first_id)


def _any_layout(rows: Sequence[TraceRow], first_id: int) -> tuple[dict[int, Runs], int, dict[int, int]]:
    """:func:`block_layout` of any rows."""
    per_row: list[tuple[int, int, int, int]] = []  # (row index, blocks named, last one's length, block)
    hashes: list[tuple[int, ...]] = []
    scopes: dict[str | None, int] = {}
    scope_of: list[int] = []
    for row in rows:
        bt = row.block_tokens
        if not row.hash_ids or bt <= 0 or row.input_tokens <= 0:
            continue
        m = min(len(row.hash_ids), -(-row.input_tokens // bt))
        per_row.append((row.index, m, min(bt, row.input_tokens - bt * (m - 1)), bt))
        hashes.append(row.hash_ids[:m])
        scope_of.append(scopes.setdefault(row.scope, len(scopes)))
    if not per_row:
        return {}, first_id, {}
    counts = np.fromiter((m for _, m, _, _ in per_row), np.int64, len(per_row))
    h = np.fromiter(chain.from_iterable(hashes), np.int64, int(counts.sum()))
    ends = np.cumsum(counts) - 1
    size = np.repeat(np.fromiter((bt for _, _, _, bt in per_row), np.int64, len(per_row)), counts)
    size[ends] = [last for _, _, last, _ in per_row]
    width = max(max(r.block_tokens for r in rows), 1)
    _, code = np.unique(h, return_inverse=True)
    key = (np.repeat(np.asarray(scope_of, np.int64), counts) * (int(code.max()) + 1) + code) * (width + 1) + size
    _, block = np.unique(key, return_inverse=True)
    firsts = first_id + block * width
    # a run breaks at each row's first block and where a block's ids do not follow the one before
    breaks = np.ones(len(firsts), bool)
    breaks[1:] = firsts[1:] != firsts[:-1] + size[:-1]
    breaks[ends[:-1] + 1] = True
    run_of = np.cumsum(breaks) - 1
    run_first: list[int] = firsts[breaks].tolist()
    run_len: list[int] = np.bincount(run_of, size).astype(np.int64).tolist()
    upto: list[int] = (run_of[ends] + 1).tolist()  # each row's runs end before this one
    out: dict[int, Runs] = {}
    at = 0
    for (index, _, _, _), end in zip(per_row, upto, strict=True):
        out[index] = (run_first[at:end], run_len[at:end])
        at = end
    # each row's first block no other row names (one a row names twice counts as shared)
    row_first = ends - counts + 1
    start = np.cumsum(size) - size
    offset = start - np.repeat(start[row_first], counts)
    never = np.iinfo(np.int64).max
    alone = np.where(np.bincount(block)[block] == 1, offset, never)
    first_alone: list[int] = np.minimum.reduceat(alone, row_first).tolist()
    own = {index: a for (index, _, _, _), a in zip(per_row, first_alone, strict=True) if a != never}
    return out, first_id + (int(block.max()) + 1) * width, own


def _one_chain(rows: Sequence[TraceRow], first_id: int) -> tuple[dict[int, Runs], int, dict[int, int]] | None:
    """:func:`block_layout` where every row names the leading blocks of one chain, hash ids 0, 1, ...
    up to its own count, each a whole block of one size (the traffic a headroom replays: one system
    prompt every request begins with, then its own text): the same layout without sorting every
    row's ids. Block b's ids are then ``first_id + b * size`` on (one run a row), and the only
    blocks one row alone names are those past the second longest row's, in the longest if it is
    the only one that long. None where the rows are not so."""
    sizes = {r.block_tokens for r in rows}
    if len(sizes) != 1:
        return None
    bt = sizes.pop()
    counts: list[tuple[int, int]] = []  # (row index, blocks named)
    longest = max((len(r.hash_ids) for r in rows), default=0)
    if bt <= 0 or longest == 0:
        return None
    chain = tuple(range(longest))
    for r in rows:
        m = len(r.hash_ids)
        if not m or r.input_tokens <= 0:
            continue
        if r.scope is not None or m * bt > r.input_tokens or r.hash_ids != chain[:m]:
            return None
        counts.append((r.index, m))
    if not counts:  # no row's prompt holds a block
        return {}, first_id, {}
    out: dict[int, Runs] = {index: ([first_id], [m * bt]) for index, m in counts}
    lengths = sorted((m for _, m in counts), reverse=True)
    own: dict[int, int] = {}
    second = lengths[1] if len(lengths) > 1 else 0
    if lengths[0] > second:
        own = {next(index for index, m in counts if m == lengths[0]): second * bt}
    return out, first_id + longest * bt, own


class RunPrompt(Sequence[int]):
    """A prompt of runs of consecutive token ids: its length, and any part of it as a list (the
    engine reads its length, and at its end the ids after its last full block)."""

    __slots__ = ("lens", "n", "starts")

    def __init__(self, starts: Sequence[int], lens: Sequence[int]) -> None:
        self.starts, self.lens = tuple(starts), tuple(lens)
        self.n = sum(self.lens)

    def __len__(self) -> int:
        return self.n

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        if isinstance(i, slice):
            a, b, step = i.indices(self.n)
            if step != 1:
                return list(self)[i]
            parts: list[range] = []
            end = self.n  # from the last run back (the engine reads the ids after its last full block)
            for s, size in zip(reversed(self.starts), reversed(self.lens), strict=True):
                at = end - size
                lo, hi = max(a, at), min(b, end)
                if lo < hi:
                    parts.append(range(s + lo - at, s + hi - at))
                if at <= a:
                    break
                end = at
            return [x for r in reversed(parts) for x in r]
        k = i + self.n if i < 0 else i
        if not 0 <= k < self.n:
            raise IndexError(i)
        at = 0
        for s, size in zip(self.starts, self.lens, strict=True):
            if k < at + size:
                return s + k - at
            at += size
        raise IndexError(i)  # pragma: no cover (the length bounds it)

    def __iter__(self) -> Iterator[int]:
        for s, size in zip(self.starts, self.lens, strict=True):
            yield from range(s, s + size)


class RowPrompts:
    """Each row's prompt and its full blocks' keys, worked out :data:`CHUNK` rows at a time as
    the replay first sends one of them (a row is sent once; its prompt is then let go)."""

    def __init__(self, rows: Sequence[TraceRow], first_id: int, block_size: int) -> None:
        self.rows, self.block_size = rows, block_size
        self._next = first_id
        self._layout: dict[int, Runs] | None = None
        self._own: dict[int, int] = {}
        self._place: dict[int, int] = {}
        self._ready: dict[int, tuple[RunPrompt, list[BlockHash], int | None]] = {}
        self._taken: set[int] = set()
        self._chains: dict[int, list[BlockHash]] = {}
        """The keys of the blocks of a run from its first id, by that id (:meth:`_keys`): a run that
        more than one prompt begins with (a row's own first run is not kept: a trace of an hour
        would hold every row's keys)."""
        self._starts: set[int] = set()
        """The first ids of the runs prompts began with so far."""

    def _laid_out(self) -> dict[int, Runs]:
        if self._layout is None:
            self._layout, self._next, self._own = block_layout(self.rows, self._next)
            self._place = {r.index: i for i, r in enumerate(self.rows)}
        return self._layout

    def prompt(self, row: TraceRow) -> RunPrompt:
        """The row's prompt: its hash ids' blocks, then ids no other prompt of the replay has."""
        named = self._laid_out().get(row.index)
        starts, lens = (list(named[0]), list(named[1])) if named is not None else ([], [])
        fresh = row.input_tokens - sum(lens)
        if fresh > 0:
            starts.append(self._next)
            lens.append(fresh)
            self._next += fresh
        return RunPrompt(starts, lens)

    def own_from(self, row: TraceRow) -> int | None:
        """Where the row's prompt becomes its own (tokens in): its first block no other row names,
        or its ids after its named blocks; None where every token of it lies in blocks other rows
        name too. No other request of the replay can find a block of it that ends past there."""
        named = self._laid_out().get(row.index)
        own = self._own.get(row.index)
        named_len = sum(named[1]) if named is not None else 0
        if row.input_tokens > named_len:
            own = named_len if own is None else min(own, named_len)
        return own

    def take(self, row: TraceRow) -> tuple[RunPrompt, list[BlockHash], int | None]:
        """The row's prompt, the keys (:meth:`PrefixCache.hashes`) of its full blocks up to where it
        becomes its own (:meth:`own_from`: no request looks further, so none is worked out), and
        that place in tokens; once."""
        got = self._ready.pop(row.index, None)
        if got is None:
            self._laid_out()
            at = self._place.get(row.index)
            ahead = [row] if at is None else self.rows[at : at + CHUNK]
            todo = [r for r in ahead if r.index not in self._taken and r.index not in self._ready]
            prompts = [self.prompt(r) for r in todo]
            owns = [self.own_from(r) for r in todo]
            bs = self.block_size
            limits = [len(p) // bs if own is None else own // bs for p, own in zip(prompts, owns, strict=True)]
            keys = self._keys(prompts, limits)
            self._ready.update({r.index: (p, k, o) for r, p, k, o in zip(todo, prompts, keys, owns, strict=True)})
            got = self._ready.pop(row.index)
        self._taken.add(row.index)
        return got

    def _keys(self, prompts: Sequence[RunPrompt], limits: Sequence[int]) -> list[list[BlockHash]]:
        """The prompts' keys up to their limits: where a prompt's first run holds all of them (a
        prompt that begins with the blocks many rows begin with, as a system prompt), a slice of
        the keys of that run worked out once (a block's key is its run's first id and its place
        alone there), from the second prompt that begins with it on; the others' with
        :meth:`PrefixCache.of_runs`. The same keys."""
        bs = self.block_size
        out: list[list[BlockHash] | None] = [None] * len(prompts)
        rest: list[int] = []
        chains = self._chains
        seen = self._starts
        for i, (p, n) in enumerate(zip(prompts, limits, strict=True)):
            start = p.starts[0] if n > 0 and p.lens[0] >= n * bs else None
            if start is not None and start in seen:  # kept from a run's second prompt on
                chain = chains.get(start)
                if chain is None or len(chain) < n:
                    longest = max(n, p.lens[0] // bs)
                    chain = chains[start] = PrefixCache.of_runs([((start,), (longest * bs,))], bs)[0]
                out[i] = chain[:n]
            else:
                if start is not None:
                    seen.add(start)
                rest.append(i)
        if rest:
            for i, k in zip(rest, PrefixCache.of_runs([(prompts[i].starts, prompts[i].lens) for i in rest], bs,
                                                      [limits[i] for i in rest]), strict=True):  # fmt: skip
                out[i] = k
        return [k if k is not None else [] for k in out]
