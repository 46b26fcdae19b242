"""What the server and its GPUs did during a step, and whether its queue grew without bound."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spoc_tui.core.ramp.steps.codec import Json, _obj, json_float


@dataclass(frozen=True, slots=True)
class GpuWindow:
    """One GPU as dcgm-exporter showed it at the end of the step's window."""

    gpu: str
    uuid: str | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    throttle_reasons: tuple[str, ...] = ()
    throttled_pct: tuple[tuple[str, float], ...] = ()
    """(reason, % of the window throttled for it)."""

    THROTTLING = ("sw_thermal", "hw_thermal", "sw_power", "hw_power", "hw_slowdown")

    @property
    def throttled(self) -> bool:
        return any(r in self.THROTTLING for r in self.throttle_reasons)

    def as_dict(self) -> dict[str, object]:
        return {
            "gpu": self.gpu,
            "uuid": self.uuid,
            "sm_clock_mhz": self.sm_clock_mhz,
            "sm_clock_max_mhz": self.sm_clock_max_mhz,
            "temp_c": self.temp_c,
            "power_w": self.power_w,
            "throttle_reasons": list(self.throttle_reasons),
            "throttled_pct": dict(self.throttled_pct) if self.throttled_pct else None,
        }

    @classmethod
    def from_dict(cls, d: Json) -> GpuWindow:
        reasons = d.get("throttle_reasons")
        pct = _obj(d.get("throttled_pct"))
        return cls(
            gpu=str(d.get("gpu", "?")),
            uuid=str(d["uuid"]) if d.get("uuid") else None,
            sm_clock_mhz=json_float(d, "sm_clock_mhz"),
            sm_clock_max_mhz=json_float(d, "sm_clock_max_mhz"),
            temp_c=json_float(d, "temp_c"),
            power_w=json_float(d, "power_w"),
            throttle_reasons=tuple(str(r) for r in reasons) if isinstance(reasons, list) else (),
            throttled_pct=tuple((str(k), float(v)) for k, v in pct.items() if isinstance(v, (int, float))),
        )


@dataclass(frozen=True, slots=True)
class ServerWindow:
    """The server's own view of a step's window (its /metrics, and the GPUs when DCGM was given):
    queue, KV cache, preemptions, its own TTFT/ITL p99 (histogram), GPU clocks and throttling."""

    seen: bool = False
    """Whether the server's /metrics was read (the figures below are None otherwise)."""
    waiting: float | None = None
    waiting_max: float | None = None
    waiting_mean: float | None = None
    """The mean queue over the window's polls: the autoscaling target ``spoc plan`` reads."""
    running_max: float | None = None
    kv_cache_usage_max: float | None = None
    preemptions_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    prefix_cache_hit_rate: float | None = None
    ttft_p99: float | None = None
    itl_p99: float | None = None
    bounded: tuple[str, ...] = ()
    """Which of the p99s are upper bounds from the histogram's mean, not interpolations."""
    window: str | None = None
    gpus: tuple[GpuWindow, ...] | None = None
    """None when no DCGM exporter was given."""

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {}
        if self.seen:
            out = {
                "waiting": self.waiting,
                "waiting_max": self.waiting_max,
                "running_max": self.running_max,
                "kv_cache_usage_max": self.kv_cache_usage_max,
                "preemptions_per_s": self.preemptions_per_s,
                "generation_tokens_per_s": self.generation_tokens_per_s,
                "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
                "ttft_p99": self.ttft_p99,
                "itl_p99": self.itl_p99,
                "bounded": list(self.bounded),
                "window": self.window,
            }
        if self.gpus is not None:
            out["gpus"] = [g.as_dict() for g in self.gpus]
        if self.waiting_mean is not None:
            out["waiting_mean"] = self.waiting_mean
        return out

    @classmethod
    def from_dict(cls, d: Json) -> ServerWindow:
        gpus = d.get("gpus")
        bounded = d.get("bounded")
        return cls(
            seen=any(k in d for k in ("waiting", "waiting_max", "running_max", "kv_cache_usage_max")),
            waiting=json_float(d, "waiting"),
            waiting_max=json_float(d, "waiting_max"),
            waiting_mean=json_float(d, "waiting_mean"),
            running_max=json_float(d, "running_max"),
            kv_cache_usage_max=json_float(d, "kv_cache_usage_max"),
            preemptions_per_s=json_float(d, "preemptions_per_s"),
            generation_tokens_per_s=json_float(d, "generation_tokens_per_s"),
            prefix_cache_hit_rate=json_float(d, "prefix_cache_hit_rate"),
            ttft_p99=json_float(d, "ttft_p99"),
            itl_p99=json_float(d, "itl_p99"),
            bounded=tuple(str(b) for b in bounded) if isinstance(bounded, list) else (),
            window=str(d["window"]) if d.get("window") is not None else None,
            gpus=tuple(GpuWindow.from_dict(_obj(g)) for g in gpus) if isinstance(gpus, list) else None,
        )


