"""A ramp step, measured: the client's figures with their intervals, the SLA verdict, the
server's window and the load generator's health, as frozen values.

Metric definitions follow ``vllm bench serve``:
- TTFT: first content-bearing chunk minus send time.
- ITL: gaps between consecutive content chunks, pooled over all requests.
- TPOT: per request, (E2E - TTFT) / (output tokens - 1), output tokens from ``usage``.
- E2E: last byte minus send time.
- Percentiles: numpy's linear interpolation over the raw samples of the step.
- Goodput: requests per second whose TTFT, TPOT and E2E all meet the SLA limits given for
  them (an ITL limit is held against the request's TPOT, its mean inter-token gap).

Every value here writes itself as the dict ``ramp.json`` has always held (``as_dict``) and
reads itself back from any such dict, old or new (``from_dict``); :mod:`spoc_tui.core.results`
is the file codec around them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from spoc_tui.core.confidence import (
    Decision,
    Interval,
    Resampler,
    decide,
    hull,
    min_samples_for_upper_bound,
    proportion_interval,
    quantile_interval,
)
from spoc_tui.core.sla import PERCENTILE_Q, LevelUnit, Limit, level_text

Json = Mapping[str, object]
"""A decoded JSON object as a reader receives it (values unchecked)."""


def json_float(d: Json, k: str) -> float | None:
    """``d[k]`` when it is a number (not a bool), else None: how every result reader takes a figure."""
    v = d.get(k)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def json_int(d: Json, k: str) -> int | None:
    """``d[k]`` as a whole number when it is a number (not a bool), else None."""
    v = d.get(k)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _obj(v: object) -> Json:
    return v if isinstance(v, Mapping) else {}


def json_interval(v: object) -> Interval:
    """``[lo, hi]`` as written (a side null where it was not bounded) as an interval."""
    if isinstance(v, (list, tuple)) and len(v) == 2:
        lo, hi = v
        return (
            float(lo) if isinstance(lo, (int, float)) and not isinstance(lo, bool) else None,
            float(hi) if isinstance(hi, (int, float)) and not isinstance(hi, bool) else None,
        )
    return None, None


def _decision(v: object) -> Decision:
    if v == "meets":
        return "meets"
    return "breaks" if v == "breaks" else "inconclusive"


@dataclass(frozen=True, slots=True)
class RequestSample:
    """One request as the client saw it (seconds, wall clock for ``start``)."""

    start: float
    step: int
    users: int
    ok: bool
    ttft: float | None = None
    e2e: float | None = None
    itl: tuple[float, ...] = ()
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None
    """Kind: timeout, connect, http_4xx, http_5xx, stream, ..."""
    conversation: str = ""
    turn: int = 0
    request_id: str | None = None
    """The server's response id (``chatcmpl-...``)."""
    end: float | None = None
    """Wall time the request finished (steps count requests by when they finished)."""
    trace_index: int | None = None
    """Trace replay: the row's index among the trace's rows (0-based)."""
    scheduled: float | None = None
    """Trace replay: the planned send time (wall clock, as ``start``)."""
    planned_input: int | None = None
    """Trace replay: the row's input tokens (what ``prompt_tokens`` should come to)."""
    held_s: float | None = None
    """Trace replay: how long the row waited past its time for its parent turn to finish."""

    @property
    def tpot(self) -> float | None:
        if self.e2e is None or self.ttft is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def as_dict(self) -> dict[str, object]:
        return {
            "start": self.start,
            "step": self.step,
            "users": self.users,
            "ok": self.ok,
            "ttft": self.ttft,
            "e2e": self.e2e,
            "tpot": self.tpot,
            "itl": list(self.itl),
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "error": self.error,
            "conversation": self.conversation,
            "turn": self.turn,
            "request_id": self.request_id,
            "end": self.end,
            **(
                {
                    "trace_index": self.trace_index,
                    "scheduled": self.scheduled,
                    "planned_input": self.planned_input,
                    "held_s": self.held_s,
                }
                if self.trace_index is not None
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> RequestSample:
        itl = d.get("itl") or []
        return cls(
            start=json_float(d, "start") or 0.0,
            step=json_int(d, "step") or 0,
            users=json_int(d, "users") or 0,
            ok=bool(d.get("ok")),
            ttft=json_float(d, "ttft"),
            e2e=json_float(d, "e2e"),
            itl=tuple(float(x) for x in itl) if isinstance(itl, list) else (),
            output_tokens=json_int(d, "output_tokens"),
            prompt_tokens=json_int(d, "prompt_tokens"),
            cached_tokens=json_int(d, "cached_tokens"),
            error=str(d["error"]) if d.get("error") else None,
            conversation=str(d.get("conversation", "")),
            turn=json_int(d, "turn") or 0,
            request_id=str(d["request_id"]) if d.get("request_id") else None,
            end=json_float(d, "end"),
            trace_index=json_int(d, "trace_index"),
            scheduled=json_float(d, "scheduled"),
            planned_input=json_int(d, "planned_input"),
            held_s=json_float(d, "held_s"),
        )


STAT_NAMES = ("p50", "p90", "p95", "p99", "mean")


@dataclass(frozen=True, slots=True)
class Figures:
    """One latency metric of a step: its percentiles and mean (seconds), how many samples they rest
    on, and each one's 95 % interval (a side ``None`` where the sample cannot bound it)."""

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    mean: float | None = None
    count: int = 0
    """Values the figures were computed from (requests, or ITL gaps)."""
    n: int = 0
    """The sample size (as ``count``; kept apart in ramp.json for readers of either key)."""
    requests: int | None = None
    """Pooled metrics (ITL): the requests the gaps came from, the independent units."""
    ci95: tuple[tuple[str, Interval], ...] = ()
    """(statistic, interval) for p50, p90, p95, p99 and mean."""

    def stat(self, name: str) -> float | None:
        """``p99`` -> the figure (None for an unknown name)."""
        return getattr(self, name) if name in STAT_NAMES else None

    def interval(self, name: str) -> Interval:
        return next((ci for k, ci in self.ci95 if k == name), (None, None))

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {k: self.stat(k) for k in ("p50", "p90", "p95", "p99", "mean")}
        out["count"] = self.count
        out["n"] = self.n
        if self.requests is not None:
            out["requests"] = self.requests
        out["ci95"] = {k: list(ci) for k, ci in self.ci95}
        return out

    @classmethod
    def from_dict(cls, d: Json) -> Figures:
        ci = _obj(d.get("ci95"))
        return cls(
            p50=json_float(d, "p50"),
            p90=json_float(d, "p90"),
            p95=json_float(d, "p95"),
            p99=json_float(d, "p99"),
            mean=json_float(d, "mean"),
            count=json_int(d, "count") or 0,
            n=json_int(d, "n") if json_int(d, "n") is not None else (json_int(d, "count") or 0),  # type: ignore[arg-type]
            requests=json_int(d, "requests"),
            ci95=tuple((k, json_interval(ci[k])) for k in STAT_NAMES if k in ci),
        )


@dataclass(frozen=True, slots=True)
class Latency:
    """The step's four latency metrics."""

    ttft: Figures = Figures()
    itl: Figures = Figures()
    tpot: Figures = Figures()
    e2e: Figures = Figures()

    def of(self, metric: str) -> Figures:
        """``ttft`` -> its figures (empty figures for a metric that is not latency)."""
        return getattr(self, metric) if metric in ("ttft", "itl", "tpot", "e2e") else Figures()

    def as_dict(self) -> dict[str, object]:
        return {m: self.of(m).as_dict() for m in ("ttft", "itl", "tpot", "e2e")}

    @classmethod
    def from_dict(cls, d: Json) -> Latency:
        return cls(*(Figures.from_dict(_obj(d.get(m))) for m in ("ttft", "itl", "tpot", "e2e")))


@dataclass(frozen=True, slots=True)
class Totals:
    """95 % intervals of the step's totals over its window."""

    request_rate: Interval = (None, None)
    output_tokens_per_s: Interval = (None, None)
    goodput: Interval = (None, None)
    error_rate: Interval = (None, None)

    def as_dict(self) -> dict[str, object]:
        return {k: list(getattr(self, k)) for k in ("request_rate", "output_tokens_per_s", "goodput", "error_rate")}

    @classmethod
    def from_dict(cls, d: Json) -> Totals:
        return cls(*(json_interval(d.get(k)) for k in ("request_rate", "output_tokens_per_s", "goodput", "error_rate")))


@dataclass(frozen=True, slots=True)
class Check:
    """One limit held against the step: the figure, its interval and the decision."""

    key: str
    """The limit's name (``ttft_p99``, ``error_rate``, or ``queue_unbounded``)."""
    value: float | None
    limit: float | None
    """The limit (seconds, or a fraction for the error rate); None for the queue rule."""
    ci95: Interval
    decision: Decision
    reason: str = ""
    """Why, for a rule that is not a figure against a limit (the queue grew without bound)."""

    @property
    def is_rate(self) -> bool:
        return self.key == "error_rate"

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "value": self.value,
            "limit": self.limit,
            "ci95": list(self.ci95),
            "decision": self.decision,
            "ok": self.decision == "meets",
        }
        if self.reason:
            out["reason"] = self.reason
        return out

    @classmethod
    def from_dict(cls, key: str, d: Json) -> Check:
        return cls(
            key,
            json_float(d, "value"),
            json_float(d, "limit"),
            json_interval(d.get("ci95")),
            _decision(d.get("decision")),
            str(d.get("reason") or ""),
        )


@dataclass(frozen=True, slots=True)
class StepVerdict:
    """The step's decision on the SLA: ``meets`` when every limit's interval lies within it,
    ``breaks`` when some limit's interval lies wholly beyond it, else ``inconclusive`` with the
    reason."""

    decision: Decision = "inconclusive"
    checks: tuple[Check, ...] = ()
    broken_limit: str | None = None
    worst_ratio: float | None = None
    """How many times over its limit the breaking figure surely is (its interval's low end)."""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.decision == "meets"

    def check(self, key: str) -> Check | None:
        return next((c for c in self.checks if c.key == key), None)

    def broken_by_queue(self, why: str) -> StepVerdict:
        """This verdict overruled by a queue that grew without bound (a break, whatever the figures)."""
        return replace(
            self,
            decision="breaks",
            broken_limit="queue_unbounded",
            reason=why,
            checks=(*self.checks, Check("queue_unbounded", None, None, (None, None), "breaks", why)),
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "decision": self.decision,
            "checks": {c.key: c.as_dict() for c in self.checks},
            "broken_limit": self.broken_limit,
            "worst_ratio": self.worst_ratio,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: Json) -> StepVerdict:
        checks = _obj(d.get("checks"))
        b = d.get("broken_limit")
        return cls(
            decision=_decision(d.get("decision")),
            checks=tuple(Check.from_dict(str(k), _obj(v)) for k, v in checks.items()),
            broken_limit=str(b) if b else None,
            worst_ratio=json_float(d, "worst_ratio"),
            reason=str(d.get("reason") or ""),
        )


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


@dataclass(frozen=True, slots=True)
class ProcessHealth:
    """One load-generator process over a step's window."""

    name: str
    cpu_pct: float | None = None
    """CPU use in % of one core."""
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None


CLIENT_LAG_P99_MS = 1.0
CLIENT_LAG_SHARE = 0.02
CLIENT_CPU_PCT = 90.0
"""A load-generator process that used more than 90 % of a core (Locust's own warning), or whose
event loop woke late at the 99th percentile by more than 2 % of the smallest latency limit being
judged (at least 1 ms; 1 ms without a latency limit), timestamped chunks late enough to move a
verdict: its latencies are not trustworthy. A 1.5 ms lag against a 400 ms limit is not."""


def lag_allowed_ms(limits: Sequence[Limit]) -> float:
    """The loop lag (p99, ms) a load generator may have before its timing error matters against
    ``limits``: 2 % of the smallest latency limit, at least 1 ms."""
    latency = [lim.value for lim in limits if lim.metric != "error_rate"]
    return max(CLIENT_LAG_P99_MS, CLIENT_LAG_SHARE * min(latency) * 1000) if latency else CLIENT_LAG_P99_MS


@dataclass(frozen=True, slots=True)
class ClientHealth:
    """How the load generator's processes fared over a step's window (:func:`client_health`)."""

    processes: tuple[ProcessHealth, ...] = ()
    cpu_pct: float | None = None
    """The busiest process's CPU use."""
    loop_lag_p99_ms: float | None = None
    """The worst process's event-loop lag p99."""
    saturated: bool = False
    reason: str = ""

    @property
    def saturated_text(self) -> str | None:
        """``client saturated: timings not trustworthy (...)`` with the remedy, or None."""
        if not self.saturated:
            return None
        return f"client saturated: timings not trustworthy ({self.reason}); add load-generator processes (--workers)"

    def as_dict(self) -> dict[str, object]:
        if not self.processes:
            return {}
        return {
            "processes": {
                p.name: {
                    "cpu_pct": p.cpu_pct,
                    "loop_lag_p99_ms": p.loop_lag_p99_ms,
                    "loop_lag_max_ms": p.loop_lag_max_ms,
                }
                for p in self.processes
            },
            "cpu_pct": self.cpu_pct,
            "loop_lag_p99_ms": self.loop_lag_p99_ms,
            "saturated": self.saturated,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: Json) -> ClientHealth:
        procs = _obj(d.get("processes"))
        return cls(
            processes=tuple(
                ProcessHealth(
                    str(k),
                    json_float(_obj(v), "cpu_pct"),
                    json_float(_obj(v), "loop_lag_p99_ms"),
                    json_float(_obj(v), "loop_lag_max_ms"),
                )
                for k, v in procs.items()
            ),
            cpu_pct=json_float(d, "cpu_pct"),
            loop_lag_p99_ms=json_float(d, "loop_lag_p99_ms"),
            saturated=bool(d.get("saturated")),
            reason=str(d.get("reason") or ""),
        )


def client_health(
    points: Sequence[tuple[str, float, float, Sequence[float]]], limits: Sequence[Limit] = ()
) -> ClientHealth:
    """How the load generator's processes fared over a step's window, from their once-a-second
    reports ``(process, wall time, CPU seconds so far, loop lags in ms)``: CPU use in % of a core,
    loop lag p99 and max per process, and whether any was saturated for the ``limits`` judged
    (:func:`lag_allowed_ms`), and why."""
    by: dict[str, list[tuple[float, float, Sequence[float]]]] = {}
    for proc, t, cpu, lags in points:
        by.setdefault(proc, []).append((t, cpu, lags))
    procs: list[ProcessHealth] = []
    for proc, pts in by.items():
        pts.sort(key=lambda p: p[0])
        span = pts[-1][0] - pts[0][0]
        cpu_pct = 100 * (pts[-1][1] - pts[0][1]) / span if len(pts) > 1 and span > 0 else None
        lags = [x for p in pts[1:] for x in p[2]] if len(pts) > 1 else [x for p in pts for x in p[2]]
        procs.append(
            ProcessHealth(
                proc,
                cpu_pct,
                float(np.percentile(lags, 99)) if lags else None,
                max(lags) if lags else None,
            )
        )
    if not procs:
        return ClientHealth()
    worst_cpu = max((p.cpu_pct for p in procs if p.cpu_pct is not None), default=None)
    worst_lag = max((p.loop_lag_p99_ms for p in procs if p.loop_lag_p99_ms is not None), default=None)
    why = []
    if worst_cpu is not None and worst_cpu > CLIENT_CPU_PCT:
        why.append(f"CPU {worst_cpu:.0f} % of a core")
    allowed = lag_allowed_ms(limits)
    if worst_lag is not None and worst_lag > allowed:
        why.append(f"event-loop lag p99 {worst_lag:.1f} ms, over the {allowed:.1f} ms that matters to the SLA")
    return ClientHealth(tuple(procs), worst_cpu, worst_lag, bool(why), ", ".join(why))


@dataclass(frozen=True, slots=True)
class EarlyStop:
    """A step ended before its planned length: a tuning trial's, clearly dominated by the front
    (``stopped_early``: the trial ends), or a knee search's, its next level already plain
    (``settled_early``: the search goes on)."""

    reason: str
    saved_s: float
    """The planned measurement it did not spend."""

    def as_dict(self) -> dict[str, object]:
        return {"reason": self.reason, "saved_s": self.saved_s}


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


@dataclass(frozen=True, slots=True)
class StepSummary:
    """One ramp step as measured, judged and seen by the server; nothing is set after it is built."""

    step: int
    users: int
    duration_s: float
    requests: int
    errors: int
    errors_by_kind: Mapping[str, int]
    request_rate: float
    output_tokens_per_s: float
    goodput: float
    latency: Latency
    cached_prompt_fraction: float | None
    verdict: StepVerdict = StepVerdict()
    server: ServerWindow = ServerWindow()
    ci95: Totals = Totals()
    extended_s: float = 0.0
    """Seconds the step was measured beyond its planned length to reach a decision."""
    drained_s: float = 0.0
    """After a step down: seconds the step waited, before its warm-up, for the requests the last
    level sent to end (they queue the new level's requests behind the last level's load)."""
    client: ClientHealth = ClientHealth()
    rate: float | None = None
    """Open-loop steps: the target arrival rate (requests/s, Poisson); ``users`` is then the number
    of arrival generators, not a concurrency."""
    stopped_early: EarlyStop | None = None
    settled_early: EarlyStop | None = None
    """A knee search's step ended before its planned window: far from every limit, more requests
    could not change the level the search runs next (:meth:`~spoc_tui.core.knee.KneeSearch.settled`)."""
    arrivals: Arrivals | None = None
    """How bunched the step's request arrivals were (lockstep moves TTFT); None in files written
    before it was measured."""
    speed: float | None = None
    """Trace replay: the speed multiple the trace was replayed at (its timestamps divided by it)."""
    trace: TraceFidelity | None = None
    """Trace replay: how faithfully the step kept the trace's schedule, lengths and prefixes."""

    @property
    def level(self) -> float:
        """What the ramp stepped: a trace's speed, the arrival rate of an open-loop step, else the
        user count."""
        if self.speed is not None:
            return self.speed
        return self.rate if self.rate is not None else self.users

    @property
    def unit(self) -> LevelUnit:
        if self.speed is not None:
            return "x"
        return "req/s" if self.rate is not None else "users"

    @property
    def level_text(self) -> str:
        """``8 users`` or ``4 req/s``."""
        return level_text(self.level, self.unit)

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def value(self, lim: Limit) -> float | None:
        if lim.metric == "error_rate":
            return self.error_rate
        return self.latency.of(lim.metric).stat(lim.stat)

    def interval(self, lim: Limit) -> Interval:
        """The 95 % interval of the figure a limit is held against."""
        if lim.metric == "error_rate":
            return self.ci95.error_rate
        return self.latency.of(lim.metric).interval(lim.stat)

    @property
    def decision(self) -> Decision:
        return self.verdict.decision

    def as_dict(self) -> dict[str, object]:
        return {
            "step": self.step,
            "users": self.users,
            "duration_s": self.duration_s,
            "requests": self.requests,
            "errors": self.errors,
            "errors_by_kind": dict(self.errors_by_kind),
            "error_rate": self.error_rate,
            "request_rate": self.request_rate,
            "output_tokens_per_s": self.output_tokens_per_s,
            "goodput": self.goodput,
            "latency": self.latency.as_dict(),
            "cached_prompt_fraction": self.cached_prompt_fraction,
            "ci95": self.ci95.as_dict(),
            "extended_s": self.extended_s,
            "rate": self.rate,
            "client": self.client.as_dict(),
            "verdict": self.verdict.as_dict(),
            "server": self.server.as_dict(),
            **({"drained_s": self.drained_s} if self.drained_s else {}),
            **({"arrivals": self.arrivals.as_dict()} if self.arrivals else {}),
            **({"speed": self.speed, "trace": self.trace.as_dict()} if self.trace is not None else {}),
            **({"stopped_early": self.stopped_early.as_dict()} if self.stopped_early else {}),
            **({"settled_early": self.settled_early.as_dict()} if self.settled_early else {}),
        }

    @classmethod
    def from_dict(cls, d: Json) -> StepSummary:
        """A step as ramp.json holds it (any version this project wrote); missing figures read as
        none measured."""
        errs = _obj(d.get("errors_by_kind"))
        early = _obj(d.get("stopped_early"))
        settled = _obj(d.get("settled_early"))
        return cls(
            step=json_int(d, "step") or 0,
            users=json_int(d, "users") or 0,
            duration_s=json_float(d, "duration_s") or 0.0,
            requests=json_int(d, "requests") or 0,
            errors=json_int(d, "errors") or 0,
            errors_by_kind={str(k): int(v) for k, v in errs.items() if isinstance(v, int)},
            request_rate=json_float(d, "request_rate") or 0.0,
            output_tokens_per_s=json_float(d, "output_tokens_per_s") or 0.0,
            goodput=json_float(d, "goodput") or 0.0,
            latency=Latency.from_dict(_obj(d.get("latency"))),
            cached_prompt_fraction=json_float(d, "cached_prompt_fraction"),
            verdict=StepVerdict.from_dict(_obj(d.get("verdict"))),
            server=ServerWindow.from_dict(_obj(d.get("server"))),
            ci95=Totals.from_dict(_obj(d.get("ci95"))),
            extended_s=json_float(d, "extended_s") or 0.0,
            drained_s=json_float(d, "drained_s") or 0.0,
            client=ClientHealth.from_dict(_obj(d.get("client"))),
            rate=json_float(d, "rate"),
            stopped_early=EarlyStop(str(early.get("reason", "")), json_float(early, "saved_s") or 0.0)
            if early
            else None,
            settled_early=EarlyStop(str(settled.get("reason", "")), json_float(settled, "saved_s") or 0.0)
            if settled
            else None,
            arrivals=Arrivals.from_dict(_obj(d["arrivals"])) if isinstance(d.get("arrivals"), dict) else None,
            speed=json_float(d, "speed"),
            trace=TraceFidelity.from_dict(_obj(d["trace"])) if isinstance(d.get("trace"), dict) else None,
        )


def point_value(window: Sequence[RequestSample], metric: str, stat: str) -> float | None:
    """A figure over ``window`` (``ttft`` ``p99``, ``itl`` ``mean``, ``error_rate``), as
    :func:`summarize_step` computes it but without its interval (milliseconds, where the
    summary's resampling takes most of a second on a few hundred requests); None with nothing
    to compute it from."""
    if metric == "error_rate":
        return sum(1 for s in window if not s.ok) / len(window) if window else None
    ok = [s for s in window if s.ok]
    if metric == "itl":
        vals: list[float] = [g for s in ok for g in s.itl]
    else:
        vals = [v for s in ok if (v := getattr(s, metric)) is not None]
    if not vals:
        return None
    if stat == "mean":
        return float(np.mean(vals))
    return float(np.percentile(vals, float(stat[1:])))


def stats(values: Sequence[float]) -> Figures:
    """Percentiles (numpy's linear interpolation, as ``vllm bench serve``), mean and count."""
    if not values:
        return Figures()
    a = np.asarray(values, dtype=float)
    p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99])
    return Figures(float(p50), float(p90), float(p95), float(p99), float(a.mean()), int(a.size), int(a.size))


