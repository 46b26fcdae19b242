"""The twin's prediction of a measured step, made while the ramp ran (the shadow twin, issue 76):
kept on the step in ramp.json, so that whatever compares the twin with the server reads it rather
than simulating the ramp again."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from spoc_tui.core.confidence import Interval
from spoc_tui.core.ramp.steps.codec import Json, json_int, json_interval


@dataclass(frozen=True, slots=True)
class StepShadow:
    """One step as the twin predicted it, at the level and for the length it was measured, after
    the steps before it (the same figures ``spoc twin check`` works out afterwards)."""

    twin: str
    """Which twin: its file's name and a fingerprint of its contents (``twin.json#3f2a9c1e``)."""
    draws: int
    """Bootstrap draws of the fit beside it (the intervals' sample)."""
    figures: Mapping[str, float | None] = field(default_factory=dict)
    """``ttft_p50``, ``itl_p90``, ``e2e_p50``, ``output_tokens_per_s``...: the fit's prediction."""
    intervals: Mapping[str, Interval] = field(default_factory=dict)
    """Each figure's 95 % interval over the fit and its draws."""

    def as_dict(self) -> dict[str, object]:
        return {
            "twin": self.twin,
            "draws": self.draws,
            "figures": dict(self.figures),
            "intervals": {k: list(v) for k, v in self.intervals.items()},
        }

    @classmethod
    def from_dict(cls, d: Json) -> StepShadow:
        figs = d.get("figures")
        ivs = d.get("intervals")
        return cls(
            twin=str(d.get("twin") or ""),
            draws=json_int(d, "draws") or 0,
            figures={str(k): _number(v) for k, v in (figs.items() if isinstance(figs, Mapping) else ())},
            intervals={str(k): json_interval(v) for k, v in (ivs.items() if isinstance(ivs, Mapping) else ())},
        )


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None