QUEUE_MIN_SPAN_S = 10.0
QUEUE_MIN_POINTS = 8
QUEUE_MIN_RISES = 3
"""Poll-to-poll increases a growing queue shows at least (one burst is one rise)."""


def queue_unbounded(points: Sequence[tuple[float, float]]) -> str | None:
    """Why the server's queue is growing without bound during a step, or None.

    ``points`` are (seconds into the measured window, requests waiting). The rule: over at least
    10 s and 8 polls, the least-squares trend adds at least max(5, half the starting queue)
    requests over the span, at least 70 % of poll-to-poll changes are not decreases, and the
    later half of the window still grows (by at least a quarter as much per second, and at least
    2 requests), and it rose at least :data:`QUEUE_MIN_RISES` times, at least 70 % of its moves
    up: a queue that rises and settles at a level is not unbounded, nor is one that is empty at
    every poll but the last two (users in lockstep, whose prefill bursts a poll catches or
    misses: unchanged polls count as "not decreasing", and two late rises made a trend). The
    monitor's "queue keeps growing" alert is the same idea on a shorter history.
    """
    if len(points) < QUEUE_MIN_POINTS:
        return None
    ts = np.asarray([p[0] for p in points], dtype=float)
    ws = np.asarray([p[1] for p in points], dtype=float)
    moves = np.diff(ws)
    return unbounded_of(ts, ws, int(np.sum(moves > 0)), int(np.sum(moves < 0)))


def unbounded_of(
    times: Sequence[float] | np.ndarray, waiting: Sequence[float] | np.ndarray, rises: int, falls: int
) -> str | None:
    """:func:`queue_unbounded` of the readings' times and queues (at least :data:`QUEUE_MIN_POINTS`),
    given how many poll-to-poll changes rose and fell (a watch that counts them as they come:
    :class:`~spoc_tui.core.ramp.experiment.QueueWatch`; the readings laid out as arrays only past
    the checks those counts and the span decide)."""
    span = float(times[-1] - times[0])
    if span < QUEUE_MIN_SPAN_S:
        return None
    steady = 1.0 - falls / (len(waiting) - 1)  # the share of poll-to-poll changes that are not decreases
    if rises < QUEUE_MIN_RISES or rises < 0.7 * (rises + falls):
        return None
    ts, ws = np.asarray(times, dtype=float), np.asarray(waiting, dtype=float)
    slope = float(np.polyfit(ts, ws, 1)[0])
    growth = slope * span
    start = float(np.mean(ws[: max(1, len(ws) // 4)]))
    half = len(ts) // 2
    late_slope = float(np.polyfit(ts[half:], ws[half:], 1)[0])
    late_growth = late_slope * float(ts[-1] - ts[half])
    if growth >= max(5.0, 0.5 * start) and steady >= 0.7 and late_slope >= 0.25 * slope and late_growth >= 2.0:
        return f"queue unbounded: waiting grew {ws[0]:.0f} -> {ws[-1]:.0f} in {span:.0f} s ({slope:.1f}/s)"
    return None
