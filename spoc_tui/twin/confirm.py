"""A study on the twin, then its best configurations confirmed on the server (``spoc tune
--twin T --confirm N``): the flow as a service, whatever prints it. The search runs in virtual
time (each trial's ramp predicted with the trial's flags as what-ifs, in OUT/twin), then the N
best by the first objective run on the real server (OUT/confirm), and each one's predicted
objectives stand beside the measured ones (OUT/confirm.json)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from spoc_tui.core.errors import EXIT_OK, InputError
from spoc_tui.core.files import write_atomic
from spoc_tui.core.results import read_pareto, read_trials
from spoc_tui.core.tuning.docs import MemberDoc, TrialRecord
from spoc_tui.tune.args import TuneArgs
from spoc_tui.twin.model import Twin, read_twin

CONFIRM_SCHEMA = 1

StudyRunner = Callable[[TuneArgs, Twin | None], int]
"""Runs one study and returns its exit code (``spoc tune``'s, which prints as it goes): on the
twin when given one, else on the server the launch command starts."""


@dataclass(frozen=True)
class Confirmation:
    """One of the twin's best configurations, predicted beside measured."""

    flags: tuple[str, ...]
    predicted: Mapping[str, float | None]
    predicted_ci95: Mapping[str, tuple[float | None, float | None]] | None
    measured: Mapping[str, float | None] | None
    measured_status: str | None
    """``ok``, ``infeasible``... as the trial ended, or ``not run``."""

    def as_dict(self) -> dict[str, object]:
        return {
            "flags": list(self.flags),
            "predicted": dict(self.predicted),
            "predicted_ci95": (
                {k: list(v) for k, v in self.predicted_ci95.items()} if self.predicted_ci95 is not None else None
            ),
            "measured": dict(self.measured) if self.measured is not None else None,
            "measured_status": self.measured_status,
        }


@dataclass(frozen=True)
class Confirmed:
    """How the flow ended: its exit code and what was confirmed (empty when the twin found no
    configuration within the SLA, or its study did not finish)."""

    code: int
    rows: tuple[Confirmation, ...] = ()
    none_within_sla: bool = False
    """The twin's study found no configuration within the SLA: nothing ran on the server."""


def confirmations(best: Sequence[MemberDoc], trials: Sequence[TrialRecord]) -> list[Confirmation]:
    """Each of ``best`` (the twin's members) beside its trial on the server (trials.jsonl's)."""
    rows = []
    for m in best:
        got = next((r for r in trials if r.flags == m.flags and not r.extra), None)
        rows.append(
            Confirmation(
                flags=tuple(m.flags),
                predicted=dict(m.objectives),
                predicted_ci95={k: (v[0], v[1]) for k, v in m.ci95.items()},
                measured=dict(got.objectives) if got else None,
                measured_status=got.status if got else "not run",
            )
        )
    return rows


def search_then_confirm(
    a: TuneArgs, twin_path: str, confirm: int, run: StudyRunner, say: Callable[[str], None]
) -> Confirmed:
    """The flow (see the module's text); ``say``: a line for the user as it goes.

    Raises:
        InputError: --resume, --worker or --storage (the flow runs two studies of its own); a
            twin that does not read (before any trial).
    """
    twin = read_twin(twin_path)  # refused now, not at the first trial
    if a.resume or a.worker or a.storage:
        raise InputError("--twin runs two studies of its own: without --resume, --worker or --storage")
    out = Path(a.out_dir)
    say(f"== on the twin ({twin_path}, in virtual time): {a.trials} trials")
    t0 = time.monotonic()
    code = run(replace(a, out_dir=str(out / "twin"), env=(), profile_best=False, repeat_pareto=0), twin)
    if code != EXIT_OK:
        return Confirmed(code)
    say(f"the twin's study took {time.monotonic() - t0:.0f} s")
    pareto = read_pareto(out / "twin")
    best = pareto.best(confirm)
    if not best:
        return Confirmed(EXIT_OK, none_within_sla=True)
    first = pareto.objectives[0].name
    say(f"== on the server: the twin's {len(best)} best by {first}")
    tries = tuple(" ".join(m.flags) for m in best)
    code = run(replace(a, tries=tries, trials=len(best), out_dir=str(out / "confirm"), rerun_share=0.0), None)
    rows = confirmations(best, read_trials(out / "confirm"))
    doc = {"schema": CONFIRM_SCHEMA, "twin": twin_path, "confirmed": [r.as_dict() for r in rows]}
    write_atomic(out / "confirm.json", json.dumps(doc, indent=2))
    return Confirmed(code, tuple(rows))
