"""How bunched a step's arrivals came."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spoc_tui.core.ramp.steps.codec import Json, json_float, json_int

ARRIVAL_BIN_S = 0.05
"""Arrivals are counted in bins of 50 ms: about a prefill's length, so requests that arrive in
one bin share the prefill of one engine step."""
LOCKSTEP_SYNC = 2.0
"""Arrivals twice as bunched as independent ones (and in bursts of 3 or more) are in lockstep:
enough to move TTFT, as bursts of prefills queue behind each other."""
MIN_ARRIVALS = 20


@dataclass(frozen=True, slots=True)
class Arrivals:
    """How bunched a step's request arrivals were. Closed-loop users with fixed output lengths
    that start together stay in lockstep (they finish in the same engine step, so their next
    prefills collide); the peers' probes start every stream at once."""

    synchronization: float | None = None
    """The variance-to-mean ratio of arrival counts per :data:`ARRIVAL_BIN_S` (1.0: as
    independent arrivals at the same rate; larger: bunched); None under :data:`MIN_ARRIVALS`."""
    burst: int = 0
    """The most arrivals in one bin."""
    lockstep: bool = False
    n: int = 0

    @property
    def text(self) -> str:
        """``arrivals in lockstep: prefill bursts of 16`` (or empty when not)."""
        return f"arrivals in lockstep: prefill bursts of {self.burst}" if self.lockstep else ""

    def as_dict(self) -> dict[str, object]:
        return {"synchronization": self.synchronization, "burst": self.burst, "lockstep": self.lockstep, "n": self.n}

    @classmethod
    def from_dict(cls, d: Json) -> Arrivals:
        return cls(
            json_float(d, "synchronization"),
            json_int(d, "burst") or 0,
            d.get("lockstep") is True,
            json_int(d, "n") or 0,
        )


def arrivals(starts: Sequence[float]) -> Arrivals:
    """How bunched these request start times are (see :class:`Arrivals`)."""
    n = len(starts)
    if n < MIN_ARRIVALS:
        return Arrivals(n=n)
    t0, t1 = min(starts), max(starts)
    bins = max(1, math.ceil((t1 - t0) / ARRIVAL_BIN_S))
    counts = np.bincount(np.minimum(((np.asarray(starts) - t0) / ARRIVAL_BIN_S).astype(int), bins - 1), minlength=bins)
    mean = float(counts.mean())
    sync = float(counts.var()) / mean if mean > 0 else None
    burst = int(counts.max())
    return Arrivals(sync, burst, sync is not None and sync >= LOCKSTEP_SYNC and burst >= 3, n)


Interval3 = tuple[float | None, float | None, float | None]


def arrival_rate(count: int, span_s: float) -> float | None:
    """Requests per second of ``count`` arrivals spread over ``span_s`` seconds (first to last),
    to 4 decimals; None for fewer than two or no span."""
    return round((count - 1) / span_s, 4) if count > 1 and span_s > 0 else None
