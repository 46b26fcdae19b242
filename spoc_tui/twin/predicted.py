"""A predicted ramp's header (``spoc twin predict --out``, ``--json``): the experiment as a
measured ramp's says it, and the twin's part, as one :class:`~spoc_tui.core.results.RampHeader`."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from spoc_tui.core.results import RampHeader
from spoc_tui.twin.predict import Predicted, Prediction


def predicted_header(
    p: Prediction, res: Predicted, twin_path: str, users_spec: str, took: float, trace: dict[str, object] | None = None
) -> RampHeader:
    """A predicted ramp's header: the experiment as a measured ramp's says it, and the twin's part."""
    twin = p.twin
    return replace(
        RampHeader.of_rules(p),
        predicted=True,
        url=twin.url,
        model=twin.server.model,
        profile=p.workload.as_dict() if trace is None else {"name": f"trace:{trace['path']}"},
        trace=trace,
        sla=tuple(str(lim) for lim in p.limits),
        users=users_spec,
        load=(
            "predicted by the twin in virtual time: trace replay, every row sent at its timestamp divided by the "
            "step's speed (open loop), its exact input and output lengths, rows sharing hash ids sharing leading "
            "blocks, a turn waiting for its parent's end plus its think time"
            if p.trace is not None
            else "predicted by the twin in virtual time: open loop, Poisson arrivals at each step's rate, each the "
            "next turn of an idle conversation or a new one"
            if p.open_loop
            else "predicted by the twin in virtual time: closed loop, each user one conversation at a time, paced "
            "as spoc ramp's users (spawn rate, jitter, think time)"
        )
        + ("" if p.trace is not None else "; every answer as long as the profile asks"),
        started_at=time.time(),
        twin={
            "path": Path(twin_path).name,
            "calibrated_at": twin.calibrated_at,
            "url": twin.url,
            "what_if": dict(p.flags),
        },
        prediction=(
            {
                "draws": res.draws,
                "seconds": round(took, 2),
                "intervals": "95 %: the spread of the figures over the runs on the fit's bootstrap draws, joined with "
                "the fit's own sampling interval",
                "steps": [
                    {
                        "step": r.step.step,
                        "level": r.step.level,
                        "unit": r.step.unit,
                        "busy": round(r.engine.busy if r.engine else 0.0, 3),
                        "saturated": round(r.engine.saturated if r.engine else 0.0, 3),
                        "intervals": {k: list(v) for k, v in res.intervals[i].items()},
                        "note": res.step_notes(i),
                    }
                    for i, r in enumerate(res.runs)
                ],
                "knee_draws": res.draw_knees,
                "notes": res.notes,
            }
        ),
    )
