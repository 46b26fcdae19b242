"""Load-ramp maths: SLA strings, client-side latency metrics, step summaries, the knee.

Metric definitions follow ``vllm bench serve``:
- TTFT: first content-bearing chunk minus send time.
- ITL: gaps between consecutive content chunks, pooled over all requests.
- TPOT: per request, (E2E - TTFT) / (output tokens - 1), output tokens from ``usage``.
- E2E: last byte minus send time.
- Percentiles: numpy's linear interpolation over the raw samples of the step.
- Goodput: requests per second whose TTFT, TPOT and E2E all meet the SLA limits given for
  them (an ITL limit is held against the request's TPOT, its mean inter-token gap).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

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
from spoc_tui.core.errors import InputError

METRICS = ("ttft", "itl", "tpot", "e2e")
STATS = ("p50", "p90", "p95", "p99", "mean")


class UsersError(InputError, ValueError):
    """A user-count list or series that cannot be; the message shows the accepted forms."""


class SlaError(InputError, ValueError):
    """An SLA string that does not parse; the message shows the bad clause."""


@dataclass(frozen=True, slots=True)
class Limit:
    metric: str
    """ttft, itl, tpot, e2e or error_rate."""
    stat: str
    """p50, p90, p95, p99, mean (or "rate" for error_rate)."""
    value: float
    """Seconds (or a fraction for error_rate)."""

    @property
    def key(self) -> str:
        return "error_rate" if self.metric == "error_rate" else f"{self.metric}_{self.stat}"

    def __str__(self) -> str:
        if self.metric == "error_rate":
            return f"error_rate<={self.value * 100:g}%"
        v = f"{self.value * 1000:g}ms" if self.value < 1 else f"{self.value:g}s"
        return f"{self.key}<={v}"


_CLAUSE = re.compile(r"^\s*(ttft|itl|tpot|e2e)_(p50|p90|p95|p99|mean)\s*(<=|<)\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$", re.I)
_ERR = re.compile(r"^\s*error_rate\s*(<=|<)\s*([0-9]*\.?[0-9]+)\s*(%)?\s*$", re.I)


DEFAULT_SLA = "ttft_p99<=2s,itl_p99<=100ms"
"""The SLA the Load and Tune screens start with (the CLI asks for one)."""


def parse_sla(text: str) -> tuple[Limit, ...]:
    """``"ttft_p99<=2s,itl_p99<=100ms,error_rate<=1%"`` -> limits.

    Raises:
        SlaError: naming the clause that does not parse.
    """
    if not text or not text.strip():
        raise SlaError("empty SLA; write it like ttft_p99<=2s,itl_p99<=100ms")
    out: list[Limit] = []
    for clause in text.split(","):
        if not clause.strip():
            continue
        m = _CLAUSE.match(clause)
        if m:
            metric, stat, _, num, unit = m.groups()
            if not unit:
                raise SlaError(f"SLA clause {clause.strip()!r} has no unit: write {num}ms or {num}s")
            value = float(num) / (1000.0 if unit.lower() == "ms" else 1.0)
            if value <= 0:
                raise SlaError(f"SLA limit must be positive: {clause.strip()!r}")
            out.append(Limit(metric.lower(), stat.lower(), value))
            continue
        m = _ERR.match(clause)
        if m:
            _, num, pct = m.groups()
            value = float(num) / (100.0 if pct else 1.0)
            if not 0 <= value <= 1:
                raise SlaError(f"error_rate must be between 0 and 100%: {clause.strip()!r}")
            out.append(Limit("error_rate", "rate", value))
            continue
        raise SlaError(
            f"cannot parse SLA clause {clause.strip()!r}: expected METRIC_STAT<=VALUE with METRIC one of "
            f"{', '.join(METRICS)}, STAT one of {', '.join(STATS)}, VALUE in ms or s (or error_rate<=N%)"
        )
    if not out:  # "," or ",,": clauses of nothing would be an SLA every step meets
        raise SlaError(f"empty SLA {text!r}; write it like ttft_p99<=2s,itl_p99<=100ms")
    keys = [lim.key for lim in out]
    if len(set(keys)) != len(keys):
        raise SlaError(f"SLA names a limit twice: {text!r}")
    return tuple(out)


MAX_USERS = 100_000
"""The most users a ramp step may ask for (a typo like 100000000000 must not run)."""


def parse_users(text: str) -> list[int]:
    """``"1,2,4,8"`` or ``"geom:1:64"`` / ``"geom:1:64:1.5"`` (start, stop, factor 2)."""
    text = text.strip()
    try:
        if text.startswith("geom:"):
            parts = text[5:].split(":")
            start, stop = int(parts[0]), int(parts[1])
            factor = float(parts[2]) if len(parts) > 2 else 2.0
            if start < 1 or stop < start or factor <= 1:
                raise ValueError
            if stop > MAX_USERS:
                raise UsersError(f"bad --users {text!r}: at most {MAX_USERS:,} users")
            out: list[int] = []
            v = float(start)
            while round(v) <= stop:
                if not out or round(v) != out[-1]:
                    out.append(round(v))
                v *= factor
            if out[-1] != stop:
                out.append(stop)
            return out
        out = [int(x) for x in text.split(",") if x.strip()]
    except (ValueError, IndexError):
        raise UsersError(f"bad --users {text!r}: give counts like 1,2,4,8 or a series like geom:1:64") from None
    if not out or any(u < 1 for u in out) or any(b <= a for a, b in zip(out, out[1:])):
        raise UsersError(f"bad --users {text!r}: counts must be positive and increasing")
    if out[-1] > MAX_USERS:
        raise UsersError(f"bad --users {text!r}: at most {MAX_USERS:,} users (auto:MAX has the same bound)")
    return out


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
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> RequestSample:
        def f(k: str) -> float | None:
            v = d.get(k)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        def i(k: str) -> int | None:
            v = d.get(k)
            return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        itl = d.get("itl") or []
        return cls(
            start=f("start") or 0.0,
            step=i("step") or 0,
            users=i("users") or 0,
            ok=bool(d.get("ok")),
            ttft=f("ttft"),
            e2e=f("e2e"),
            itl=tuple(float(x) for x in itl) if isinstance(itl, list) else (),
            output_tokens=i("output_tokens"),
            prompt_tokens=i("prompt_tokens"),
            cached_tokens=i("cached_tokens"),
            error=str(d["error"]) if d.get("error") else None,
            conversation=str(d.get("conversation", "")),
            turn=i("turn") or 0,
            request_id=str(d["request_id"]) if d.get("request_id") else None,
            end=f("end"),
        )


PERCENTILE_Q = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}


def stats(values: Sequence[float]) -> dict[str, Any]:
    """Percentiles (numpy's linear interpolation, as ``vllm bench serve``), mean and count."""
    if not values:
        return {"p50": None, "p90": None, "p95": None, "p99": None, "mean": None, "count": 0}
    a = np.asarray(values, dtype=float)
    p50, p90, p95, p99 = np.percentile(a, [50, 90, 95, 99])
    return {
        "p50": float(p50),
        "p90": float(p90),
        "p95": float(p95),
        "p99": float(p99),
        "mean": float(a.mean()),
        "count": int(a.size),
    }


def _per_request(per_request: Sequence[float | None], rs: Resampler) -> dict[str, Any]:
    """Figures of a per-request metric (``None`` for a request without one) with their intervals:
    each percentile's is the hull of the order-statistic interval (which says when the sample is
    too small to bound a side) and the block bootstrap's (which widens it where requests of the
    same moment move together); the mean's is the block bootstrap's."""
    owner = [i for i, v in enumerate(per_request) if v is not None]
    values = [v for v in per_request if v is not None]
    out = stats(values)
    out["n"] = len(values)
    boot = rs.pooled_quantiles(values, owner, list(PERCENTILE_Q.values()))
    ci: dict[str, list[float | None]] = {
        name: list(hull(quantile_interval(values, q), b))
        for (name, q), b in zip(PERCENTILE_Q.items(), boot, strict=True)
    }
    ci["mean"] = list(rs.pooled_mean(values, owner, len(per_request))) if values else [None, None]
    out["ci95"] = ci
    return out


def _pooled(values: Sequence[float], owner: Sequence[int], n_requests: int, rs: Resampler) -> dict[str, Any]:
    """Figures of a pooled metric (ITL gaps) with intervals from the bootstrap by request."""
    out = stats(values)
    out["n"] = len(values)
    out["requests"] = len(set(owner))
    names = list(PERCENTILE_Q)
    qs = [PERCENTILE_Q[n] for n in names]
    boot = rs.pooled_quantiles(values, owner, qs)
    wood = rs.woodruff(values, owner, qs)
    ci: dict[str, list[float | None]] = {n: list(hull(w, b)) for n, w, b in zip(names, wood, boot, strict=True)}
    ci["mean"] = list(rs.pooled_mean(values, owner, n_requests)) if values else [None, None]
    out["ci95"] = ci
    return out


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


@dataclass
class StepSummary:
    step: int
    users: int
    duration_s: float
    requests: int
    errors: int
    errors_by_kind: dict[str, int]
    request_rate: float
    output_tokens_per_s: float
    goodput: float
    latency: dict[str, dict[str, Any]]
    """metric -> p50/p90/p95/p99/mean, ``count`` and ``n`` (samples), ``ci95`` (stat -> [lo, hi])."""
    cached_prompt_fraction: float | None
    verdict: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    """The server-side view during the step (queue, KV, preemptions, GPU clocks)."""
    ci95: dict[str, list[float | None]] = field(default_factory=dict)
    """95 % intervals of request_rate, output_tokens_per_s, goodput and error_rate."""
    extended_s: float = 0.0
    """Seconds the step was measured beyond its planned length to reach a decision."""
    client: dict[str, Any] = field(default_factory=dict)
    """The load generator watching itself during the window (:func:`client_health`)."""
    rate: float | None = None
    """Open-loop steps: the target arrival rate (requests/s, Poisson); ``users`` is then the number
    of arrival generators, not a concurrency."""
    stopped_early: dict[str, Any] = field(default_factory=dict)
    """A tuning trial's step ended before its planned length, clearly dominated by the front:
    ``reason`` and ``saved_s`` (the planned measurement it did not spend)."""

    @property
    def level(self) -> float:
        """What the ramp stepped: the arrival rate of an open-loop step, else the user count."""
        return self.rate if self.rate is not None else self.users

    @property
    def level_text(self) -> str:
        """``8 users`` or ``4 req/s``."""
        return level_text(self.level, "req/s" if self.rate is not None else "users")

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def value(self, lim: Limit) -> float | None:
        if lim.metric == "error_rate":
            return self.error_rate
        v = self.latency.get(lim.metric, {}).get(lim.stat)
        return None if v is None else float(v)

    def interval(self, lim: Limit) -> Interval:
        """The 95 % interval of the figure a limit is held against."""
        ci = (
            self.ci95.get("error_rate")
            if lim.metric == "error_rate"
            else self.latency.get(lim.metric, {}).get("ci95", {}).get(lim.stat)
        )
        if not ci:
            return None, None
        return ci[0], ci[1]

    @property
    def decision(self) -> Decision:
        return str(self.verdict.get("decision", "inconclusive"))

    def as_dict(self) -> dict[str, object]:
        return {
            "step": self.step,
            "users": self.users,
            "duration_s": self.duration_s,
            "requests": self.requests,
            "errors": self.errors,
            "errors_by_kind": self.errors_by_kind,
            "error_rate": self.error_rate,
            "request_rate": self.request_rate,
            "output_tokens_per_s": self.output_tokens_per_s,
            "goodput": self.goodput,
            "latency": self.latency,
            "cached_prompt_fraction": self.cached_prompt_fraction,
            "ci95": self.ci95,
            "extended_s": self.extended_s,
            "rate": self.rate,
            "client": self.client,
            "verdict": self.verdict,
            "server": self.server,
            **({"stopped_early": self.stopped_early} if self.stopped_early else {}),
        }


CLIENT_LAG_P99_MS = 1.0
CLIENT_CPU_PCT = 90.0
"""A load-generator process whose event loop woke more than 1 ms late at the 99th percentile, or
that used more than 90 % of a core (Locust's own warning), timestamped chunks late: its
latencies are not trustworthy."""


def client_health(points: Sequence[tuple[str, float, float, Sequence[float]]]) -> dict[str, Any]:
    """How the load generator's processes fared over a step's window, from their once-a-second
    reports ``(process, wall time, CPU seconds so far, loop lags in ms)``: CPU use in % of a core,
    loop lag p99 and max per process, and whether any was saturated (and why)."""
    by: dict[str, list[tuple[float, float, Sequence[float]]]] = {}
    for proc, t, cpu, lags in points:
        by.setdefault(proc, []).append((t, cpu, lags))
    procs: dict[str, dict[str, float | None]] = {}
    for proc, pts in by.items():
        pts.sort(key=lambda p: p[0])
        span = pts[-1][0] - pts[0][0]
        cpu_pct = 100 * (pts[-1][1] - pts[0][1]) / span if len(pts) > 1 and span > 0 else None
        lags = [x for p in pts[1:] for x in p[2]] if len(pts) > 1 else [x for p in pts for x in p[2]]
        procs[proc] = {
            "cpu_pct": cpu_pct,
            "loop_lag_p99_ms": float(np.percentile(lags, 99)) if lags else None,
            "loop_lag_max_ms": max(lags) if lags else None,
        }
    if not procs:
        return {}
    worst_cpu = max((p["cpu_pct"] for p in procs.values() if p["cpu_pct"] is not None), default=None)
    worst_lag = max((p["loop_lag_p99_ms"] for p in procs.values() if p["loop_lag_p99_ms"] is not None), default=None)
    why = []
    if worst_cpu is not None and worst_cpu > CLIENT_CPU_PCT:
        why.append(f"CPU {worst_cpu:.0f} % of a core")
    if worst_lag is not None and worst_lag > CLIENT_LAG_P99_MS:
        why.append(f"event-loop lag p99 {worst_lag:.1f} ms")
    return {
        "processes": procs,
        "cpu_pct": worst_cpu,
        "loop_lag_p99_ms": worst_lag,
        "saturated": bool(why),
        "reason": ", ".join(why),
    }


def client_saturated_text(step: StepSummary) -> str | None:
    """``client saturated: timings not trustworthy (...)`` with the remedy, or None."""
    c = step.client or {}
    if not c.get("saturated"):
        return None
    return f"client saturated: timings not trustworthy ({c.get('reason')}); add load-generator processes (--workers)"


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
) -> StepSummary:
    """Figures of one step from the requests that finished inside its measured window, each with
    its sample size and 95 % interval (:mod:`spoc_tui.core.confidence`), and the verdict.

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
    ttft = [s.ttft if s.ok else None for s in samples]
    tpot = [s.tpot if s.ok else None for s in samples]
    e2e = [s.e2e if s.ok else None for s in samples]
    gaps = [g for s in samples if s.ok for g in s.itl]
    owner = [i for i, s in enumerate(samples) if s.ok for _ in s.itl]
    lat = {
        "ttft": _per_request(ttft, rs),
        "itl": _pooled(gaps, owner, n, rs),
        "tpot": _per_request(tpot, rs),
        "e2e": _per_request(e2e, rs),
    }
    out_tokens = [float(s.output_tokens or 0) if s.ok else 0.0 for s in samples]
    good = [1.0 if _meets(s, limits) else 0.0 for s in samples]
    failed = [0.0 if s.ok else 1.0 for s in samples]
    prompt = sum(s.prompt_tokens or 0 for s in ok)
    cached = [s.cached_tokens for s in ok if s.cached_tokens is not None]
    units = None if open_loop else user_units(samples)
    totals = rs if units is None else Resampler.for_blocks(units, seed=step * 1_000_003 + users * 7_919 + n + 1)
    summary = StepSummary(
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
        ci95={
            "request_rate": list(totals.total([1.0] * n, 1 / d)) if n else [None, None],
            "output_tokens_per_s": list(totals.total(out_tokens, 1 / d)) if n else [None, None],
            "goodput": list(totals.total(good, 1 / d)) if n else [None, None],
            "error_rate": list(proportion_interval(int(sum(failed)), n)),
        },
    )
    summary.verdict = judge(summary, limits)
    return summary


def judge(step: StepSummary, limits: Sequence[Limit]) -> dict[str, Any]:
    """The step's decision on the SLA: ``meets`` when every limit's interval lies within it,
    ``breaks`` when some limit's interval lies wholly beyond it, else ``inconclusive`` (an
    interval straddles its limit, or the sample is too small to bound it) with the reason.

    ``ok`` (meets) and ``broken_limit`` are kept for readers of older results; ``worst_ratio``
    is how many times over its limit the breaking figure surely is (its interval's low end).
    """
    if step.requests == 0:
        return {
            "ok": False,
            "decision": "inconclusive",
            "checks": {},
            "broken_limit": None,
            "worst_ratio": None,
            "reason": "no request finished in the step: the step is too short for this profile (raise --step-seconds)",
        }
    checks: dict[str, dict[str, Any]] = {}
    worst: tuple[float, str] | None = None
    undecided: list[str] = []
    for lim in limits:
        v = step.value(lim)
        lo, hi = step.interval(lim)
        d = decide(v, (lo, hi), lim.value)
        checks[lim.key] = {"value": v, "limit": lim.value, "ci95": [lo, hi], "decision": d, "ok": d == "meets"}
        if d == "breaks" and lo is not None:
            ratio = lo / lim.value if lim.value else math.inf
            if worst is None or ratio > worst[0]:
                worst = (ratio, lim.key)
        elif d == "inconclusive":
            undecided.append(_why_undecided(step, lim, v, lo, hi))
    err_lo = (step.ci95.get("error_rate") or [None, None])[0]
    if err_lo is not None and err_lo >= 0.5 and "error_rate" not in checks:
        # most requests surely failed: no latency SLA is met by requests that never finish
        checks["error_rate"] = {
            "value": step.error_rate,
            "limit": 0.5,
            "ci95": step.ci95["error_rate"],
            "decision": "breaks",
            "ok": False,
        }
        if worst is None:
            worst = (err_lo / 0.5, "error_rate")
    decisions = [c["decision"] for c in checks.values()]
    decision: Decision = (
        "breaks" if "breaks" in decisions else ("meets" if all(x == "meets" for x in decisions) else "inconclusive")
    )
    return {
        "ok": decision == "meets",
        "decision": decision,
        "checks": checks,
        "broken_limit": worst[1] if worst else None,
        "worst_ratio": None if worst is None or math.isinf(worst[0]) else worst[0],
        "reason": "; ".join(undecided) if decision == "inconclusive" else "",
    }


def _why_undecided(step: StepSummary, lim: Limit, v: float | None, lo: float | None, hi: float | None) -> str:
    if v is None:
        return f"{lim.key}: no value (no request finished)"
    q = PERCENTILE_Q.get(lim.stat)
    n = step.latency.get(lim.metric, {}).get("n", step.requests) if lim.metric != "error_rate" else step.requests
    if hi is None and q is not None:
        return (
            f"{lim.key}: {n} samples cannot bound a {lim.stat} from above (it takes {min_samples_for_upper_bound(q)}: "
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
    err_lo = (step.ci95.get("error_rate") or [None, None])[0]
    if err_lo is not None and err_lo >= 0.5:
        return f"step {step.step} ({step.level_text}): at least {err_lo:.0%} of requests failed"
    ratio = step.verdict.get("worst_ratio")
    if isinstance(ratio, float) and ratio >= abort_factor:
        return (
            f"step {step.step} ({step.level_text}): {step.verdict.get('broken_limit')} at least {ratio:.1f}x "
            f"its limit (abort factor {abort_factor:g})"
        )
    return None


LevelUnit = Literal["users", "req/s"]
"""What a ramp steps: concurrent users (closed loop) or an arrival rate (open loop)."""


def level_text(level: float | None, unit: LevelUnit) -> str:
    """``8 users`` or ``2.5 req/s``."""
    if level is None:
        return "?"
    return f"{level:g} {unit}" if unit == "req/s" else f"{int(level)} users"


def levels_text(levels: Sequence[float], unit: LevelUnit) -> str:
    """``4, 8 users`` or ``2, 4 req/s``."""
    return ", ".join(f"{v:g}" for v in levels) + f" {unit}"


@dataclass(frozen=True, slots=True)
class Knee:
    """Where the SLA stops holding: the highest level (user count, or arrival rate when ``unit`` is
    req/s) a decided step met it with, below the lowest level a decided step broke it with.
    Undecided and contradicting steps are named, not hidden."""

    max_users_within_sla: float | None
    """The highest level that met the SLA below the break (users, or req/s by ``unit``)."""
    first_failing_users: float | None
    """The lowest level that broke it (users, or req/s by ``unit``)."""
    broken_limit: str | None
    inconclusive: tuple[float, ...] = ()
    """Levels whose steps stayed inconclusive."""
    contradicted: tuple[float, ...] = ()
    """Levels that met the SLA above one that broke it (noise, or a server that warmed up): the
    knee below them stands, but it is not the whole story."""
    reason: str = ""
    """The server-side reason for the knee, in one sentence with its figures (set by the ramp)."""
    unit: LevelUnit = "users"

    @property
    def meets_text(self) -> str:
        return level_text(self.max_users_within_sla, self.unit)

    @property
    def breaks_text(self) -> str:
        return level_text(self.first_failing_users, self.unit)

    @property
    def bracket(self) -> str:
        """``N users meet, M break (limit)`` in words."""
        if self.first_failing_users is None:
            if self.max_users_within_sla is None:
                return "no step decided"
            return f"{self.meets_text} meet; no level broke the SLA"
        if self.max_users_within_sla is None:
            return f"even {self.breaks_text} break the SLA ({self.broken_limit})"
        assert self.first_failing_users is not None
        return f"{self.meets_text} meet, {self.first_failing_users:g} break ({self.broken_limit})"

    def as_dict(self) -> dict[str, object]:
        key = "users" if self.unit == "users" else "rate"
        return {
            f"max_{key}_within_sla": self.max_users_within_sla,
            f"first_failing_{key}": self.first_failing_users,
            "unit": self.unit,
            "broken_limit": self.broken_limit,
            "inconclusive": list(self.inconclusive),
            "contradicted": list(self.contradicted),
            "reason": self.reason,
        }


def find_knee(steps: Sequence[StepSummary]) -> Knee:
    """The knee from the steps' decisions, by level (probes may run in any order)."""
    unit: LevelUnit = "req/s" if any(s.rate is not None for s in steps) else "users"
    breaks = [s for s in steps if s.decision == "breaks"]
    first = min(breaks, key=lambda s: s.level) if breaks else None
    meets = [s.level for s in steps if s.decision == "meets"]
    below = [u for u in meets if first is None or u < first.level]
    contradicted = tuple(sorted({u for u in meets if first is not None and u > first.level}))
    undecided = tuple(
        sorted({s.level for s in steps if s.decision == "inconclusive"} - set(meets) - {s.level for s in breaks})
    )
    return Knee(
        max(below) if below else None,
        first.level if first else None,
        str(first.verdict.get("broken_limit")) if first else None,
        undecided,
        contradicted,
        unit=unit,
    )


# -- which user count to run next -------------------------------------------------------------

KNEE_TOLERANCE = 0.05
"""The knee search stops when the bracket is adjacent counts, or narrower than 5 % of the count
that meets (64 vs 67 users is pinned; bisecting further costs a step per halving)."""


@dataclass
class FixedUsers:
    """The user counts the operator listed, in order."""

    users: list[int]

    def next(self, steps: Sequence[StepSummary]) -> int | None:
        return self.users[len(steps)] if len(steps) < len(self.users) else None

    def describe(self) -> str:
        return ",".join(map(str, self.users))


@dataclass
class KneeSearch:
    """``--users auto[:MAX]``: double from ``start`` until a step does not meet the SLA (or MAX),
    then bisect over whole user counts between the last count that met it and the first that
    did not, until they are adjacent or within :data:`KNEE_TOLERANCE`. A step that stays
    inconclusive after its extensions bounds the search like a break and is reported as such."""

    max_users: int = 1024
    start: int = 1

    def next(self, steps: Sequence[StepSummary]) -> int | None:
        if not steps:
            return self.start
        tried = {s.users for s in steps}
        meets = [s.users for s in steps if s.decision == "meets"]
        fails = [s.users for s in steps if s.decision != "meets"]
        hi = min(fails) if fails else None
        lo = max([u for u in meets if hi is None or u < hi], default=0)
        if hi is None:  # still doubling
            nxt = min(max(tried) * 2, self.max_users)
            return None if nxt in tried else nxt
        if hi - lo <= max(1, int(lo * KNEE_TOLERANCE)):
            return None
        nxt = (lo + hi) // 2 if lo else max(1, hi // 2)
        return None if nxt in tried else nxt

    def describe(self) -> str:
        return f"auto:{self.max_users}"


SATURATION_GAIN = 1.10
"""Calibration: a doubling of users that adds less than 10 % output tokens/s means saturation."""
SATURATION_SHARE = 0.90
"""Calibration: the reference load is the fewest users that reach 90 % of the best tokens/s."""


@dataclass
class SaturationSearch:
    """A tuning study's calibration (``spoc tune --users auto``): double the users from ``start``
    until output tokens/s grows by less than :data:`SATURATION_GAIN` per doubling, a step clearly
    breaks the SLA, or ``max_users``. Unlike the knee search it needs no conclusive SLA verdict at
    light load (a p99 over a handful of requests has none), only throughput, which every step
    measures well."""

    max_users: int = 1024
    start: int = 2

    def next(self, steps: Sequence[StepSummary]) -> int | None:
        if not steps:
            return min(self.start, self.max_users)
        last = steps[-1]
        if last.decision == "breaks" or last.users >= self.max_users:
            return None
        if len(steps) >= 2 and last.output_tokens_per_s < SATURATION_GAIN * steps[-2].output_tokens_per_s:
            return None
        return min(last.users * 2, self.max_users)

    def describe(self) -> str:
        return f"auto:{self.max_users} (calibration: double until tokens/s saturates)"


def saturation_users(steps: Sequence[StepSummary]) -> tuple[int, str] | None:
    """The reference load a calibration found: the fewest users whose output tokens/s reach
    :data:`SATURATION_SHARE` of the best among steps that did not clearly break the SLA, and
    why, in words. None without such a step."""
    ok = [s for s in steps if s.decision != "breaks" and s.requests]
    if not ok:
        return None
    best = max(s.output_tokens_per_s for s in ok)
    pick = min((s for s in ok if s.output_tokens_per_s >= SATURATION_SHARE * best), key=lambda s: s.users)
    broke = [s.users for s in steps if s.decision == "breaks"]
    tail = f"; the SLA breaks at {min(broke)} users" if broke else ""
    return pick.users, (
        f"reaches {pick.output_tokens_per_s:,.0f} of the best {best:,.0f} output tokens/s at {pick.users} users "
        f"(tried {', '.join(str(s.users) for s in steps)}{tail})"
    )


@dataclass
class FixedRates:
    """``--rate 1,2,4``: open-loop steps at these arrival rates (requests/s, Poisson), in order."""

    rates: list[float]

    def next(self, steps: Sequence[StepSummary]) -> float | None:
        return self.rates[len(steps)] if len(steps) < len(self.rates) else None

    def describe(self) -> str:
        return "rate:" + ",".join(f"{r:g}" for r in self.rates)


UserPlan = FixedUsers | KneeSearch | FixedRates | SaturationSearch

MAX_RATE = 10_000.0


def parse_rates(text: str) -> list[float]:
    """``--rate 0.5,1,2,4``: increasing arrival rates in requests per second.

    Raises:
        UsersError: with the accepted form.
    """
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsersError(f"bad --rate {text!r}: give request rates per second like 0.5,1,2,4") from None
    if not rates:
        raise UsersError(f"bad --rate {text!r}: give request rates per second like 0.5,1,2,4")
    if any(not (0 < r <= MAX_RATE) or math.isnan(r) for r in rates):
        raise UsersError(f"bad --rate {text!r}: each rate must be above 0 and at most {MAX_RATE:g} requests/s")
    if any(b <= a for a, b in zip(rates, rates[1:], strict=False)):
        raise UsersError(f"bad --rate {text!r}: rates must be increasing")
    return rates


def parse_user_plan(text: str) -> FixedUsers | KneeSearch:
    """``1,2,4,8``, ``geom:1:64``, ``auto`` or ``auto:MAX``.

    Raises:
        UsersError: with the accepted forms.
    """
    t = text.strip().lower()
    if t == "auto" or t.startswith("auto:"):
        if t == "auto":
            return KneeSearch()
        try:
            top = int(t[5:])
        except ValueError:
            raise UsersError(f"bad --users {text!r}: auto:MAX takes a whole number, e.g. auto:256") from None
        if not 1 <= top <= MAX_USERS:
            raise UsersError(f"bad --users {text!r}: MAX must be between 1 and {MAX_USERS}")
        return KneeSearch(max_users=top)
    return FixedUsers(parse_users(text))


# -- a queue that does not stop growing -------------------------------------------------------

QUEUE_MIN_SPAN_S = 10.0
QUEUE_MIN_POINTS = 8


def queue_unbounded(points: Sequence[tuple[float, float]]) -> str | None:
    """Why the server's queue is growing without bound during a step, or None.

    ``points`` are (seconds into the measured window, requests waiting). The rule: over at least
    10 s and 8 polls, the least-squares trend adds at least max(5, half the starting queue)
    requests over the span, at least 70 % of poll-to-poll changes are not decreases, and the
    later half of the window still grows (by at least a quarter as much per second, and at least
    2 requests): a queue that rises and settles at a level is not unbounded. The monitor's
    "queue keeps growing" alert is the same idea on a shorter history.
    """
    if len(points) < QUEUE_MIN_POINTS:
        return None
    ts = np.asarray([p[0] for p in points], dtype=float)
    ws = np.asarray([p[1] for p in points], dtype=float)
    span = float(ts[-1] - ts[0])
    if span < QUEUE_MIN_SPAN_S:
        return None
    slope = float(np.polyfit(ts, ws, 1)[0])
    growth = slope * span
    steady = float(np.mean(np.diff(ws) >= 0))
    start = float(np.mean(ws[: max(1, len(ws) // 4)]))
    half = len(ts) // 2
    late_slope = float(np.polyfit(ts[half:], ws[half:], 1)[0])
    late_growth = late_slope * float(ts[-1] - ts[half])
    if growth >= max(5.0, 0.5 * start) and steady >= 0.7 and late_slope >= 0.25 * slope and late_growth >= 2.0:
        return f"queue unbounded: waiting grew {ws[0]:.0f} -> {ws[-1]:.0f} in {span:.0f} s ({slope:.1f}/s)"
    return None
