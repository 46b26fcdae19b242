"""A step's latency figures with their intervals, and its totals."""

from __future__ import annotations

from dataclasses import dataclass

from spoc_tui.core.confidence import (
    Interval,
)
from spoc_tui.core.ramp.steps.codec import Json, _obj, json_float, json_int, json_interval

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
