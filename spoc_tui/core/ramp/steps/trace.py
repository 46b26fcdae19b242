"""How faithfully a trace replay step kept its schedule."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from spoc_tui.core.ramp.steps.arrivals import Interval3, arrival_rate
from spoc_tui.core.ramp.steps.codec import Json, _obj, json_float, json_int
from spoc_tui.core.ramp.steps.sample import RequestSample

HELD_S = 0.001
"""A turn held back by its parent: sent more than this after its due time."""


def held_back(samples: Iterable[RequestSample]) -> int:
    """The turns of a replay step sent later than their time because their parent had not ended
    (:attr:`TraceFidelity.held_back`), the live replay's and the twin's counted alike."""
    return sum(1 for s in samples if (s.held_s or 0.0) > HELD_S)


@dataclass(frozen=True, slots=True)
class TraceFidelity:
    """How faithfully a replay step kept its trace (``ramp.json``'s ``trace`` per step)."""

    rows: int = 0
    """Rows the step was to send (after the window, the filters and the row cap)."""
    sent: int = 0
    skipped: Mapping[str, int] = field(default_factory=dict)
    """Rows not sent, a count per reason (``longer than max-model-len``, ``client_limit``, ...)."""
    lag_ms: Interval3 = (None, None, None)
    """Send lag (actual minus scheduled send time), milliseconds: p50, p99, max."""
    held_back: int = 0
    """Turns sent later than their time because their parent turn had not finished (plus its
    think time)."""
    rate: float | None = None
    """The achieved arrival rate (requests/s, sends over the step's send span)."""
    trace_rate: float | None = None
    """The trace's arrival rate at this speed (rows over its span divided by the speed)."""
    prefix_share: float | None = None
    """The share of input tokens in blocks an earlier row of the step sent (what the trace
    implies a perfect prefix cache would hit)."""
    server_hit_rate: float | None = None
    """The prefix-cache hit rate the server reported over the step (vLLM's counters)."""
    cached_share: float | None = None
    """The share of prompt tokens the server's answers said were cached (``cached_tokens``)."""
    length_error: Interval3 = (None, None, None)
    """|prompt tokens the server counted - the row's input tokens|, tokens: p50, p99, max."""

    def as_dict(self) -> dict[str, object]:
        def three(v: Interval3) -> dict[str, float | None]:
            return dict(zip(("p50", "p99", "max"), v, strict=True))

        return {
            "rows": self.rows,
            "sent": self.sent,
            "skipped": dict(self.skipped),
            "send_lag_ms": three(self.lag_ms),
            "held_back_by_parent": self.held_back,
            "achieved_rate": self.rate,
            "trace_rate": self.trace_rate,
            "prefix_share_implied": self.prefix_share,
            "prefix_cache_hit_rate_server": self.server_hit_rate,
            "cached_prompt_share_reported": self.cached_share,
            "prompt_length_error_tokens": three(self.length_error),
        }

    @classmethod
    def from_dict(cls, d: Json) -> TraceFidelity:
        def three(k: str) -> Interval3:
            v = _obj(d.get(k))
            return (json_float(v, "p50"), json_float(v, "p99"), json_float(v, "max"))

        skipped = _obj(d.get("skipped"))
        return cls(
            rows=json_int(d, "rows") or 0,
            sent=json_int(d, "sent") or 0,
            skipped={str(k): int(v) for k, v in skipped.items() if isinstance(v, int)},
            lag_ms=three("send_lag_ms"),
            held_back=json_int(d, "held_back_by_parent") or 0,
            rate=json_float(d, "achieved_rate"),
            trace_rate=json_float(d, "trace_rate"),
            prefix_share=json_float(d, "prefix_share_implied"),
            server_hit_rate=json_float(d, "prefix_cache_hit_rate_server"),
            cached_share=json_float(d, "cached_prompt_share_reported"),
            length_error=three("prompt_length_error_tokens"),
        )

    @property
    def text(self) -> str:
        """``sent 412/412 · lag p99 3 ms · 2.0 of 2.0 req/s · prefix 41 % implied, 39 % hit``."""
        parts = [f"sent {self.sent}/{self.rows}"]
        if self.skipped:
            parts.append("skipped " + ", ".join(f"{n} {why}" for why, n in self.skipped.items()))
        if self.lag_ms[1] is not None:
            parts.append(f"lag p99 {self.lag_ms[1]:.0f} ms")
        if self.rate is not None and self.trace_rate is not None:
            parts.append(f"{self.rate:.3g} of {self.trace_rate:.3g} req/s")
        if self.held_back:
            parts.append(f"{self.held_back} held by their parent")
        if self.prefix_share is not None:
            hit = self.server_hit_rate if self.server_hit_rate is not None else self.cached_share
            tail = f", {hit:.0%} hit" if hit is not None else ""
            parts.append(f"prefix {self.prefix_share:.0%} implied{tail}")
        return " · ".join(parts)


def three(values: Sequence[float]) -> Interval3:
    """p50, p99 and the largest of ``values``, to three decimals (None each where there are none)."""
    if not values:
        return (None, None, None)
    p50, p99 = np.percentile(values, [50, 99])
    return (round(float(p50), 3), round(float(p99), 3), round(max(values), 3))


@dataclass(frozen=True, slots=True)
class ReplaySent:
    """What the load generator says of a replay step (:meth:`Backend.replayed`): the rows it was
    to send, sent and skipped, what the trace implies of the prefix cache, and whether it is done
    (every row sent or skipped and every request ended). The driver makes the step's
    :class:`TraceFidelity` of it (:func:`trace_fidelity`) with what it measured itself."""

    rows: int
    """Rows the step was to send (after the window, the filters and the row cap)."""
    sent: int
    skipped: Mapping[str, int]
    due: int
    """The trace's rows over its span (the trace's own arrival rate at this speed)."""
    prefix_share: float | None
    complete: bool
    exact: bool = False
    """A virtual client (the twin's): every row sent at its time and at its length, so its send lag
    and length error are nothing by construction, not measured."""


def trace_fidelity(
    sent: ReplaySent,
    window: Sequence[RequestSample],
    length_s: float,
    server_hit_rate: float | None,
    cached_share: float | None,
) -> TraceFidelity:
    """How faithfully a replay step of ``length_s`` (the rows' span over the speed) kept its trace:
    the load generator's report, and what the step's requests (``window``) show."""
    due = [s for s in window if s.scheduled is not None]
    starts = sorted(s.start for s in due)
    lag: Interval3 = (0.0, 0.0, 0.0)
    length: Interval3 = (0.0, 0.0, 0.0)
    if not sent.exact:
        lag = three([(s.start - s.scheduled - (s.held_s or 0.0)) * 1000 for s in due if s.scheduled is not None])
        length = three(
            [
                float(abs(s.prompt_tokens - s.planned_input))
                for s in due
                if s.ok and s.prompt_tokens is not None and s.planned_input is not None
            ]
        )
    return TraceFidelity(
        rows=sent.rows,
        sent=sent.sent,
        skipped=dict(sent.skipped),
        lag_ms=lag,
        held_back=held_back(due),
        rate=arrival_rate(len(starts), starts[-1] - starts[0]) if starts else None,
        trace_rate=arrival_rate(sent.due, length_s),
        prefix_share=sent.prefix_share,
        server_hit_rate=server_hit_rate,
        cached_share=cached_share,
        length_error=length,
    )
