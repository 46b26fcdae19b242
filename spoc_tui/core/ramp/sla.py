"""SLA limits and the levels a ramp steps: what ``--sla``, ``--users`` and ``--rate`` mean.

An SLA is a list of limits, each a client-side latency statistic (``ttft``, ``itl``, ``tpot``,
``e2e`` at ``p50``/``p90``/``p95``/``p99``/``mean``, in ``ms`` or ``s``) or the error rate (in ``%``).
A level is a user count (closed loop) or an arrival rate in requests/s (open loop).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from spoc_tui.core.durations import duration_s
from spoc_tui.core.errors import InputError

METRICS = ("ttft", "itl", "tpot", "e2e")
STATS = ("p50", "p90", "p95", "p99", "mean")


MOST_STEP_S = 86_400.0
"""A step, and the longest an undecided one is measured on, is at most a day: longer is a typo
(and a prediction would simulate it for as long). A replay's step is its trace's span over its
speed: a year's trace at x1, or a minute's at x1e-9, is refused by the same rule."""


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
            if not pct:  # "error_rate<=1": one percent, or all of them? Never guess.
                raise SlaError(f"SLA clause {clause.strip()!r} has no unit: write error_rate<={num}%")
            value = float(num) / 100.0
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


PERCENTILE_Q = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
"""Each percentile statistic's quantile."""


LevelUnit = Literal["users", "req/s", "x"]
"""What a ramp steps: concurrent users (closed loop), an arrival rate (open loop), or a trace's
speed multiple (``x``: the trace's timestamps divided by it)."""


def level_text(level: float | None, unit: LevelUnit) -> str:
    """``8 users``, ``2.5 req/s`` or ``x2.5`` (a trace's speed)."""
    if level is None:
        return "?"
    if unit == "x":
        return f"x{level:g}"
    return f"{level:g} {unit}" if unit == "req/s" else f"{int(level)} users"


def levels_text(levels: Sequence[float], unit: LevelUnit) -> str:
    """``4, 8 users``, ``2, 4 req/s`` or ``x0.5, x1, x2``."""
    if unit == "x":
        return ", ".join(f"x{v:g}" for v in levels)
    return ", ".join(f"{v:g}" for v in levels) + f" {unit}"


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


MAX_SPEED = 1000.0


def parse_speeds(text: str) -> list[float]:
    """``--speed 0.5,1,2,4``: increasing speed multiples of a trace (its timestamps divided by each).

    Raises:
        UsersError: with the accepted form.
    """
    form = f"bad --speed {text!r}: give speed multiples like 0.5,1,2,4, or auto[:MAX]"
    try:
        speeds = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsersError(form) from None
    if not speeds:
        raise UsersError(form)
    if any(not (0 < v <= MAX_SPEED) or math.isnan(v) for v in speeds):
        raise UsersError(f"bad --speed {text!r}: each speed must be above 0 and at most {MAX_SPEED:g}")
    if any(b <= a for a, b in zip(speeds, speeds[1:], strict=False)):
        raise UsersError(f"bad --speed {text!r}: speeds must be increasing")
    return speeds


def parse_budget(text: str) -> float:
    """A time budget: ``10m``, ``90s``, ``1.5h``, or plain seconds; returned in seconds.

    Raises:
        UsersError: naming the accepted forms.
    """
    try:
        value = duration_s(text)
    except ValueError:
        raise UsersError(f"bad --budget {text!r}: give a duration like 10m, 90s or 1h") from None
    if not 0 < value < math.inf:
        raise UsersError(f"bad --budget {text!r}: it must be more than 0")
    return value
