"""One load generator's share of a trace replay (:class:`ReplayShare`): the rows it sends, in
time order, and the prefix share the trace implies, counted as rows stream; and when a row is
sent (:func:`release`), the one rule the live replay and the twin's keep."""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from spoc_tui.core.traces.read import TraceRow, TraceSource

PREFIX_SEEN_CAP = 1_000_000
"""The most hash blocks remembered for an implied prefix share (about 60 MB); a bigger trace's
share is over the rows read before the cap (``prefix_rows`` says how many)."""


@dataclass(frozen=True)
class Release:
    """When a replayed row is sent, on the step's clock."""

    at: float
    held_s: float
    """How much later than its due time: the turn it follows had not ended (and been thought
    about) by then. 0 for a row nothing holds."""


def release(due: float, parent_end: float | None, think_s: float = 0.0) -> Release:
    """A replayed row is sent at ``due`` (its timestamp over the speed) or, where the turn it
    follows is in the replay, ``think_s`` after that turn's answer ended (``parent_end``, ended
    well or not), whichever is later. A turn outside the replay (a window or a skip left it out)
    holds nothing: ``parent_end`` None. The live replay (:mod:`spoc_tui.load.runner`) and the
    twin's (:class:`spoc_tui.twin.fleet.FleetSim`) both send by it, and record ``held_s``."""
    if parent_end is None:
        return Release(due, 0.0)
    held = max(0.0, parent_end + think_s - due)
    return Release(due + held, held)


class ReplayShare:
    """The rows one load-generator process sends in a replay step, in time order: its share of
    the source's rows (a conversation stays in one process), less rows longer than the server's
    max-model-len; counts what it read, skipped and the prefix share the trace implies, as rows
    stream (a trace of any size in bounded memory, WEKA's small files aside, which are sorted)."""

    def __init__(self, source: TraceSource, part: tuple[int, int] = (0, 1), max_model_len: int | None = None) -> None:
        self.source = source
        self.part = part
        self.max_model_len = max_model_len
        self.rows = 0
        """Rows of this share (sent or skipped)."""
        self.skipped: Counter[str] = Counter()
        self.prefix_tokens = 0
        """Input tokens in hash blocks an earlier row of the share had."""
        self.prefix_input = 0
        """Input tokens of the rows with hash ids counted (the share's denominator)."""
        self.prefix_rows = 0
        self._seen: set[int] = set()
        self._roots: dict[str, str] = {}

    def _owner(self, row: TraceRow) -> str:
        if row.parent is not None:
            root = self._roots.get(row.parent, row.parent)
        else:
            root = row.id if row.id is not None else str(row.index)
        if row.id is not None:
            self._roots[row.id] = root
        return root

    def __iter__(self) -> Iterator[TraceRow]:
        """Raises: TraceError as :func:`read_trace`."""
        part, of = self.part
        rows = self.source.rows()
        if self.source.fmt == "weka":  # every conversation starts at 0: sort (such files are small)
            rows = iter(sorted(rows, key=lambda r: r.t))
        for row in rows:
            mine = of <= 1 or zlib.crc32(self._owner(row).encode()) % of == part
            too_long = bool(self.max_model_len) and row.input_tokens + row.output_tokens > (self.max_model_len or 0)
            # the prefix share is over every row sent, whichever process sends it: the first counts it
            if part == 0 and not too_long and row.hash_ids and len(self._seen) < PREFIX_SEEN_CAP:
                self.prefix_rows += 1
                self.prefix_input += row.input_tokens
                self.prefix_tokens += _shared_tokens(row, self._seen)
            if not mine:
                continue
            self.rows += 1
            if too_long:
                self.skipped["longer than max-model-len"] += 1
                continue
            yield row


def _shared_tokens(row: TraceRow, seen: set[int]) -> int:
    """Input tokens of ``row`` in blocks already ``seen`` (and note its blocks as seen)."""
    shared = 0
    for k, h in enumerate(row.hash_ids):
        key = hash((row.scope, h))
        if key in seen:
            shared += max(0, min(row.block_tokens, row.input_tokens - k * row.block_tokens))
        else:
            seen.add(key)
    return shared
