"""What a headroom's replays say beyond their knee: the point over the fit's and its draws'
replays, the interval widened by the windows' own scatter, what it assumes of the seats, and the
requests no replay can run (issue 52's parts of :func:`spoc_tui.twin.headroom.headroom_of`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, ClassVar, Protocol, TypeVar

from spoc_tui.core.ramp.experiment import Measured
from spoc_tui.core.traces.read import TraceRow
from spoc_tui.twin.model import ServerConfig


class _Estimate(Protocol):
    """A headroom as :func:`seats_range` reads it (:class:`~spoc_tui.twin.headroom.Headroom`)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def estimate(self) -> float | None: ...
    @property
    def ci95(self) -> tuple[float | None, float | None]: ...
    @property
    def reason(self) -> str: ...
    @property
    def identified(self) -> bool: ...


H = TypeVar("H", bound=_Estimate)

TOO_BIG_SHARE = 0.05
"""The share of a replay's requests that may be longer than the whole KV cache (left out, and
said) before the headroom gives no number: the traffic the server ran cannot be replayed on the
cache it reports."""


def beyond_the_cache(rows: Sequence[TraceRow], server: ServerConfig) -> tuple[int, int]:
    """How many of ``rows`` need more blocks than the whole KV cache holds (an engine refuses
    them: issue 74), and of how many."""
    bs, blocks = server.block_size, server.num_gpu_blocks
    big = sum(1 for r in rows if -(-(r.input_tokens + max(1, r.output_tokens)) // bs) > blocks)
    return big, len(rows)


def replay_peak(runs: Sequence[Measured], speed: float) -> int | None:
    """The most requests the replay ran at once at the speeds up to ``speed`` (the slowest's where
    none is under it), or None where no run counted them."""
    below = [r for r in runs if r.step.speed is not None and r.step.speed <= speed * (1 + 1e-9)]
    if not below and runs:
        below = [min(runs, key=lambda r: r.step.speed or 0.0)]
    peaks = [r.engine.running_peak for r in below if r.engine is not None and r.engine.running_peak is not None]
    return max(peaks) if peaks else None


def seats_range(point: H, seen: H, seen_seats: int, assumed_seats: int) -> H:
    """A headroom whose seats were not seen (issue 76, point 1): ``point`` replayed with vLLM's
    default ``assumed_seats``, ``seen`` with the most requests the server was seen running at
    once. The seats lie between, and the knee with them: the interval covers both replays' (their
    knees and intervals), the point stays the default's and the reason says what the other end
    read. (A server with 48 seats, never filled, untold: the default's replay read x4.5 (95 %:
    3.7-5.5) where a ramp measured x1.4.)"""
    if not seen.identified or seen.estimate is None or point.estimate is None:
        return point
    if seen.ci95[1] is None:  # the seats seen met the SLA at every speed too: they do not bind
        return replace(point, assumed=(f"max-num-seqs {seen_seats} or more",), seats_peak=None)
    lows = [v for v in (seen.ci95[0], seen.estimate, point.ci95[0]) if v is not None]
    hi = point.ci95[1]
    why = (
        f"{point.reason}; max-num-seqs not seen: the {'point' if hi is not None else 'bound'} takes vLLM's default "
        f"{assumed_seats}, and the interval reaches down to x{seen.estimate:.2g}, the knee with {seen_seats} seats "
        "(the most seen running at once): tell --max-num-seqs to narrow it"
    )
    seats = f"max-num-seqs {seen_seats}-{assumed_seats}"
    return replace(point, ci95=(min(lows), hi), reason=why, assumed=(seats,), seats_peak=None)


def seats_assumed(seats: int, runs: Sequence[Measured], speed: float) -> str:
    """What the headroom assumes of the seats it was not told: the most requests its replay ran at
    once at the speeds up to ``speed`` ("max-num-seqs 70 or more": a server with fewer would have
    queued where the replay did not), or ``seats`` where the replay filled them.

    A user's run found the difference (2026-11-30): the assumed 256 seats said nothing of whether
    they mattered; the server had 48, the replay ran more at once, and the headroom read 41 % high."""
    peak = replay_peak(runs, speed)
    if peak is None or peak >= seats:
        return f"max-num-seqs {seats}"
    return f"max-num-seqs {peak} or more"


def replays_median(estimate: float, knees: Sequence[float | None]) -> tuple[float, int]:
    """The headroom's point: the median knee of the fit's replay and its draws' (each draw replays
    a sample of the traffic of its own, :meth:`TrafficRows.redrawn`), and how many it took; the
    draws that put the knee beyond the speeds replayed are left out.

    One replay's knee moves with its sample of the traffic (two minutes of it: a few long prompts
    more or less): on the simulated L40S the fit's replay and its four draws read x4.9-7.0 of one
    traffic, on the A100's flat traffic x4.4-5.1 (the knees measured x4.91 and x5.02); with the
    lengths at stratified quantiles (:func:`strata`) and the ridge's tokens from the replay's
    shape, the L40S's x4.7-5.6."""
    found = [k for k in knees if k is not None and k > 0]
    return statistics.median([estimate, *found]), 1 + len(found)


MAD_SD = 1.4826
"""A normal spread's standard deviation over its median absolute deviation."""


def with_scatter(
    estimate: float, ci95: tuple[float | None, float | None], residual_pct: float
) -> tuple[tuple[float | None, float | None], float]:
    """The knee's interval as a prediction of the knee a ramp would measure: the draws' interval
    (what the fit is unsure of) and the windows' own scatter about the fitted model (how far a
    window's mean step lies from it: a step's noise, what the model leaves out, the host's own
    speed moving), added in quadrature on a log scale, a step time so many per cent slower taken
    as a knee so many per cent lower. Returns the interval and the scatter's 95 % half-width in
    per cent (0 where the windows gave none).

    Without it the interval said what the fit knew and not what a ramp would meet: on the real
    CPU server, whose windows lay 6.4 % (median) from the model and whose speed moved 19 % in
    minutes, three runs in one day measured its knee at x4.6, x5.4 and x6.3, and their headroom
    intervals were 7 to 23 % wide (the first two missed)."""
    if not math.isfinite(residual_pct) or residual_pct <= 0 or estimate <= 0:
        return ci95, 0.0
    spread = 1.96 * MAD_SD * residual_pct / 100.0
    lo, hi = ci95

    def wider(end: float | None, sign: float) -> float | None:
        if end is None or end <= 0:
            return end
        return estimate * math.exp(sign * math.hypot(math.log(end / estimate), spread))

    return (wider(lo, -1.0), wider(hi, 1.0)), 100.0 * (math.exp(spread) - 1.0)
