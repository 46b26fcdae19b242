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

import numpy as np

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
            value = float(num) / (1000.0 if (unit or "s").lower() == "ms" else 1.0)
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
    keys = [lim.key for lim in out]
    if len(set(keys)) != len(keys):
        raise SlaError(f"SLA names a limit twice: {text!r}")
    return tuple(out)


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


def stats(values: Sequence[float]) -> dict[str, float | None]:
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
    latency: dict[str, dict[str, float | None]]
    cached_prompt_fraction: float | None
    verdict: dict[str, object] = field(default_factory=dict)
    server: dict[str, object] = field(default_factory=dict)
    """The server-side view during the step (queue, KV, preemptions, GPU clocks)."""

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def value(self, lim: Limit) -> float | None:
        if lim.metric == "error_rate":
            return self.error_rate
        return self.latency.get(lim.metric, {}).get(lim.stat)

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
            "verdict": self.verdict,
            "server": self.server,
        }


def summarize_step(
    step: int, users: int, samples: Sequence[RequestSample], duration_s: float, limits: Sequence[Limit]
) -> StepSummary:
    """Figures of one step from the requests that *started* inside its measured window."""
    ok = [s for s in samples if s.ok]
    errs: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            errs[s.error or "error"] = errs.get(s.error or "error", 0) + 1
    d = max(duration_s, 1e-9)
    lat = {
        "ttft": stats([s.ttft for s in ok if s.ttft is not None]),
        "itl": stats([g for s in ok for g in s.itl]),
        "tpot": stats([t for s in ok if (t := s.tpot) is not None]),
        "e2e": stats([s.e2e for s in ok if s.e2e is not None]),
    }
    prompt = sum(s.prompt_tokens or 0 for s in ok)
    cached = [s.cached_tokens for s in ok if s.cached_tokens is not None]
    summary = StepSummary(
        step=step,
        users=users,
        duration_s=duration_s,
        requests=len(samples),
        errors=len(samples) - len(ok),
        errors_by_kind=errs,
        request_rate=len(samples) / d,
        output_tokens_per_s=sum(s.output_tokens or 0 for s in ok) / d,
        goodput=sum(1 for s in samples if _meets(s, limits)) / d,
        latency=lat,
        cached_prompt_fraction=(sum(cached) / prompt) if cached and prompt else None,
    )
    summary.verdict = judge(summary, limits)
    return summary


def judge(step: StepSummary, limits: Sequence[Limit]) -> dict[str, object]:
    """Which limits hold; the worst breach; ``ok`` is False when there is no data at all."""
    if step.requests == 0:
        return {"ok": False, "checks": {}, "broken_limit": "no_requests", "worst_ratio": None}
    checks = {}
    worst: tuple[float, str] | None = None
    for lim in limits:
        v = step.value(lim)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            checks[lim.key] = {"value": None, "limit": lim.value, "ok": False}
            ratio = math.inf
        else:
            checks[lim.key] = {"value": v, "limit": lim.value, "ok": v <= lim.value}
            ratio = v / lim.value if lim.value else math.inf
        if not checks[lim.key]["ok"] and (worst is None or ratio > worst[0]):
            worst = (ratio, lim.key)
    return {
        "ok": all(c["ok"] for c in checks.values()) and step.requests > 0,
        "checks": checks,
        "broken_limit": worst[1] if worst else (None if step.requests else "no_requests"),
        "worst_ratio": None if worst is None or math.isinf(worst[0]) else worst[0],
    }


def badly_broken(step: StepSummary, abort_factor: float) -> bool:
    """Stop the ramp early: a limit exceeded ``abort_factor`` times, most requests failing,
    or nothing finishing at all."""
    v = step.verdict
    if step.requests == 0:
        return True
    if step.error_rate >= 0.5:
        return True
    ratio = v.get("worst_ratio")
    return isinstance(ratio, float) and ratio >= abort_factor


@dataclass(frozen=True, slots=True)
class Knee:
    max_users_within_sla: int | None
    first_failing_users: int | None
    broken_limit: str | None

    def as_dict(self) -> dict[str, object]:
        return {
            "max_users_within_sla": self.max_users_within_sla,
            "first_failing_users": self.first_failing_users,
            "broken_limit": self.broken_limit,
        }


def find_knee(steps: Sequence[StepSummary]) -> Knee:
    """The largest user count meeting the SLA before the first step that breaks it."""
    best: int | None = None
    for s in steps:
        if s.verdict.get("ok"):
            best = s.users
        else:
            limit = s.verdict.get("broken_limit")
            return Knee(best, s.users, None if limit is None else str(limit))
    return Knee(best, None, None)
