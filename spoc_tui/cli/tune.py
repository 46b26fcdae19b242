"""``spoc tune``: a headless tuning study with a line per trial and the Pareto set at the end."""

from __future__ import annotations

import sys
import traceback
from typing import TYPE_CHECKING

from spoc_tui.cli.signals import stop_signals_interrupt
from spoc_tui.core.errors import EXIT_INTERRUPTED, EXIT_OK, InputError, SpocError
from spoc_tui.core.redact import redact_url
from spoc_tui.core.textsafe import for_terminal
from spoc_tui.tune.args import TuneArgs
from spoc_tui.tune.evaluate import Evaluator, ServerEvaluator, TuneFatal
from spoc_tui.tune.events import (
    Note,
    OthersDone,
    RepeatDone,
    RepeatStarted,
    ServerReady,
    StudyOpened,
    TrialDone,
    TrialSkipped,
    TrialStarted,
    TuneEvent,
)
from spoc_tui.tune.records import Front
from spoc_tui.tune.report import hypervolume_text, member_tag, member_text, objectives_text, value_text
from spoc_tui.tune.setup import build
from spoc_tui.tune.study import TuneConfig, TuneSession

if TYPE_CHECKING:
    from spoc_tui.core.ramp.knee import UserPlan
    from spoc_tui.twin.model import Twin


class Printer:
    """One line per trial (and per note) on stdout."""

    def __init__(self, cfg: TuneConfig) -> None:
        self.cfg = cfg

    def __call__(self, ev: TuneEvent) -> None:
        o = self.cfg.objectives
        match ev:
            case StudyOpened(study=study, storage=storage, records=records):
                recs = [r for r in records if r.repeat_of is None]
                print(
                    f"study {study!r} in {storage}" + (f": {len(recs)} trial(s) already run" if recs else ""),
                    flush=True,
                )
            case Note(message=message):
                print(f"note: {message}", flush=True)
            case TrialStarted():
                seeded = f"  [{ev.seeded}]" if ev.seeded else ""
                print(f"trial {ev.ordinal}/{ev.total} (#{ev.number}): {' '.join(ev.flags)}{seeded}", flush=True)
            case ServerReady(start_s=start_s):
                print(f"  server ready in {start_s:.0f} s", flush=True)
            case TrialDone(record=r, front=front):
                if r.status == "ok":
                    tag = (
                        ""
                        if r.feasible
                        else "  breaks SLA (" + ", ".join(k for k, v in r.constraints.items() if v > 0) + ")"
                    )
                    m = front.member(r.number)
                    star = f"  * Pareto ({m.status})" if m is not None else ""
                    early = f"  stopped early: {r.early_stop.reason}" if r.early_stop else ""
                    again = f"  [re-run of #{r.repeat_of}]" if r.repeat_of is not None else ""
                    print(
                        f"  -> {objectives_text(o, r)}{tag}{star}{again}{early}   (hypervolume "
                        f"{hypervolume_text(front)})",
                        flush=True,
                    )
                else:
                    print(f"  -> {r.status}: {r.reason}", flush=True)
            case TrialSkipped(seeded=seeded) if seeded:  # NSGA-II's own repeats are skipped silently
                print(f"skipped #{ev.number} [{seeded}]: {ev.reason}", flush=True)
            case OthersDone(records=records):
                print(f"  other workers finished trial(s) {', '.join(f'#{r.number}' for r in records)}", flush=True)
            case RepeatStarted():
                print(f"repeat {ev.index}/{ev.total} of trial #{ev.number}: {' '.join(ev.flags)}", flush=True)
            case RepeatDone(record=r):
                print(f"  -> {objectives_text(o, r) if r.status == 'ok' else f'{r.status}: {r.reason}'}", flush=True)
            case _:
                pass  # server starting, ramp progress, the end: the CLI prints the table afterwards


def pareto_table(session: TuneSession, front: Front) -> str:
    o = session.cfg.objectives
    if not front.members:
        return "Pareto set: empty (no trial met the SLA)"
    runs = [r for r in session.records if not r.extra]
    reruns = sum(1 for r in runs if r.repeat_of is not None)
    head = (
        f"Pareto set ({len(front.members)} configurations of {len(runs)} runs, {reruns} of them re-runs), "
        f"hypervolume {hypervolume_text(front)}; values are pooled runs with their 95 % intervals:"
    )
    lines = [head]
    for m in front.members:
        lines.append(f"  #{m.record.number:<4} {member_text(o, m)}   [{member_tag(m)}]")
        lines.append(f"        {session.command(m.record.flags)}")
    for m in front.candidates:
        lines.append(
            f"  ?{m.record.number:<4} {member_text(o, m)}   [candidate, {m.runs} run(s): could still be on it]"
        )
    if not front.settled:
        lines.append(
            "  provisional: another configuration's interval reaches past it; more --trials (re-runs) or "
            "longer --step-seconds would settle it"
        )
    early = [r for r in session.records if r.early_stop]
    if early:
        saved = sum(r.early_stop.saved_s for r in early if r.early_stop)
        lines.append(f"  {len(early)} trial(s) stopped early, clearly dominated: {saved:.0f} s of measurement saved")
    return "\n".join(lines)


