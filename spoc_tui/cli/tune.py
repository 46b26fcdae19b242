"""``spoc tune``: a headless tuning study with a line per trial and the Pareto set at the end."""

from __future__ import annotations

import sys
import traceback
from typing import Any

import click

from spoc_tui.cli.options import api_key_options, served_model_option, tls_options
from spoc_tui.cli.signals import stop_signals_interrupt
from spoc_tui.cli.types import FINITE
from spoc_tui.core.errors import EXIT_INTERRUPTED, EXIT_OK, InputError, SpocError
from spoc_tui.core.redact import redact_url
from spoc_tui.core.textsafe import for_terminal
from spoc_tui.tune.evaluate import ServerEvaluator, TuneFatal
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
from spoc_tui.tune.setup import TuneArgs, build
from spoc_tui.tune.study import TuneConfig, TuneSession


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
                    early = f"  stopped early: {r.early_stop.get('reason')}" if r.early_stop else ""
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
        saved = sum(float(r.early_stop.get("saved_s", 0.0)) for r in early)
        lines.append(f"  {len(early)} trial(s) stopped early, clearly dominated: {saved:.0f} s of measurement saved")
    return "\n".join(lines)


def _profile_best(cfg: TuneConfig, evaluator: ServerEvaluator, front: Front) -> None:
    """The best configuration's profile; a failure is reported, the study's results stand."""
    from spoc_tui.profile.report import render_text
    from spoc_tui.tune.profile_best import profile_best

    try:
        b = profile_best(cfg, evaluator, front, lambda msg: print(msg, flush=True))
    except SpocError as e:
        print(f"spoc tune: --profile-best: {for_terminal(str(e))}", file=sys.stderr)
        return
    print(render_text(b))
    print(f"profile: {cfg.out_dir}/profile/profile.json, {cfg.out_dir}/profile/profile.txt")


def run(a: TuneArgs) -> int:
    try:
        cfg, evaluator = build(a)
    except ValueError as e:
        raise InputError(str(e)) from None
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
    if a.profile_best and summary.status != "interrupted":
        _profile_best(cfg, evaluator, summary.front)
    if summary.status == "interrupted":
        print("stopped: continue with --resume", file=sys.stderr)
    print(
        f"results: {cfg.out_dir}/trials.jsonl, {cfg.out_dir}/pareto.json; study: "
        f"{redact_url(session.storage_url)} (opens in optuna-dashboard)"
    )
    return EXIT_OK if summary.status != "interrupted" else EXIT_INTERRUPTED


@click.command()
@click.option(
    "--launch",
    required=True,
    help='Command that starts the server, without a shell: "vllm serve MODEL --port {port} {flags}" or "spoc '
    'sim --port {port} {flags}".',
)
@click.option(
    "--space",
    default=None,
    help="Search space TOML file [default: built-in: max-num-seqs, max-num-batched-tokens, chunked prefill, prefix "
    "caching, gpu-memory-utilization].",
)
@click.option(
    "--objectives",
    default=TuneArgs.objectives,
    show_default=True,
    help="Two objectives: knee_users, out_tok_s, req_s, goodput, or a latency like ttft_p99 / itl_p99.",
)
@click.option("--sla", required=True, help='Limits (Optuna constraints), e.g. "ttft_p99<=2s,itl_p99<=100ms".')
@click.option(
    "--trials",
    type=int,
    default=TuneArgs.trials,
    show_default=True,
    help="Trials to run in the study (all workers together).",
)
@click.option(
    "--storage",
    default=None,
    help="Optuna storage: sqlite:///FILE, postgresql://USER@HOST/DB, journal:FILE [default: OUT/study.db].",
)
@click.option("--study", "study", default=TuneArgs.study, show_default=True, help="Study name in the storage.")
@click.option("--resume", is_flag=True, help="Continue the study (after a crash or Ctrl-C).")
@click.option("--worker", is_flag=True, help="Join a study another machine created (shared --storage).")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for trials.jsonl, pareto.json and each trial's server log and ramp.",
)
@click.option("--profile", default=TuneArgs.profile, show_default=True, help="Load profile of each trial's ramp.")
@click.option(
    "--users",
    default=TuneArgs.users,
    show_default=True,
    help="auto[:MAX]: the first trial's knee search sets the reference load (near saturation) for every "
    "trial; or user counts of each trial's ramp (the last is the reference load).",
)
@click.option(
    "--ref-users",
    type=int,
    default=None,
    help="Reference load for the objectives and the SLA [default: the last step].",
)
@click.option(
    "--step-seconds",
    type=FINITE,
    default=TuneArgs.step_seconds,
    show_default=True,
    help="Measured length of each step.",
)
@click.option(
    "--warmup-seconds",
    type=FINITE,
    default=TuneArgs.warmup_seconds,
    show_default=True,
    help="Load before each step's measurement starts.",
)
@click.option(
    "--seed",
    type=int,
    default=TuneArgs.seed,
    show_default=True,
    help="Makes the study reproducible (sampler and load).",
)
@click.option("--population", type=int, default=TuneArgs.population, show_default=True, help="NSGA-II population size.")
@click.option(
    "--screen-pool",
    type=int,
    default=TuneArgs.screen_pool,
    show_default=True,
    help="Children NSGA-II breeds per trial, of which a surrogate of the trials so far picks one to run (1: "
    "plain NSGA-II).",
)
@click.option(
    "--try",
    "tries",
    multiple=True,
    help='A configuration to run first, e.g. "--max-num-seqs 64 --no-enable-chunked-prefill"; flags left out '
    "take the server default (repeatable).",
)
@click.option(
    "--profile-best",
    is_flag=True,
    default=False,
    help="End with a torch-profiler profile of the best configuration at the reference load (vLLM 0.32+).",
)
@click.option(
    "--repeat-pareto",
    type=int,
    default=TuneArgs.repeat_pareto,
    show_default=True,
    help="Run each Pareto-optimal configuration this many more times at the end.",
)
@click.option(
    "--rerun-share",
    type=FINITE,
    default=TuneArgs.rerun_share,
    show_default=True,
    help="Share of --trials that may re-run configurations whose intervals overlap the front (0: none).",
)
@click.option(
    "--env", multiple=True, help="NAME=VALUE for the server's environment (repeatable; values are never written out)."
)
@click.option("--port", type=int, default=None, help="Port for the server [default: any free port].")
@click.option(
    "--start-timeout",
    type=FINITE,
    default=TuneArgs.start_timeout,
    show_default=True,
    help="Seconds a server may take to become ready.",
)
@served_model_option
@click.option("--tokenizer", default=None, help="Local tokenizer.json (or its folder) for exact prompt lengths.")
@click.option(
    "--workers", type=int, default=TuneArgs.workers, show_default=True, help="Local Locust worker processes per ramp."
)
@api_key_options("Bearer token for the server (never written to results).")
@tls_options
def tune(**kw: Any) -> None:
    """Search server flags with NSGA-II: each trial starts the server, runs a ramp, scores it.

    Prints a line per trial, appends OUT/trials.jsonl as trials finish and keeps
    OUT/pareto.json (the Pareto-optimal flags, their objectives and the hypervolume) current.
    Ctrl-C stops the running server and keeps every finished trial; --resume continues.
    """
    from spoc_tui.cli.tune import run

    sys.exit(run(TuneArgs(**kw)))
