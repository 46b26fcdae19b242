"""``spoc twin check``: the twin's prediction of a ramp that was measured, step by step, and
whether the twin still holds (a server upgrade, a changed flag or a hot GPU shows as drift).

The measured ramp is re-run on the twin exactly as it ran (its profile, levels, step lengths,
warm-up, arrivals and seed, from its ramp.json), and each step's figures are compared: the
absolute error in percent of TTFT, ITL and E2E p50 and p90 and of output tokens/s, and whether the
measured figure lies inside the prediction's interval.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spoc_tui.core.knee import FixedRates
from spoc_tui.core.results import RampDoc
from spoc_tui.core.sla import parse_sla
from spoc_tui.load.workload import Workload, WorkloadError
from spoc_tui.twin.model import Twin, TwinError
from spoc_tui.twin.predict import Prediction, figure, predict_at

CHECKED = ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90", "e2e_p50", "e2e_p90", "output_tokens_per_s")
HOLDS_PCT = {"e2e_p50": 10.0, "itl_p50": 10.0, "ttft_p50": 25.0}
"""The twin holds while the median absolute error over the steps stays within these (percent):
twice the accuracy the README states for a fresh calibration, so noise alone does not trip it."""


@dataclass(frozen=True)
class StepCheck:
    level: str
    """``8 users`` or ``4 req/s``."""
    measured: dict[str, float | None]
    predicted: dict[str, float | None]
    interval: dict[str, tuple[float | None, float | None]]

    def error_pct(self, key: str) -> float | None:
        m, p = self.measured.get(key), self.predicted.get(key)
        if m is None or p is None or m <= 0:
            return None
        return 100.0 * abs(p - m) / m

    def inside(self, key: str) -> bool | None:
        m = self.measured.get(key)
        lo, hi = self.interval.get(key, (None, None))
        if m is None or lo is None or hi is None:
            return None
        return lo <= m <= hi


@dataclass(frozen=True)
class Check:
    steps: list[StepCheck]
    median_error: dict[str, float | None]
    holds: bool
    why: str
    draws: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "holds": self.holds,
            "why": self.why,
            "median_abs_error_pct": self.median_error,
            "thresholds_pct": HOLDS_PCT,
            "draws": self.draws,
            "steps": [
                {
                    "level": s.level,
                    "measured": s.measured,
                    "predicted": s.predicted,
                    "interval": {k: list(v) for k, v in s.interval.items() if k in CHECKED},
                    "abs_error_pct": {k: s.error_pct(k) for k in CHECKED},
                    "inside": {k: s.inside(k) for k in CHECKED},
                }
                for s in self.steps
            ],
        }


def _split(key: str) -> tuple[str, str]:
    if key == "output_tokens_per_s":
        return key, ""
    metric, stat = key.rsplit("_", 1)
    return metric, stat


def check(
    twin: Twin,
    ramp: RampDoc,
    header: dict[str, Any],
    draws: int,
    progress: Callable[[str], None] | None = None,
    flags: dict[str, object] | None = None,
) -> Check:
    """Raises: TwinError for a ramp the twin cannot re-run (a trace replay, open-loop rates)."""
    if any(s.speed is not None for s in ramp.steps):
        raise TwinError(f"{ramp.path}: the twin re-runs user and rate ramps; a trace replay's is not predicted yet")
    steps = [s for s in ramp.steps if s.requests > 0]
    if not steps:
        raise TwinError(f"{ramp.path}: no step measured any request")
    prof = header.get("profile")
    if not isinstance(prof, dict) or not prof.get("name"):
        raise TwinError(f"{ramp.path}: the ramp does not say its profile")
    try:
        workload = Workload.from_dict(prof)
    except (WorkloadError, KeyError, TypeError, ValueError) as e:
        raise TwinError(f"{ramp.path}: its profile does not read ({e})") from None
    p = Prediction(
        twin=twin,
        workload=workload,
        plan=FixedRates([s.rate for s in steps if s.rate is not None]) if steps[0].rate is not None else None,
        limits=tuple(parse_sla(",".join(ramp.sla))) if ramp.sla else (),
        step_s=float(header.get("step_seconds") or 60.0),
        warmup_s=float(header.get("warmup_seconds") or 10.0),
        arrivals=str(header.get("arrivals") or "staggered"),
        spawn_rate=header.get("spawn_rate") if isinstance(header.get("spawn_rate"), (int, float)) else None,
        seed=int(header.get("seed") or 0),
        draws=draws,
        flags=flags or {},
    )
    at = predict_at(p, [(s.level, s.duration_s) for s in steps], progress)
    out = []
    for s, pred, iv in zip(steps, at.figures, at.intervals, strict=True):
        measured = {k: figure(s, *_split(k)) for k in CHECKED}
        out.append(StepCheck(s.level_text, measured, pred, iv))
    med: dict[str, float | None] = {}
    for k in CHECKED:
        errs = [err for st in out if (err := st.error_pct(k)) is not None]
        med[k] = statistics.median(errs) if errs else None
    broken = [
        f"{k.replace('_', ' ')} off by {med[k]:.0f} % (median over steps; holds within {lim:g} %)"
        for k, lim in HOLDS_PCT.items()
        if med.get(k) is not None and med[k] > lim  # type: ignore[operator]
    ]
    if broken:
        why = "the server no longer behaves as calibrated: " + "; ".join(broken) + ". Recalibrate (spoc twin calibrate)"
    else:
        why = "within " + ", ".join(f"{k.replace('_', ' ')} {v:g} %" for k, v in HOLDS_PCT.items())
    return Check(out, med, not broken, why, at.draws)
