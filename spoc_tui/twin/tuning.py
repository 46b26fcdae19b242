"""A tuning study's trials scored on the twin in virtual time (``spoc tune --twin``).

Each trial's ramp (the study's: its calibration's saturation search, then the reference load,
or a trace at its speed) is the experiment ``spoc twin predict`` runs, with the trial's flags as
what-ifs on the twin: seconds a trial, where a trial on a server (or on ``spoc sim --twin``,
served in real time) costs a server start and minutes of load. Its steps are summarised and
judged as a measured trial's, so the study scores, ranks and stops on them exactly as it does on
a server's. What the twin cannot change (a flag outside :data:`WHAT_IF_FLAGS`) is refused before the
study starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

from spoc_tui.core.errors import InputError
from spoc_tui.core.ramp.inference import infer_knee
from spoc_tui.core.ramp.knee import find_knee
from spoc_tui.core.ramp.steps import StepSummary
from spoc_tui.load.ramp import RampConfig
from spoc_tui.tune.evaluate import TrialOutcome, TrialRequest, tokens_per_request
from spoc_tui.twin.engine import TwinEngine
from spoc_tui.twin.model import WHAT_IF_FLAGS, Twin, TwinError
from spoc_tui.twin.predict import Prediction, TraceRows, read_rows, run_ramp, run_trace_ramp


def what_if(config: Mapping[str, object]) -> dict[str, object]:
    """A trial's flags as the twin's what-if settings.

    Raises:
        InputError: a flag the twin cannot predict, or a value of the wrong kind.
    """
    out: dict[str, object] = {}
    for name, value in config.items():
        if name not in WHAT_IF_FLAGS:
            raise InputError(f"--{name}: the twin predicts only {', '.join('--' + k for k in WHAT_IF_FLAGS)}")
        key, kind = WHAT_IF_FLAGS[name]
        if kind == "bool":
            if not isinstance(value, bool):
                raise InputError(f"--{name} {value!r}: true or false")
            out[key] = value
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"--{name} {value!r}: a number")
        else:
            out[key] = int(value) if kind == "int" else float(value)
    return out


AS_CALIBRATED = {"max-model-len": "max_model_len", "block-size": "block_size"}
"""Settings the twin has as the server reported them: a search space may fix them at those values."""


def check_space(twin: Twin, names: Sequence[str], fixed: Mapping[str, object]) -> dict[str, object]:
    """The search space's fixed flags the twin applies (its what-ifs among them).

    Raises:
        InputError: naming a flag the space varies that the twin cannot predict, or one it fixes
            at another value than the twin was calibrated at.
    """
    bad = [n for n in names if n not in WHAT_IF_FLAGS]
    if bad:
        raise InputError(
            f"--twin: the twin predicts {', '.join('--' + k for k in WHAT_IF_FLAGS)}; the search space also varies "
            f"{', '.join('--' + b for b in bad)}: take {'them' if len(bad) > 1 else 'it'} out of --space, or search "
            "on the server"
        )
    out: dict[str, object] = {}
    for name, value in fixed.items():
        if name in WHAT_IF_FLAGS:
            out[name] = value
            continue
        attr = AS_CALIBRATED.get(name)
        have = getattr(twin.server, attr) if attr else None
        if have is None or value != have:
            why = f"the twin was calibrated at {have}" if have is not None else "which the twin cannot change"
            raise InputError(
                f"--twin: the search space fixes --{name} {value}, {why}: take it out of --space's [fixed], or "
                "search on the server"
            )
    return out


class TwinEvaluator:
    """Scores a configuration on the twin (the study's :class:`~spoc_tui.tune.evaluate.Evaluator`)."""

    def __init__(self, twin: Twin, ramp: RampConfig, fixed: Mapping[str, object] | None = None) -> None:
        """
        Args:
            fixed: flags every trial carries (the space's fixed ones), as what-ifs too.

        Raises:
            TwinError: the ramp's trace does not read (its row, named).
        """
        self.twin = twin
        self.ramp = ramp
        self.fixed = dict(fixed or {})
        self._stopping = threading.Event()
        self._rows: TraceRows | None = read_rows(ramp.trace, twin.server.max_model_len) if ramp.trace else None

    def stop(self) -> None:
        self._stopping.set()

    def evaluate(self, req: TrialRequest) -> TrialOutcome:
        """As :meth:`Evaluator.evaluate`; the plan's early stop is not asked (a trial on the twin
        takes seconds: there is nothing to save)."""
        config, trial = req.config, req.plan
        t0 = time.monotonic()
        try:
            settings = what_if({**self.fixed, **config})
            eng = TwinEngine(self.twin, flags=settings, jitter=False)  # the settings a server would refuse
        except (InputError, TwinError) as e:
            return TrialOutcome("infeasible", reason=f"server did not start: {e}", duration_s=time.monotonic() - t0)
        r = self.ramp
        p = Prediction(
            twin=self.twin,
            workload=r.workload,
            plan=trial.plan if trial is not None else r.plan,
            limits=tuple(r.limits),
            **r.values(),
            flags=settings,
            draws=0,
            trace=self._rows,
        )
        try:
            runs = (run_trace_ramp if self._rows is not None else run_ramp)(p, self.twin.fit, r.seed).runs
        except TwinError as e:
            return TrialOutcome("infeasible", reason=str(e), duration_s=time.monotonic() - t0)
        if self._stopping.is_set():
            return TrialOutcome("interrupted", duration_s=time.monotonic() - t0)
        steps: list[StepSummary] = [x.step for x in runs]
        if not steps:
            why = "no step of the ramp fits its budget"
            return TrialOutcome("infeasible", reason=why, duration_s=time.monotonic() - t0)
        windows = [(x.step.level, x.window) for x in runs]
        knee = find_knee(steps, infer_knee(windows, r.limits, steps[0].unit, seed=r.seed))
        return TrialOutcome(
            "ok",
            steps,
            knee,
            start_s=0.0,
            kv_tokens=eng.plan.kv_cache_tokens,
            max_model_len=eng.max_len,
            tokens_per_request=tokens_per_request([s for x in runs for s in x.window]),
            duration_s=time.monotonic() - t0,
        )
