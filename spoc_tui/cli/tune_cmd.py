"""``spoc tune``'s command line: its options, made into :class:`TuneArgs`, then the study
(:mod:`spoc_tui.cli.tune`). Light to import: Optuna loads when the command runs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import click

from spoc_tui.cli.experiment import option, rule_option
from spoc_tui.cli.options import (
    api_key_options,
    default_option,
    served_model_option,
    sla_option,
    tls_options,
    twin_option,
)
from spoc_tui.cli.types import FINITE, trace_selection
from spoc_tui.tune.args import TUNE_RULES, TuneArgs

F = TypeVar("F", bound=Callable[..., Any])


@click.command()
@click.option(
    "--launch",
    required=True,
    help='Command that starts the server, without a shell: "vllm serve MODEL --port {port} {flags}" or "spoc '
    'sim --port {port} {flags}".',
)
@click.option(
    "--space",
    help="Search space TOML file [default: built-in: max-num-seqs, max-num-batched-tokens, chunked prefill, prefix "
    "caching, gpu-memory-utilization].",
)
@default_option(
    "--objectives",
    TuneArgs.objectives,
    "Two objectives: knee_users, out_tok_s, req_s, goodput, or a latency like ttft_p99 / itl_p99.",
)
@sla_option('Limits (Optuna constraints), e.g. "ttft_p99<=2s,itl_p99<=100ms"')
@default_option("--trials", TuneArgs.trials, "Trials to run in the study (all workers together).", type=int)
@click.option(
    "--storage", help="Optuna storage: sqlite:///FILE, postgresql://USER@HOST/DB, journal:FILE [default: OUT/study.db]."
)
@default_option("--study", TuneArgs.study, "Study name in the storage.", "study")
@click.option("--resume", is_flag=True, help="Continue the study (after a crash or Ctrl-C).")
@click.option("--worker", is_flag=True, help="Join a study another machine created (shared --storage).")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for trials.jsonl, pareto.json and each trial's server log and ramp.",
)
@option("--profile", default=TuneArgs.profile, help="Load profile of each trial's ramp.")
@option(
    "--users",
    dest=None,
    default=TuneArgs.users,
    show_default=True,
    help="auto[:MAX]: the first trial's knee search sets the reference load (near saturation) for every "
    "trial; or user counts of each trial's ramp (the last is the reference load).",
)
@click.option("--ref-users", type=int, help="Reference load for the objectives and the SLA [default: the last step].")
@option(
    "--trace",
    dest=None,
    help="Score flags on this traffic trace instead of a profile: each trial replays it once at --speed.",
)
@option(
    "--speed",
    dest=None,
    type=FINITE,
    default=TuneArgs.speed,
    show_default=True,
    help="With --trace: the speed multiple.",
)
@trace_selection(filters=False)
@rule_option("step_s", default=TUNE_RULES.step_s)
@rule_option("warmup_s", default=TUNE_RULES.warmup_s, help="Load before each step's measurement starts.")
@rule_option("seed", default=TUNE_RULES.seed, help="Makes the study reproducible (sampler and load).")
@default_option("--population", TuneArgs.population, "NSGA-II population size.", type=int)
@default_option(
    "--screen-pool",
    TuneArgs.screen_pool,
    "Children NSGA-II breeds per trial, of which a surrogate of the trials so far picks one to run (1: plain NSGA-II).",
    type=int,
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
@default_option(
    "--repeat-pareto",
    TuneArgs.repeat_pareto,
    "Run each Pareto-optimal configuration this many more times at the end.",
    type=int,
)
@default_option(
    "--rerun-share",
    TuneArgs.rerun_share,
    "Share of --trials that may re-run configurations whose intervals overlap the front (0: none).",
    type=FINITE,
)
@click.option(
    "--env", multiple=True, help="NAME=VALUE for the server's environment (repeatable; values are never written out)."
)
@click.option("--port", type=int, help="Port for the server [default: any free port].")
@default_option("--start-timeout", TuneArgs.start_timeout, "Seconds a server may take to become ready.", type=FINITE)
@served_model_option
@click.option("--tokenizer", help="Local tokenizer.json (or its folder) for exact prompt lengths.")
@default_option("--workers", TuneArgs.workers, "Local Locust worker processes per ramp.", type=int)
@twin_option(
    "Search on this calibrated twin (spoc twin calibrate) in virtual time, seconds a trial, then run the best "
    "--confirm configurations on the server (--launch) and report predicted beside measured.",
    type=click.Path(dir_okay=False),
)
@default_option(
    "--confirm",
    2,
    "With --twin: how many of the twin's best configurations run on the real server.",
    type=click.IntRange(1, 20),
)
@api_key_options("Bearer token for the server (never written to results).")
@tls_options
def tune(twin_path: str | None, confirm: int, **kw: Any) -> None:
    """Search server flags with NSGA-II: each trial starts the server, runs a ramp, scores it.

    Prints a line per trial, appends OUT/trials.jsonl as trials finish and keeps
    OUT/pareto.json (the Pareto-optimal flags, their objectives and the hypervolume) current.
    Ctrl-C stops the running server and keeps every finished trial; --resume continues.
    """
    from spoc_tui.cli.options import from_config
    from spoc_tui.cli.tune import run, run_with_twin

    kw["sla"] = from_config(kw.get("sla"), "sla", "--sla")
    kw["rules"] = replace(TUNE_RULES, step_s=kw.pop("step_s"), warmup_s=kw.pop("warmup_s"), seed=kw.pop("seed"))
    if twin_path is not None:
        sys.exit(run_with_twin(TuneArgs(**kw), twin_path, confirm))
    sys.exit(run(TuneArgs(**kw)))