def _per_request(per_request: Sequence[float | None], rs: Resampler) -> Figures:
    """Figures of a per-request metric (``None`` for a request without one) with their intervals:
    each percentile's is the hull of the order-statistic interval (which says when the sample is
    too small to bound a side) and the block bootstrap's (which widens it where requests of the
    same moment move together); the mean's is the block bootstrap's."""
    owner = [i for i, v in enumerate(per_request) if v is not None]
    values = [v for v in per_request if v is not None]
    boot = rs.pooled_quantiles(values, owner, list(PERCENTILE_Q.values()))
    ci: list[tuple[str, Interval]] = [
        (name, hull(quantile_interval(values, q), b)) for (name, q), b in zip(PERCENTILE_Q.items(), boot, strict=True)
    ]
    ci.append(("mean", rs.pooled_mean(values, owner, len(per_request)) if values else (None, None)))
    return replace(stats(values), ci95=tuple(ci))


def _pooled(values: Sequence[float], owner: Sequence[int], n_requests: int, rs: Resampler) -> Figures:
    """Figures of a pooled metric (ITL gaps) with intervals from the bootstrap by request."""
    names = list(PERCENTILE_Q)
    qs = [PERCENTILE_Q[n] for n in names]
    boot = rs.pooled_quantiles(values, owner, qs)
    wood = rs.woodruff(values, owner, qs)
    ci: list[tuple[str, Interval]] = [(n, hull(w, b)) for n, w, b in zip(names, wood, boot, strict=True)]
    ci.append(("mean", rs.pooled_mean(values, owner, n_requests) if values else (None, None)))
    return replace(stats(values), requests=len(set(owner)), ci95=tuple(ci))


