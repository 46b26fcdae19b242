"""Decodes that advance without being touched (issue 73): the running requests past their prefill,
each one token a step, held as a few sums instead of walked at every step.

A request that has just made a token and whose next step is a decode (its prompt computed, its
answer not ended, nobody reading its tokens one by one) is *lazy*: from the step it entered at
(``S0``, its ``computed`` then ``c0``) it makes one token at every step, so at any later step count
``S`` it has ``c0 + S - S0`` tokens of context, its tokens are the ends of steps ``S0`` to ``S - 1``,
and it takes a KV block at the steps where ``c0 + S - S0`` is a multiple of the block size. So the
engine holds, for all of them at once:

- how many there are and the sum of ``c0 - S0`` (their context at step ``S`` is that sum plus
  ``n * S``): what the step's cost needs;
- how many take a block at each step, by ``(S0 - c0) mod block_size``: the blocks a step takes;
- the step each one's answer ends at, in a heap: the only step at which it is touched again;
- the ends of the steps since the oldest of them entered: its tokens' times, one slice each.

The engine's scheduler steps them as one while that is what vLLM's would do: every one of them
gets its token (the token budget holds them and the requests still in their prefill come after
all of them in the batch's order), and the blocks they take are free (no preemption). Otherwise,
and before anything that reads the requests one by one (an abort, a decode run), they are *woken*:
each request's fields set to what the step path would have made them, to the same values. Its
figures are the step path's, step for step; only the ITL histogram's sum may differ in its last
bits, being summed per step rather than per token.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterator, Sequence
from typing import Generic, Protocol, TypeVar


class Contexts(Collection[int]):
    """The decodes of a step as the cost models read them: how many (``len``) and their context
    tokens in all (``sum``). Ints, so the total is the same however it is summed."""

    __slots__ = ("n", "total")

    def __init__(self, n: int, total: int) -> None:
        self.n = n
        self.total = total

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        return iter((self.total,) if self.n else ())

    def __contains__(self, x: object) -> bool:
        raise TypeError("a step's decode contexts are held as a count and a total")


class _Request(Protocol):
    prompt: Sequence[int]
    target_tokens: int
    times: list[float] | None
    computed: int
    generated: int
    blocks: int
    last_token: float | None
    seq: int
    lazy: int


R = TypeVar("R", bound=_Request)


class Decoders(Generic[R]):
    """The lazy decodes of one engine (see the module's text)."""

    __slots__ = ("block_size", "due", "ends", "first", "n", "per_phase", "since", "steps", "top")

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.steps = 0
        """Steps the engine's step path has completed (``S``)."""
        self.ends: list[float] = []
        """The end of each step from step ``first`` on (only those a lazy decode may need)."""
        self.first = 0
        self.n = 0
        self.since = 0
        """The sum of ``c0 - S0`` over the lazy decodes."""
        self.per_phase = [0] * block_size
        """Lazy decodes by ``(S0 - c0) mod block_size``: those taking a block at step ``S`` are
        ``per_phase[S mod block_size]``."""
        self.due: list[tuple[int, int, int, R]] = []
        """(step its answer ends at, its seq, S0, the request); an entry whose request is no longer
        lazy since S0 is stale, and skipped."""
        self.top = -1
        """The highest seq of a request made lazy since all were last woken."""

    def context(self) -> int:
        """The lazy decodes' context tokens in all at the step being scheduled."""
        return self.since + self.n * self.steps

    def blocks_due(self) -> int:
        """The KV blocks the lazy decodes take at the step being scheduled."""
        return self.per_phase[self.steps % self.block_size] if self.n else 0

    def tick(self, now: float) -> None:
        """A step ended at ``now``."""
        if not self.n:
            self.ends.clear()
            self.first = self.steps
        self.steps += 1
        self.ends.append(now)

    def enter(self, r: R, max_len: int) -> None:
        """``r`` (just made a token, its next step a decode) advances lazily from now on."""
        s0, c0 = self.steps, r.computed
        r.lazy = s0
        self.n += 1
        self.since += c0 - s0
        self.per_phase[(s0 - c0) % self.block_size] += 1
        left = min(r.target_tokens - r.generated, max_len - len(r.prompt) - r.generated)
        heapq.heappush(self.due, (s0 + left, r.seq, s0, r))
        if r.seq > self.top:
            self.top = r.seq

    def wake(self, r: R) -> None:
        """``r``'s fields as the step path would have them now; it is no longer lazy."""
        s0, c0 = r.lazy, r.computed
        d = self.steps - s0
        self.n -= 1
        self.since -= c0 - s0
        self.per_phase[(s0 - c0) % self.block_size] -= 1
        r.lazy = -1
        if d:
            r.computed = c0 + d
            r.generated += d
            r.blocks = -(-r.computed // self.block_size)
            r.last_token = self.ends[-1]
            assert r.times is not None
            r.times.extend(self.ends[s0 - self.first :])

    def ending(self) -> list[R]:
        """The lazy decodes whose answers end with the step just ticked, woken, in the batch's
        order (their seq)."""
        due, now = self.due, self.steps
        out: list[R] = []
        while due and due[0][0] <= now:
            _, _, s0, r = heapq.heappop(due)
            if r.lazy == s0:  # still lazy since then (a request enters once a step count)
                self.wake(r)
                out.append(r)
        return out

    def wake_all(self, running: Sequence[R]) -> None:
        for r in running:
            if r.lazy >= 0:
                self.wake(r)
        self.due.clear()
        self.top = -1

    def trim(self, running: Sequence[R]) -> None:
        """Forget the step ends no lazy decode needs (a long run keeps the list short)."""
        if len(self.ends) < 1 << 16:
            return
        oldest = min((r.lazy for r in running if r.lazy >= 0), default=self.steps)
        del self.ends[: oldest - self.first]
        self.first = oldest
