"""The shadow twin (issue 76, point 3): ``spoc ramp --twin twin.json`` has the twin predict each
step as soon as it is measured, at its level and for its length, after the steps before it (the
very figures ``spoc twin check`` works out afterwards), and keeps the prediction on the step in
ramp.json (:class:`~spoc_tui.core.ramp.steps.StepShadow`); ``spoc twin check`` then reads them
instead of simulating the ramp again.

The prediction runs in a thread of its own at the lowest CPU priority, off the driver's event
loop: the host's load generator is not slowed by it (a ramp's figures are only as true as its
client)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from spoc_tui.core.ramp.rules import StepRules
from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.ramp.steps import StepShadow, StepSummary
from spoc_tui.twin.check import ramp_prediction
from spoc_tui.twin.model import Twin
from spoc_tui.twin.predict import TraceRows, predict_at
from spoc_tui.workload import Workload

logger = logging.getLogger(__name__)

SHADOW_DRAWS = 4
"""Bootstrap draws of the fit each step's prediction runs beside it (``spoc twin check``'s default
is 8: it runs once, after the ramp)."""


def twin_id(twin: Twin, path: str | Path) -> str:
    """``twin.json#3f2a9c1e``: the twin's file name and a fingerprint of what it holds (a twin
    calibrated again under the same name is another twin)."""
    blob = json.dumps(twin.as_dict(), sort_keys=True, default=str).encode()
    return f"{Path(path).name}#{hashlib.sha256(blob).hexdigest()[:8]}"


class ShadowTwin:
    """The experiment's ``shadow`` (:attr:`~spoc_tui.core.ramp.experiment.Experiment.shadow`):
    called with the steps measured so far, it returns the twin's prediction of the last."""

    def __init__(
        self,
        twin: Twin,
        name: str,
        workload: Workload,
        limits: tuple[Limit, ...],
        rows: TraceRows | None = None,
        draws: int = SHADOW_DRAWS,
        flags: Mapping[str, object] | None = None,
        rules: StepRules | None = None,
    ) -> None:
        """``rules``: the ramp's step rules (its pacing and seed: the prediction runs at the measured
        steps' levels and lengths)."""
        self.twin, self.name, self.workload, self.limits, self.rows = twin, name, workload, limits, rows
        self.draws = draws
        self.flags = dict(flags or {})
        self.rules = rules if rules is not None else StepRules()

    def predict(self, steps: Sequence[StepSummary]) -> StepShadow | None:
        """The last of ``steps`` as the twin predicts it (blocking, the caller's thread)."""
        measured = [s for s in steps if s.requests > 0]
        if not measured or measured[-1] is not steps[-1]:
            return None  # a step that measured nothing is not predicted (twin check leaves it out too)
        p = ramp_prediction(self.twin, self.workload, self.rows, measured, self.limits, self.rules, self.draws,
                            self.flags)  # fmt: skip
        at = predict_at(p, [(s.level, s.duration_s) for s in measured])
        return StepShadow(self.name, at.draws, dict(at.figures[-1]), dict(at.intervals[-1]))

    def __call__(self, steps: Sequence[StepSummary]) -> StepShadow | None:
        """:meth:`predict` in a thread of its own at the lowest CPU priority (Linux: a thread's
        own nice value), waited for."""
        out: list[StepShadow | None] = [None]
        failed: list[BaseException] = []

        def work() -> None:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
            except (OSError, AttributeError):  # not Linux: the thread runs at the process's priority
                pass
            try:
                out[0] = self.predict(steps)
            except Exception as e:
                failed.append(e)

        t = threading.Thread(target=work, name="spoc-shadow-twin", daemon=True)
        t.start()
        t.join()
        if failed:
            raise failed[0]
        return out[0]
