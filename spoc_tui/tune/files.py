"""A study's files: ``trials.jsonl`` (a line per finished trial) and ``pareto.json`` (the front
with its intervals, rewritten after each trial), written through the results codec with their
schema, commands redacted by the one redactor."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from spoc_tui.core import results
from spoc_tui.core.files import write_atomic
from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.redact import redact_argv, redact_url
from spoc_tui.core.tuning.docs import FirstRun, MemberDoc, ObjectiveDoc, StudyDoc, TrialRecord
from spoc_tui.core.tuning.noisyfront import MAX_RUNS
from spoc_tui.core.tuning.space import Objective, command_line
from spoc_tui.tune.records import Front, FrontMember


class StudySettings(Protocol):
    """What the files say of the study (:class:`~spoc_tui.tune.study.TuneConfig` has it)."""

    @property
    def out_dir(self) -> Path: ...
    @property
    def study_name(self) -> str: ...
    @property
    def objectives(self) -> tuple[Objective, ...]: ...
    @property
    def limits(self) -> tuple[Limit, ...]: ...
    @property
    def template(self) -> list[str]: ...
    @property
    def rerun_share(self) -> float: ...


class StudyFiles:
    """Writes a study's result files into its folder."""

    def __init__(self, cfg: StudySettings) -> None:
        self.cfg = cfg

    def append(self, rec: TrialRecord) -> None:
        """A finished trial's record, one line of trials.jsonl."""
        with open(self.cfg.out_dir / "trials.jsonl", "a") as f:
            f.write(results.dumps(rec.as_dict(), indent=None) + "\n")

    def command(self, flags: Sequence[str]) -> str:
        import shlex

        if not self.cfg.template:
            return " ".join(shlex.quote(x) for x in flags)
        return " ".join(shlex.quote(x) for x in redact_argv(command_line(self.cfg.template, flags, port=8000)))

    def _member(
        self, m: FrontMember, records: Sequence[TrialRecord], repeats: dict[int, list[dict[str, float | None]]]
    ) -> MemberDoc:
        r = m.record
        obs = self.cfg.objectives
        runs = [x for x in records if x.number in m.numbers]
        return MemberDoc(
            number=r.number,
            status=m.status,
            config=r.config,
            flags=r.flags,
            command=self.command(r.flags),
            objectives={o.name: m.values[i] for i, o in enumerate(obs)},
            ci95={o.name: list(m.ci95[i]) for i, o in enumerate(obs)},
            n={o.name: sum(int(x.n.get(o.name, 0)) for x in runs) for o in obs},
            runs=m.runs,
            trials=m.numbers,
            spread_cv={o.name: m.spread[i] for i, o in enumerate(obs)} if m.spread else None,
            first_run=FirstRun(r.objectives, r.ci95, r.n),
            reference=r.reference,
            repeats=repeats.get(r.number),
        )

    def write_pareto(
        self,
        front: Front,
        records: Sequence[TrialRecord],
        storage_url: str,
        repeats: dict[int, list[dict[str, float | None]]],
        status: str = "running",
        ref_users: int | None = None,
    ) -> None:
        """``status``: ``running`` while trials go on, then how the study ended (a study killed
        outright is marked ``interrupted`` by its trial's load generator, which outlives it a moment);
        ``ref_users``: the reference load the study found or was given."""
        cfg = self.cfg
        counted = [r for r in records if not r.extra]
        doc = StudyDoc(
            status=status,
            study=cfg.study_name,
            storage=redact_url(storage_url),
            objectives=tuple(ObjectiveDoc(o.name, o.direction, o.label) for o in cfg.objectives),
            sla=tuple(str(x) for x in cfg.limits),
            reference_load_users=ref_users,
            trials_run=len(counted),
            feasible=sum(1 for r in counted if r.feasible),
            infeasible=sum(1 for r in counted if r.status == "infeasible"),
            hypervolume=front.hypervolume,
            hypervolume_reference=list(front.reference),
            pareto=tuple(self._member(m, records, repeats) for m in front.members),
            candidates=tuple(self._member(m, records, {}) for m in front.candidates),
            settled=front.settled,
            run_to_run_cv=(
                {o.name: front.run_to_run_cv[i] for i, o in enumerate(cfg.objectives)} if front.run_to_run_cv else None
            ),
            noise=(
                "each configuration's runs are pooled (mean; 95 % interval from the larger of the within-run "
                "and between-run variance, and at least the run-to-run noise the study's repeated "
                "configurations measured, run_to_run_cv, also for a configuration run once); a front member is "
                "confirmed when no other configuration's interval could dominate it, provisional otherwise; "
                "candidates are off the front but their intervals "
                f"reach it. Re-runs: up to {cfg.rerun_share:.0%} of the trials, to the unsettled configuration "
                f"with the fewest runs (at most {MAX_RUNS} runs each)"
            ),
            reruns=sum(1 for r in records if r.repeat_of is not None and not r.extra),
            early_stopped={
                "trials": sum(1 for r in records if r.early_stop),
                "saved_s": round(sum(r.early_stop.saved_s for r in records if r.early_stop), 1),
            },
            updated_at=time.time(),
        )
        write_atomic(cfg.out_dir / "pareto.json", results.dumps(doc.as_dict()))
