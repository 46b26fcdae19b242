"""``spoc twin check``: the twin's prediction of a ramp that was measured, step by step, and
whether the twin still holds (a server upgrade, a changed flag or a hot GPU shows as drift).

The measured ramp is re-run on the twin exactly as it ran (its profile, levels, step lengths,
warm-up, arrivals and seed, from its ramp.json), and each step's figures are compared: the
absolute error in percent of TTFT, ITL and E2E p50 and p90 and of output tokens/s, and whether the
measured figure lies inside the prediction's interval.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from spoc_tui.core.files import not_a_file
from spoc_tui.core.ramp.knee import FixedRates, FixedSpeeds, FixedUsers, UserPlan
from spoc_tui.core.ramp.rules import StepRules
from spoc_tui.core.ramp.sla import Limit, parse_sla
from spoc_tui.core.ramp.steps import StepSummary, json_int
from spoc_tui.core.results import RampDoc, RampHeader
from spoc_tui.core.traces.read import TraceError, TraceSource
from spoc_tui.twin.model import Twin, TwinError
from spoc_tui.twin.predict import AtLevels, Prediction, TraceRows, figure, predict_at, read_rows
from spoc_tui.workload import Workload, WorkloadError

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


CLOCK_DROP_PCT = 10.0
"""A GPU whose SM clock over the ramp ran this much under its clock at calibration is named: the
twin's step times were fitted at the calibration's clocks."""


@dataclass(frozen=True)
class ClockCheck:
    """One GPU's SM clock at calibration (twin.json, with ``--dcgm``) and over the ramp (the
    median of its steps' DCGM readings), and any throttling the ramp saw."""

    gpu: str
    calibrated_mhz: float
    ramp_mhz: float
    throttled: tuple[str, ...]

    @property
    def change_pct(self) -> float:
        return 100.0 * (self.ramp_mhz / self.calibrated_mhz - 1.0)

    @property
    def slower(self) -> bool:
        return self.change_pct <= -CLOCK_DROP_PCT or bool(self.throttled)

    @property
    def text(self) -> str:
        why = f", throttled: {', '.join(self.throttled)}" if self.throttled else ""
        return (
            f"GPU {self.gpu} ran at {self.ramp_mhz:,.0f} MHz over the ramp against {self.calibrated_mhz:,.0f} at "
            f"calibration ({self.change_pct:+.0f} %{why})"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "gpu": self.gpu,
            "calibrated_mhz": self.calibrated_mhz,
            "ramp_mhz": self.ramp_mhz,
            "change_pct": round(self.change_pct, 1),
            "throttled": list(self.throttled),
        }


def clock_checks(twin: Twin, steps: Sequence[StepSummary]) -> list[ClockCheck]:
    """Each GPU the twin recorded clocks for and the ramp read (``spoc ramp --dcgm``)."""
    out: list[ClockCheck] = []
    for gpu, mhz in sorted(twin.gpu_clocks.items()):
        seen = [g for s in steps for g in s.server.gpus or () if g.gpu == gpu]
        clocks = [g.sm_clock_mhz for g in seen if g.sm_clock_mhz is not None]
        if not clocks or mhz <= 0:
            continue
        reasons = sorted({r for g in seen if g.throttled for r in g.throttle_reasons if r in g.THROTTLING})
        out.append(ClockCheck(gpu, mhz, statistics.median(clocks), tuple(reasons)))
    return out