def _profile_best(cfg: TuneConfig, evaluator: ServerEvaluator, front: Front, plan: UserPlan) -> None:
    """The best configuration's profile; a failure is reported, the study's results stand."""
    from spoc_tui.profile.report import render_text
    from spoc_tui.tune.profile_best import profile_best

    try:
        b = profile_best(cfg, evaluator, front, lambda msg: print(msg, flush=True), plan=plan)
    except SpocError as e:
        print(f"spoc tune: --profile-best: {for_terminal(str(e))}", file=sys.stderr)
        return
    print(render_text(b))
    print(f"profile: {cfg.out_dir}/profile/profile.json, {cfg.out_dir}/profile/profile.txt")


def run(a: TuneArgs, twin: Twin | None = None) -> int:
    """The study; with ``twin``, every trial scored on the twin in virtual time instead of on a
    server the launch command starts."""
    try:
        cfg, server = build(a)
    except ValueError as e:
        raise InputError(str(e)) from None
    evaluator: Evaluator = server
    if twin is not None:
        from spoc_tui.twin.tuning import TwinEvaluator, check_space

        evaluator = TwinEvaluator(twin, server.ramp, check_space(twin, cfg.space.names, cfg.space.fixed))
    for note in cfg.space.notes:
        print(f"note: {note}", flush=True)
    print(
        f"search space: {cfg.space.source}, {cfg.space.size} configurations; objectives: "
        f"{', '.join(map(str, cfg.objectives))}; "
        f"SLA: {', '.join(map(str, cfg.limits))}",
        flush=True,
    )
    session = TuneSession(cfg, evaluator, Printer(cfg))
    try:
        with stop_signals_interrupt():
            session.open()
            summary = session.run()
    except TuneFatal as e:
        e.hint = f"finished trials are in {cfg.out_dir}/trials.jsonl"
        raise
    except SpocError:  # the study cannot start here (another process runs it): nothing of it is touched
        raise
    except Exception as e:  # a bug: say so in one line, keep the details in the output folder
        log = cfg.out_dir / "tune-error.log"
        log.write_text(traceback.format_exc())
        raise SpocError(
            f"internal error: {type(e).__name__}: {e} (details in {log})",
            hint=f"finished trials are in {cfg.out_dir}/trials.jsonl",
        ) from None
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: the server was stopped; finished trials are in {cfg.out_dir}/trials.jsonl and "
            f"{cfg.out_dir}/pareto.json;"
            f" continue with --resume",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    print(pareto_table(session, summary.front))
    for num, reps in summary.repeats.items():
        for ob in cfg.objectives:
            vals = [v for r in reps if (v := r.get(ob.name)) is not None]
            if vals:
                print(
                    f"  #{num} {ob.label} over {len(vals)} repeat(s): {value_text(ob, min(vals))} .. "
                    f"{value_text(ob, max(vals))}"
                )
    if summary.message:
        print(summary.message)
    if a.profile_best and summary.status != "interrupted" and isinstance(evaluator, ServerEvaluator):
        _profile_best(cfg, evaluator, summary.front, session.state.plan)
    if summary.status == "interrupted":
        print("stopped: continue with --resume", file=sys.stderr)
    print(
        f"results: {cfg.out_dir}/trials.jsonl, {cfg.out_dir}/pareto.json; study: "
        f"{redact_url(session.storage_url)} (opens in optuna-dashboard)"
    )
    return EXIT_OK if summary.status != "interrupted" else EXIT_INTERRUPTED


def run_with_twin(a: TuneArgs, twin_path: str, confirm: int) -> int:
    """``spoc tune --twin T --confirm N``: the study on the twin, then its N best configurations
    on the real server, printed (the flow: :func:`spoc_tui.twin.confirm.search_then_confirm`)."""
    from spoc_tui.twin.confirm import search_then_confirm

    done = search_then_confirm(a, twin_path, confirm, run, lambda line: print(line, flush=True))
    if done.none_within_sla:
        print("the twin found no configuration within the SLA: nothing to confirm on the server", file=sys.stderr)
    if not done.rows:
        return done.code
    print("predicted by the twin beside measured on the server:")
    for r in done.rows:
        pred = ", ".join(f"{k} {v:.4g}" for k, v in r.predicted.items() if v is not None)
        meas = ", ".join(f"{k} {v:.4g}" for k, v in (r.measured or {}).items() if v is not None) or r.measured_status
        print(f"  {' '.join(r.flags)}\n    predicted: {pred}\n    measured:  {meas}")
    out = a.out_dir
    print(f"results: {out}/twin (the search), {out}/confirm (the server), {out}/confirm.json")
    return done.code
