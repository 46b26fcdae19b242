"""A step's SLA verdict: each limit checked with its interval (judged in :mod:`.summary`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from spoc_tui.core.confidence import (
    Decision,
    Interval,
)
from spoc_tui.core.ramp.steps.codec import Json, _decision, _obj, json_float, json_interval

if TYPE_CHECKING:
    pass


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