def _meets(sample: RequestSample, limits: Iterable[Limit]) -> bool:
    if not sample.ok:
        return False
    for lim in limits:
        first = sample.ttft if sample.ttft is not None else sample.e2e  # no text at all: the answer ended
        if lim.metric == "ttft" and (first is None or first > lim.value):
            return False
        if lim.metric in ("tpot", "itl"):
            t = sample.tpot
            if t is not None and t > lim.value:
                return False
        if lim.metric == "e2e" and (sample.e2e is None or sample.e2e > lim.value):
            return False
    return True


BLOCKS = 20
"""The measured window is cut into this many blocks of time (at least 1 s each) for the bootstrap."""


def time_blocks(samples: Sequence[RequestSample], duration_s: float) -> list[int]:
    """Each request's block of time (by when it finished) within the step's window."""
    ends = [s.end if s.end is not None else s.start for s in samples]
    if not ends:
        return []
    t0 = min(ends)
    width = max(1.0, duration_s / BLOCKS)
    return [int((e - t0) // width) for e in ends]


USER_UNITS_MIN = 8
"""Closed-loop totals are resampled by user when the step has at least this many users."""


def user_units(samples: Sequence[RequestSample]) -> list[int] | None:
    """Each request's user (``user#conversation`` ids, as the runner and the simulator name
    them), or None when a request has no such id or there are fewer than
    :data:`USER_UNITS_MIN` users."""
    ids: dict[str, int] = {}
    out: list[int] = []
    for s in samples:
        user, sep, _ = s.conversation.partition("#")
        if not sep:
            return None
        out.append(ids.setdefault(user, len(ids)))
    return out if len(ids) >= USER_UNITS_MIN else None


def summarize_step(
    step: int,
    users: int,
    samples: Sequence[RequestSample],
    duration_s: float,
    limits: Sequence[Limit],
    open_loop: bool = False,
    *,
    rate: float | None = None,
    server: ServerWindow = ServerWindow(),
    client: ClientHealth = ClientHealth(),
    extended_s: float = 0.0,
    drained_s: float = 0.0,
    unbounded: str | None = None,
) -> StepSummary:
    """Figures of one step from the requests that finished inside its measured window, each with
    its sample size and 95 % interval (:mod:`spoc_tui.core.confidence`), and the verdict (broken
    by the queue rule when ``unbounded`` says why).

    Totals over the window (request rate, output tokens/s, goodput) of a closed loop are
    resampled by user: a closed-loop user is a renewal process whose count in a window is
    regulated (a long answer delays the next request), so blocks of time are negatively
    correlated and treating them as independent made those intervals 3-4x too wide; users are
    the independent units. An open loop (Poisson arrivals), or a step with few users, keeps the
    time blocks."""
    n = len(samples)
    ok = [s for s in samples if s.ok]
    errs: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            errs[s.error or "error"] = errs.get(s.error or "error", 0) + 1
    d = max(duration_s, 1e-9)
    rs = Resampler.for_blocks(time_blocks(samples, duration_s), seed=step * 1_000_003 + users * 7_919 + n)
    gaps = [g for s in samples if s.ok for g in s.itl]
    owner = [i for i, s in enumerate(samples) if s.ok for _ in s.itl]
    lat = Latency(
        ttft=_per_request([s.ttft if s.ok else None for s in samples], rs),
        itl=_pooled(gaps, owner, n, rs),
        tpot=_per_request([s.tpot if s.ok else None for s in samples], rs),
        e2e=_per_request([s.e2e if s.ok else None for s in samples], rs),
    )
    out_tokens = [float(s.output_tokens or 0) if s.ok else 0.0 for s in samples]
    good = [1.0 if _meets(s, limits) else 0.0 for s in samples]
    prompt = sum(s.prompt_tokens or 0 for s in ok)
    cached = [s.cached_tokens for s in ok if s.cached_tokens is not None]
    units = None if open_loop else user_units(samples)
    totals = rs if units is None else Resampler.for_blocks(units, seed=step * 1_000_003 + users * 7_919 + n + 1)
    none: Interval = (None, None)
    figures = StepSummary(
        step=step,
        users=users,
        duration_s=duration_s,
        requests=n,
        errors=n - len(ok),
        errors_by_kind=errs,
        request_rate=n / d,
        output_tokens_per_s=sum(out_tokens) / d,
        goodput=sum(good) / d,
        latency=lat,
        cached_prompt_fraction=(sum(cached) / prompt) if cached and prompt else None,
        ci95=Totals(
            request_rate=totals.total([1.0] * n, 1 / d) if n else none,
            output_tokens_per_s=totals.total(out_tokens, 1 / d) if n else none,
            goodput=totals.total(good, 1 / d) if n else none,
            error_rate=proportion_interval(n - len(ok), n),
        ),
        server=server,
        client=client,
        rate=rate,
        extended_s=extended_s,
        drained_s=drained_s,
        arrivals=arrivals([s.start for s in samples]),
    )
    verdict = judge(figures, limits)
    if unbounded:
        verdict = verdict.broken_by_queue(unbounded)
    return replace(figures, verdict=verdict)


def judge(step: StepSummary, limits: Sequence[Limit]) -> StepVerdict:
    """The step's decision on the SLA: ``meets`` when every limit's interval lies within it,
    ``breaks`` when some limit's interval lies wholly beyond it, else ``inconclusive`` (an
    interval straddles its limit, or the sample is too small to bound it) with the reason.
    Most requests surely failing breaks it whatever the latency limits say."""
    if step.requests == 0:
        return StepVerdict(
            reason="no request finished in the step: the step is too short for this profile (raise --step-seconds)"
        )
    checks: list[Check] = []
    worst: tuple[float, str] | None = None
    undecided: list[str] = []
    for lim in limits:
        v = step.value(lim)
        lo, hi = step.interval(lim)
        dec = decide(v, (lo, hi), lim.value)
        checks.append(Check(lim.key, v, lim.value, (lo, hi), dec))
        if dec == "breaks" and lo is not None:
            ratio = lo / lim.value if lim.value else math.inf
            if worst is None or ratio > worst[0]:
                worst = (ratio, lim.key)
        elif dec == "inconclusive":
            undecided.append(_why_undecided(step, lim, v, lo, hi))
    err_lo = step.ci95.error_rate[0]
    if err_lo is not None and err_lo >= 0.5 and all(c.key != "error_rate" for c in checks):
        # most requests surely failed: no latency SLA is met by requests that never finish
        checks.append(Check("error_rate", step.error_rate, 0.5, step.ci95.error_rate, "breaks"))
        if worst is None:
            worst = (err_lo / 0.5, "error_rate")
    decisions = [c.decision for c in checks]
    decision: Decision = (
        "breaks" if "breaks" in decisions else ("meets" if all(x == "meets" for x in decisions) else "inconclusive")
    )
    return StepVerdict(
        decision=decision,
        checks=tuple(checks),
        broken_limit=worst[1] if worst else None,
        worst_ratio=None if worst is None or math.isinf(worst[0]) else worst[0],
        reason="; ".join(undecided) if decision == "inconclusive" else "",
    )


def _why_undecided(step: StepSummary, lim: Limit, v: float | None, lo: float | None, hi: float | None) -> str:
    if v is None:
        return f"{lim.key}: no value (no request finished)"
    q = PERCENTILE_Q.get(lim.stat)
    n = step.latency.of(lim.metric).n if lim.metric != "error_rate" else step.requests
    if hi is None and q is not None and lim.metric == "itl":
        # the gaps of one request move together: the requests are the independent units
        requests = step.latency.itl.requests
        return (
            f"{lim.key}: {n} gaps from {requests} request{'s' if requests != 1 else ''} cannot bound a {lim.stat} "
            "from above (a request's gaps move together, so it is the requests that count: measure longer with "
            "--max-step-seconds, or hold a lower percentile)"
        )
    if hi is None and q is not None:
        return (
            f"{lim.key}: {n} requests cannot bound a {lim.stat} from above (it takes {min_samples_for_upper_bound(q)}: "
            "measure longer with --max-step-seconds, or hold a lower percentile)"
        )
    if hi is None:
        return f"{lim.key}: too few samples to bound it"
    return (
        f"{lim.key}: its interval {_fmt(lo)}-{_fmt(hi)} straddles the limit {_fmt(lim.value)}"
        if lim.metric != "error_rate"
        else (
            f"error_rate: its interval {(lo or 0) * 100:.1f}-{hi * 100:.1f}% straddles the limit {lim.value * 100:g}%"
        )
    )


def _fmt(v: float | None) -> str:
    if v is None:
        return "?"
    return f"{v * 1000:.1f}ms" if v < 1 else f"{v:.2f}s"


def badly_broken(step: StepSummary, abort_factor: float) -> str | None:
    """Why to stop the ramp early, or None: a limit surely exceeded ``abort_factor`` times (the
    low end of its interval), or most requests surely failing. A step where nothing finished
    is inconclusive, never a reason to stop."""
    if step.decision != "breaks":
        return None
    err_lo = step.ci95.error_rate[0]
    if err_lo is not None and err_lo >= 0.5:
        return f"step {step.step} ({step.level_text}): at least {err_lo:.0%} of requests failed"
    ratio = step.verdict.worst_ratio
    if ratio is not None and ratio >= abort_factor:
        return (
            f"step {step.step} ({step.level_text}): {step.verdict.broken_limit} at least {ratio:.1f}x "
            f"its limit (abort factor {abort_factor:g})"
        )
    return None


# -- a queue that does not stop growing -------------------------------------------------------

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
    span = float(ts[-1] - ts[0])
    if span < QUEUE_MIN_SPAN_S:
        return None
    moves = np.diff(ws)
    rises, falls = int(np.sum(moves > 0)), int(np.sum(moves < 0))
    steady = 1.0 - falls / len(moves)  # the share of poll-to-poll changes that are not decreases
    if rises < QUEUE_MIN_RISES or rises < 0.7 * (rises + falls):
        return None
    slope = float(np.polyfit(ts, ws, 1)[0])
    growth = slope * span
    start = float(np.mean(ws[: max(1, len(ws) // 4)]))
    half = len(ts) // 2
    late_slope = float(np.polyfit(ts[half:], ws[half:], 1)[0])
    late_growth = late_slope * float(ts[-1] - ts[half])
    if growth >= max(5.0, 0.5 * start) and steady >= 0.7 and late_slope >= 0.25 * slope and late_growth >= 2.0:
        return f"queue unbounded: waiting grew {ws[0]:.0f} -> {ws[-1]:.0f} in {span:.0f} s ({slope:.1f}/s)"
    return None
