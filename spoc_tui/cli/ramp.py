"""``spoc ramp``: a headless load ramp with progress lines and a final table."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import click

from spoc_tui.cli.options import api_key_options, served_model_option, tls_options
from spoc_tui.cli.options import fail as _fail
from spoc_tui.cli.signals import stop_signals_interrupt
from spoc_tui.cli.types import FINITE
from spoc_tui.core import fmt
from spoc_tui.core.errors import EXIT_INTERRUPTED, EXIT_OK, SpocError
from spoc_tui.core.knee import FixedRates, UserPlan, parse_user_plan
from spoc_tui.core.sla import parse_rates, parse_sla
from spoc_tui.load.ramp import (
    DEFAULT_PROFILE,
    DEFAULT_USERS,
    RampConfig,
    RampError,
    RampProgress,
    RampResult,
    auto_workers,
    run_ramp,
)
from spoc_tui.load.report import step_table, verdict
from spoc_tui.load.workload import load_workload


def _progress(p: RampProgress) -> None:
    if p.phase == "preflight":
        print("checking the server and the model...", flush=True)
    elif p.phase == "starting":
        if p.message:
            print(p.message, flush=True)
        print("starting the load generator (Locust)...", flush=True)
    elif p.phase == "warmup":
        print(f"step {p.step}: {p.level_text}, warming up" + (f" ({p.message})" if p.message else ""), flush=True)
    elif p.phase == "extending" and p.message:
        print(f"step {p.step}: {p.message}", flush=True)
    elif p.phase == "step_done":
        s = p.steps[-1]
        decision, limit = verdict(s)
        mark = {"meets": "meets SLA", "breaks": f"BREAKS {limit}"}.get(decision, "INCONCLUSIVE")
        print(
            f"step {s.step}: {s.level_text}  {s.request_rate:.2f} req/s done  {s.output_tokens_per_s:.0f} out tok/s  "
            f"TTFT p99 {fmt.seconds(s.latency.ttft.p99)}  ITL p99 {fmt.seconds(s.latency.itl.p99)}  "
            f"errors {s.error_rate * 100:.1f}%  ({s.requests} requests) -> {mark}",
            flush=True,
        )
        if sat := s.client.saturated_text:
            print(f"  {sat}", flush=True)


def run(cfg: RampConfig) -> int:
    try:
        with stop_signals_interrupt():
            result: RampResult = asyncio.run(run_ramp(cfg, _progress))
    except RampError as e:
        if (Path(cfg.out_dir) / "ramp.json").exists():
            e.hint = f"finished steps are in {cfg.out_dir}/ramp.json"
        raise
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished steps are in {cfg.out_dir}/ramp.json", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(step_table(result.steps, result.knee))
    if result.status == "stopped_early":
        print(f"stopped early: {result.stop_reason}")
    print(f"results: {cfg.out_dir}/ramp.json, {cfg.out_dir}/requests.jsonl")
    return EXIT_OK


@click.command()
@click.option("--url", required=True, envvar="SPOC_VLLM_URL", show_envvar=True, help="The server (vLLM or spoc sim).")
@served_model_option
@click.option(
    "--profile",
    default=DEFAULT_PROFILE,
    show_default=True,
    help="Built-in profile (coding, logs, chatbot, mix, tuning) or a TOML file.",
)
@click.option(
    "--users",
    "users_spec",
    default=None,
    help=(
        "User counts, a series like geom:1:64, or auto[:MAX] to search for the knee (double, then bisect) "
        f"[default: {DEFAULT_USERS}]."
    ),
)
@click.option(
    "--rate",
    "rate_spec",
    default=None,
    help="Open loop instead of users: arrival rates in requests/s (Poisson, as vllm bench serve), e.g. 1,2,4,8.",
)
@click.option(
    "--step-seconds", type=FINITE, default=RampConfig.step_s, show_default=True, help="Measured length of each step."
)
@click.option(
    "--spawn-rate",
    type=FINITE,
    default=None,
    help="Users added per second when a step starts [default: fast enough for half the warm-up, 1-100/s].",
)
@click.option(
    "--max-step-seconds",
    type=FINITE,
    default=None,
    help="A step whose verdict is still inconclusive is measured on, up to this long [default: 4x --step-seconds].",
)
@click.option(
    "--warmup-seconds",
    type=FINITE,
    default=RampConfig.warmup_s,
    show_default=True,
    help="Start of each step left out of the figures.",
)
@click.option(
    "--poll-seconds",
    type=FINITE,
    default=RampConfig.poll_s,
    show_default=True,
    help=(
        "Longest time between two reads of the server's /metrics during a step (each read costs vLLM a few "
        "ms in the process that streams tokens; a short step is read every tenth of it, at most once a second)."
    ),
)
@click.option("--sla", required=True, help='Limits, e.g. "ttft_p99<=2s,itl_p99<=100ms,error_rate<=1%".')
@click.option(
    "--abort-factor",
    type=FINITE,
    default=RampConfig.abort_factor,
    show_default=True,
    help="Stop early when a limit is broken this many times over.",
)
@click.option(
    "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for ramp.json and requests.jsonl."
)
@click.option(
    "--workers",
    "workers_spec",
    default=str(RampConfig.workers),
    show_default=True,
    help="Local Locust worker processes (0: one process), or auto: one per 64 users, at most one per core but one.",
)
@click.option("--tokenizer", default=None, help="Local tokenizer.json (or its folder) for exact prompt lengths.")
@click.option("--dcgm", "dcgm_urls", multiple=True, help="dcgm-exporter URL, recorded next to each step.")
@click.option("--seed", type=int, default=RampConfig.seed, show_default=True, help="Random seed of the users.")
@api_key_options("Bearer token (never written to results).")
@tls_options
def ramp(
    url: str,
    model: str | None,
    profile: str,
    users_spec: str | None,
    rate_spec: str | None,
    step_seconds: float,
    max_step_seconds: float | None,
    spawn_rate: float | None,
    warmup_seconds: float,
    poll_seconds: float,
    sla: str,
    abort_factor: float,
    out_dir: str,
    workers_spec: str,
    tokenizer: str | None,
    dcgm_urls: tuple[str, ...],
    seed: int,
    api_key: str | None,
) -> None:
    """Step the number of concurrent multi-turn chat users (or, with --rate, the request rate)
    until the latency SLA breaks.

    Exit code 0 when the ramp ran (whatever the verdict), 1 when the server failed, 2 for
    bad arguments. Results are written as steps finish.
    """
    from spoc_tui.cli.ramp import run
    from spoc_tui.collectors.scrape import metrics_url

    try:
        metrics_url(url)
    except SpocError as e:
        _fail(str(e))
    limits = parse_sla(sla)
    if rate_spec is not None and users_spec is not None:
        _fail("give --users (closed loop) or --rate (open loop), not both")
    plan: UserPlan = (
        FixedRates(parse_rates(rate_spec)) if rate_spec is not None else parse_user_plan(users_spec or DEFAULT_USERS)
    )
    prof = load_workload(profile)
    if workers_spec.strip().lower() == "auto":
        workers = auto_workers(plan, os.cpu_count() or 1)
        click.echo(f"spoc ramp: --workers auto: {workers} worker process(es) on {os.cpu_count()} cores", err=True)
    else:
        try:
            workers = int(workers_spec)
        except ValueError:
            _fail(f"--workers {workers_spec!r}: give a number of processes or auto")
    cfg = RampConfig(
        url=url,
        workload=prof,
        plan=plan,
        max_step_s=max_step_seconds,
        spawn_rate=spawn_rate,
        limits=limits,
        out_dir=Path(out_dir),
        model=model,
        step_s=step_seconds,
        warmup_s=warmup_seconds,
        poll_s=poll_seconds,
        abort_factor=abort_factor,
        workers=workers,
        seed=seed,
        tokenizer=tokenizer,
        api_key=api_key,
        dcgm_urls=list(dcgm_urls),
    )
    cfg.validate()
    if spawn_rate is not None and spawn_rate > 100:
        click.echo("spoc ramp: warning: Locust advises spawn rates of at most 100 users/s", err=True)
    sys.exit(run(cfg))
