"""Whether a learner's scrapes are one server's, and its gauges ones a server can report (issue 76,
point 2): the live headroom gives a number only from one server's counters.

- **Counters that go back.** A server's lifetime counters only grow. One going back is a restart:
  the learner forgets what it learned before it and learns again, and says so. Going back twice
  within the traffic's span is more than one server answering at the URL (a load balancer, a
  Kubernetes Service alternating between replicas, two models behind one address): no number,
  with that reason, where the mixed counters read a fleet's traffic as one server's.
- **Gauges no server reports.** A KV cache used past its whole (a share above 1), more requests
  running than the seats the operator told: the window is refused with its reason, not fitted.
- **A queue that is not at the seats.** Requests wait only once the seats are full (or the KV
  cache is): the running count at every queued scrape is then the same, the seats. A waiting
  count beside running counts that range widely is no such queue (a gauge stuck at 3 read as
  seats seen put a headroom at x1.38 for x3.7): the seats are not inferred from it, and the
  assumption says why.
"""

from __future__ import annotations

from collections import deque

BACK_BY = 0.5
"""A counter that reads this much less than at the scrape before went back (not a float's noise)."""
QUEUE_SPREAD = 0.8
"""Queued scrapes whose running counts range wider than this (the least over the most) are no
queue at the seats."""


class OneServer:
    """A learner's scrapes, checked for being one server's, scrape by scrape."""

    def __init__(self, span_s: float) -> None:
        self.span_s = span_s
        self.backs: deque[float] = deque()
        """When the counters went back (or the model changed), over the traffic's span."""
        self.restarted_at: float | None = None
        self._done: float | None = None
        self._models: tuple[str, ...] | None = None

    def see(self, t: float, done: float | None) -> bool:
        """One scrape's requests finished so far; True where they went back (the caller starts
        over: what it learned was another server's, or this one's before a restart)."""
        back = done is not None and self._done is not None and done < self._done - BACK_BY
        if done is not None:
            self._done = done
        return self._went_back(t) if back else False

    def models(self, t: float, names: tuple[str, ...]) -> bool:
        """The models a window's scrape names; True where they changed (as :meth:`see`)."""
        changed = bool(names) and self._models is not None and names != self._models
        if names:
            self._models = names
        return self._went_back(t) if changed else False

    def _went_back(self, t: float) -> bool:
        self.backs.append(t)
        while self.backs and t - self.backs[0] > self.span_s:
            self.backs.popleft()
        self.restarted_at = t
        return True

    def mixed(self, now: float) -> str | None:
        """Why these are not one server's scrapes, or None."""
        recent = [b for b in self.backs if now - b <= self.span_s]
        if len(recent) < 2:
            return None
        mins = max(1.0, (now - recent[0]) / 60)
        return (
            f"its counters went back {len(recent)} times in {mins:.0f} min: more than one server "
            "answers at this URL (a load balancer, a Kubernetes Service, two models behind one address); "
            "watch each replica at its own URL"
        )

    def restarted(self, now: float) -> str | None:
        """What to say of a restart within the traffic's span, or None."""
        if self.restarted_at is None or now - self.restarted_at > self.span_s:
            return None
        mins = (now - self.restarted_at) / 60
        return f"the server restarted {mins:.0f} min ago (its counters went back); learning again"


def gauge_error(running: float | None, kv: float | None, told_seats: int | None) -> str | None:
    """Why a window's gauges are none a server reports (its window refused), or None."""
    if kv is not None and kv > 1.0 + 1e-6:
        return f"its KV-cache use reads {kv:.3g}, where a share of the cache is at most 1"
    if running is not None and told_seats is not None and running > told_seats + 0.5:
        return f"it reports {running:.0f} requests running, more than the max-num-seqs it was told ({told_seats})"
    return None


class QueueSeats:
    """The seats (max-num-seqs) a queue shows: the running count at scrapes where requests
    waited while the KV cache had room, taken only where those counts agree."""

    def __init__(self, keep: int = 16) -> None:
        self.queued: deque[float] = deque(maxlen=keep)

    def see(self, running: float | None, waiting: float | None, kv: float | None) -> None:
        if running and waiting and waiting >= 1 and (kv is None or kv < 0.9):
            self.queued.append(running)

    @property
    def seats(self) -> int | None:
        if not self.queued or min(self.queued) < QUEUE_SPREAD * max(self.queued):
            return None
        return round(max(self.queued))

    @property
    def odd(self) -> str | None:
        """Why the queue seen is not taken as the seats, or None."""
        if len(self.queued) < 2 or min(self.queued) >= QUEUE_SPREAD * max(self.queued):
            return None
        return (
            f"requests waited while {min(self.queued):.0f}-{max(self.queued):.0f} ran: no queue at the seats "
            "(a waiting gauge that never moves?), so they are not taken from it"
        )
