"""``spoc ramp``'s command line: its options, checked and made into a :class:`RampConfig`, then
the ramp with its progress lines (:mod:`spoc_tui.cli.ramp`). Light to import: the ramp's
machinery loads when the command runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from spoc_tui.cli.options import api_key_options, config_values, from_config, served_model_option, tls_options
from spoc_tui.cli.types import FINITE, selected_trace, trace_selection, trace_think_option
from spoc_tui.core.errors import InputError, SpocError
from spoc_tui.core.sla import DEFAULT_SLA, parse_budget, parse_rates, parse_sla
from spoc_tui.load import defaults as ramp_defaults
from spoc_tui.load.defaults import DEFAULT_BUDGET_S, DEFAULT_PROFILE, DEFAULT_USERS, ArrivalMode

if TYPE_CHECKING:
    from spoc_tui.core.knee import UserPlan


@click.command("ramp")
@click.option(
    "--url",
    envvar="SPOC_VLLM_URL",
    show_envvar=True,
    default=None,
    help="The server (vLLM or spoc sim) [default: config.toml's first vllm_urls].",
)
@served_model_option
@click.option(
    "--profile",
    default=DEFAULT_PROFILE,
    show_default=True,
    help="Built-in profile (coding, logs, chatbot, mix, tuning, agent) or a TOML file.",
)
@click.option(
    "--users",
    "users_spec",
    default=None,
    help=(
        "User counts, a series like geom:1:64, or auto[:MAX]: search for the knee, inferring it across steps "
        "with its 95 % interval, until the interval is within 5 % or --budget is spent (while it doubles, a "
        f"step far under every limit ends early) [default: {DEFAULT_USERS}]."
    ),
)
@click.option(
    "--rate",
    "rate_spec",
    default=None,
    help="Open loop instead of users: arrival rates in requests/s (Poisson, as vllm bench serve), e.g. 1,2,4,8.",
)
@click.option(
    "--trace",
    "trace_path",
    default=None,
    type=click.Path(dir_okay=False),
    help=(
        "Replay this traffic trace instead of a profile (Mooncake, Bailian, BurstGPT, Azure, WEKA or spoc JSONL): "
        "each step sends its rows on their timestamps divided by a --speed."
    ),
)
@click.option(
    "--speed",
    "speed_spec",
    default=None,
    help=(
        "With --trace: speed multiples, one step each (0.5,1,2,4), or auto[:MAX]: search the knee in speed "
        "multiples of the trace [default: auto]."
    ),
)
@trace_selection()
@trace_think_option
@click.option(
    "--step-seconds", type=FINITE, default=ramp_defaults.STEP_S, show_default=True, help="Measured length of each step."
)
@click.option(
    "--spawn-rate",
    type=FINITE,
    default=None,
    help="Users added per second when a step starts [default: fast enough for half the warm-up, 1-100/s].",
)
@click.option(
    "--arrivals",
    type=click.Choice(["staggered", "lockstep"]),
    default=ramp_defaults.ARRIVALS,
    show_default=True,
    help=(
        "staggered: starts and turns jittered so users cannot fall into lockstep; lockstep: at each step every "
        "user restarts at once once the requests in flight end, no jitter (the worst case; how AIPerf and "
        "GuideLLM start their probes)."
    ),
)
@click.option(
    "--budget",
    "budget_spec",
    default=None,
    help=(
        "Most load time the ramp runs, warm-ups included (10m, 90s, 1h); no step starts once it is spent "
        f"[default: {DEFAULT_BUDGET_S / 60:g}m for the knee search, none for listed levels]."
    ),
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
    default=ramp_defaults.WARMUP_S,
    show_default=True,
    help="Start of each step left out of the figures.",
)
@click.option(
    "--poll-seconds",
    type=FINITE,
    default=ramp_defaults.POLL_S,
    show_default=True,
    help=(
        "Longest time between two reads of the server's /metrics during a step (each read costs vLLM a few "
        "ms in the process that streams tokens; a short step is read every tenth of it, at most once a second)."
    ),
)
@click.option(
    "--sla",
    envvar="SPOC_SLA",
    show_envvar=True,
    default=None,
    help=f'Limits, e.g. "ttft_p99<=2s,error_rate<=1%" [default: config.toml\'s sla, else {DEFAULT_SLA}].',
)
@click.option(
    "--abort-factor",
    type=FINITE,
    default=ramp_defaults.ABORT_FACTOR,
    show_default=True,
    help="Stop early when a limit is broken this many times over.",
)
@click.option(
    "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for ramp.json and requests.jsonl."
)
@click.option(
    "--workers",
    "workers_spec",
    default=str(ramp_defaults.WORKERS),
    show_default=True,
    help="Local Locust worker processes (0: one process), or auto: one per 64 users, at most one per core but one.",
)
@click.option("--tokenizer", default=None, help="Local tokenizer.json (or its folder) for exact prompt lengths.")
@click.option("--dcgm", "dcgm_urls", multiple=True, help="dcgm-exporter URL, recorded next to each step.")
@click.option("--seed", type=int, default=ramp_defaults.SEED, show_default=True, help="Random seed of the users.")
@api_key_options("Bearer token (never written to results).")
@tls_options
def ramp_cmd(
    url: str | None,
    model: str | None,
    profile: str,
    users_spec: str | None,
    rate_spec: str | None,
    trace_path: str | None,
    speed_spec: str | None,
    trace_format: str | None,
    trace_filters: tuple[str, ...],
    trace_window: str | None,
    trace_max_rows: int | None,
    trace_think: str,
    step_seconds: float,
    arrivals: ArrivalMode,
    budget_spec: str | None,
    max_step_seconds: float | None,
    spawn_rate: float | None,
    warmup_seconds: float,
    poll_seconds: float,
    sla: str | None,
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
    from spoc_tui.core.knee import FixedRates, parse_speed_plan, parse_user_plan
    from spoc_tui.load.ramp import RampConfig, auto_workers
    from spoc_tui.workload import load_workload

    conf = config_values() if not (url and sla and dcgm_urls) else {}
    url = from_config(url, "vllm_urls", "--url", conf)
    sla = from_config(sla, "sla", "--sla", conf, default=DEFAULT_SLA)
    if not dcgm_urls:
        configured = conf.get("dcgm_urls")
        dcgm_urls = tuple(str(u) for u in configured) if isinstance(configured, list) else ()
    try:
        metrics_url(url)
    except SpocError as e:
        raise InputError(str(e)) from None
    limits = parse_sla(sla)
    if rate_spec is not None and users_spec is not None:
        raise InputError("give --users (closed loop) or --rate (open loop), not both")
    trace = selected_trace(
        trace_path,
        speed_spec,
        users_spec,
        rate_spec,
        trace_format,
        trace_filters,
        trace_window,
        trace_max_rows,
        trace_think,
    )
    plan: UserPlan = (
        parse_speed_plan(speed_spec or "auto")
        if trace is not None
        else FixedRates(parse_rates(rate_spec))
        if rate_spec is not None
        else parse_user_plan(users_spec or DEFAULT_USERS)
    )
    prof = load_workload(profile)
    if workers_spec.strip().lower() == "auto":
        workers = auto_workers(plan, os.cpu_count() or 1)
        click.echo(f"spoc ramp: --workers auto: {workers} worker process(es) on {os.cpu_count()} cores", err=True)
    else:
        try:
            workers = int(workers_spec)
        except ValueError:
            raise InputError(f"--workers {workers_spec!r}: give a number of processes or auto") from None
    cfg = RampConfig(
        url=url,
        workload=prof,
        plan=plan,
        max_step_s=max_step_seconds,
        budget_s=parse_budget(budget_spec) if budget_spec is not None else None,
        arrivals=arrivals,
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
        trace=trace,
    )
    cfg.validate()
    if spawn_rate is not None and spawn_rate > 100:
        click.echo("spoc ramp: warning: Locust advises spawn rates of at most 100 users/s", err=True)
    sys.exit(run(cfg))