@dataclass(frozen=True)
class Check:
    steps: list[StepCheck]
    median_error: dict[str, float | None]
    holds: bool
    why: str
    draws: int
    clocks: list[ClockCheck] = field(default_factory=list)
    """The GPUs' clocks against calibration (where both the twin and the ramp read DCGM)."""
    source: str = "simulated"
    """``shadow``: the predictions were made as the ramp ran (``spoc ramp --twin``) and read from
    ramp.json; ``simulated``: worked out now."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "holds": self.holds,
            "why": self.why,
            "median_abs_error_pct": self.median_error,
            "thresholds_pct": HOLDS_PCT,
            "draws": self.draws,
            "predictions": self.source,
            "gpu_clocks": [c.as_dict() for c in self.clocks],
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


def _trace_rows(twin: Twin, where: str, header: RampHeader, path: str | None) -> TraceRows:
    """The rows the ramp replayed: ``path`` read with the selection the ramp recorded (format,
    filters, window, row cap, think), and refused unless it gives as many rows as the ramp read."""
    if header.trace is None:
        raise TwinError(f"{where}: a trace replay whose ramp.json does not say its trace")
    try:
        recorded = TraceSource.from_dict(dict(header.trace))
    except TraceError as e:
        raise TwinError(f"{where}: its trace selection does not read ({e})") from None
    name = recorded.path.name
    if path is None:
        raise TwinError(f"{where} replayed the trace {name}: give it with --trace FILE")
    if (why := not_a_file(path)) is not None:  # named plainly, before the selection below is read
        raise TwinError(f"--trace {path}: {why}")
    rows = read_rows(replace(recorded, path=Path(path)), twin.server.max_model_len)
    want = json_int(header.trace, "rows")
    if want is not None and want != rows.read:
        raise TwinError(
            f"--trace {path}: {rows.read} rows in the ramp's window, where the ramp replayed {want} of {name}: "
            "not the trace it replayed"
        )
    return rows


def _split(key: str) -> tuple[str, str]:
    if key == "output_tokens_per_s":
        return key, ""
    metric, stat = key.rsplit("_", 1)
    return metric, stat


def ramp_prediction(
    twin: Twin,
    workload: Workload,
    rows: TraceRows | None,
    steps: Sequence[StepSummary],
    limits: tuple[Limit, ...],
    rules: StepRules,
    draws: int,
    flags: Mapping[str, object],
) -> Prediction:
    """The prediction of a measured ramp's ``steps`` at their levels (a trace's speeds, the
    rates, or the users), by its step ``rules`` (its levels and their lengths are the measured
    steps': no budget or longest step of its own), on ``draws`` of the fit with the what-if
    ``flags``: what ``spoc twin check`` and the shadow twin of ``spoc ramp --twin``
    (:mod:`spoc_tui.twin.shadow`) run."""
    if rows is not None:
        plan: UserPlan = FixedSpeeds([s.level for s in steps])
    elif steps[0].rate is not None:
        plan = FixedRates([s.rate for s in steps if s.rate is not None])
    else:
        plan = FixedUsers([int(s.level) for s in steps])
    rules = replace(rules.rules(), max_step_s=None, budget_s=None)
    return Prediction(twin=twin, workload=workload, trace=rows, plan=plan, limits=limits, **rules.values(),
                      draws=draws, flags=dict(flags))  # fmt: skip


def check(
    twin: Twin,
    ramp: RampDoc,
    draws: int,
    progress: Callable[[str], None] | None = None,
    flags: dict[str, object] | None = None,
    trace: str | None = None,
    shadow_id: str | None = None,
) -> Check:
    """``trace``: the trace file a trace replay's ramp replayed (ramp.json keeps its name and how
    its rows were selected, not its path). ``shadow_id``: the twin's (:func:`~spoc_tui.twin.shadow.
    twin_id`): where every measured step holds this twin's prediction, made as the ramp ran
    (``spoc ramp --twin``), those are read and nothing is simulated (no what-if ``flags``).

    Raises: TwinError for a ramp the twin cannot re-run: one that does not say its profile, a
    trace replay without its trace (or with another trace).
    """
    steps = [s for s in ramp.steps if s.requests > 0]
    if not steps:
        raise TwinError(f"{ramp.path}: no step measured any request")
    shadows = [s.shadow for s in steps if s.shadow is not None and s.shadow.twin == shadow_id]
    if shadow_id is not None and not flags and len(shadows) == len(steps):
        at = AtLevels([(s.level, s.duration_s) for s in steps], [dict(sh.figures) for sh in shadows],
                      [dict(sh.intervals) for sh in shadows], shadows[0].draws)  # fmt: skip
        return judged(twin, steps, at, "shadow")
    replay = any(s.speed is not None for s in steps)
    header = ramp.header
    rows = _trace_rows(twin, ramp.path, header, trace) if replay else None
    if not replay and trace is not None:
        raise TwinError(f"{ramp.path} is not a trace replay: --trace goes with a ramp that ran spoc ramp --trace")
    prof = header.profile
    if replay:
        workload = Workload(name="trace")
    elif not prof.get("name"):
        raise TwinError(f"{ramp.path}: the ramp does not say its profile")
    else:
        try:
            workload = Workload.from_dict(dict(prof))
        except (WorkloadError, KeyError, TypeError, ValueError) as e:
            raise TwinError(f"{ramp.path}: its profile does not read ({e})") from None
    p = ramp_prediction(
        twin,
        workload,
        rows,
        steps,
        tuple(parse_sla(",".join(ramp.sla))) if ramp.sla else (),
        header.step_rules(),
        draws,
        flags or {},
    )
    at = predict_at(p, [(s.level, s.duration_s) for s in steps], progress)
    return judged(twin, steps, at, "simulated")


def judged(twin: Twin, steps: Sequence[StepSummary], at: AtLevels, source: str) -> Check:
    """The measured ``steps`` beside the twin's figures for them, and whether the twin holds."""
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
    clocks = clock_checks(twin, steps)
    slow = [c.text for c in clocks if c.slower]
    if broken:
        why = "the server no longer behaves as calibrated: " + "; ".join(broken)
        if slow:
            why += ". The GPUs ran slower than at calibration (" + "; ".join(slow) + "): cool them or lift the cap"
            why += " and measure again, or recalibrate at these clocks"
        else:
            why += ". Recalibrate (spoc twin calibrate)"
    else:
        why = "within " + ", ".join(f"{k.replace('_', ' ')} {v:g} %" for k, v in HOLDS_PCT.items())
        if slow:
            why += "; but " + "; ".join(slow)
    return Check(out, med, not broken, why, at.draws, clocks, source)


def answers_of(ramp_dir: Path, header: RampHeader) -> list[tuple[int, bool | None]]:
    """The answers' lengths a measured ramp saw (its ``requests.jsonl``: every request that
    finished), each with whether the server cut it at ``max_tokens`` (None where the file does
    not say), for the twin to learn (``spoc twin check --learn-answers``, through
    :func:`~spoc_tui.twin.answers.learned_lengths`).

    Raises: TwinError where they say nothing of the server's own lengths: a profile that ran
    with ``ignore_eos`` (every answer as long as asked), or no finished request.
    """
    if header.profile.get("ignore_eos"):
        raise TwinError(
            f"{ramp_dir}: its profile set ignore_eos, so every answer was as long as asked: a ramp whose "
            "answers the server ended teaches the twin their lengths"
        )
    lengths: list[tuple[int, bool | None]] = []
    try:
        with open(ramp_dir / "requests.jsonl", encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    d = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(d, dict):  # a line of another shape: not a request
                    continue
                n = d.get("output_tokens")
                if d.get("ok") and isinstance(n, int) and not isinstance(n, bool) and n > 0:
                    cut = d.get("cut")
                    lengths.append((n, cut if isinstance(cut, bool) else None))
    except OSError as e:
        raise TwinError(f"{ramp_dir}/requests.jsonl: cannot read ({e.strerror or e})") from None
    if not lengths:
        raise TwinError(f"{ramp_dir}/requests.jsonl: no finished request to learn the answers' lengths from")
    return lengths
