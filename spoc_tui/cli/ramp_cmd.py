"""``spoc ramp``'s command line: its options, checked and made into a :class:`RampConfig`, then
the ramp with its progress lines (:mod:`spoc_tui.cli.ramp`). Light to import: the ramp's
machinery loads when the command runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from spoc_tui.cli.experiment import ExperimentOptions, experiment_options
from spoc_tui.cli.options import (
    api_key_options,
    config_values,
    default_option,
    from_config,
    served_model_option,
    sla_option,
    tls_options,
    twin_option,
)
from spoc_tui.cli.types import FINITE
from spoc_tui.core.errors import InputError, SpocError
from spoc_tui.core.ramp.sla import DEFAULT_SLA, parse_sla
from spoc_tui.load import defaults as ramp_defaults

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from spoc_tui.core.ramp.sla import Limit
    from spoc_tui.core.ramp.steps import StepShadow, StepSummary
    from spoc_tui.core.traces.read import TraceSource
    from spoc_tui.workload import Workload


@click.command("ramp")
@click.option(
    "--url",
    envvar="SPOC_VLLM_URL",
    show_envvar=True,
    help="The server (vLLM or spoc sim) [default: config.toml's first vllm_urls].",
)
@served_model_option
@experiment_options
@default_option(
    "--poll-seconds",
    ramp_defaults.POLL_S,
    "Longest time between two reads of the server's /metrics during a step (each read costs vLLM a few "
    "ms in the process that streams tokens; a short step is read every tenth of it, at most once a second).",
    type=FINITE,
)
@sla_option('Limits, e.g. "ttft_p99<=2s,error_rate<=1%"', DEFAULT_SLA)
@default_option(
    "--abort-factor", ramp_defaults.ABORT_FACTOR, "Stop early when a limit is broken this many times over.", type=FINITE
)
@click.option(
    "--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Folder for ramp.json and requests.jsonl."
)
@default_option(
    "--workers",
    str(ramp_defaults.WORKERS),
    "Local Locust worker processes (0: one process), or auto: one per 64 users, at most one per core but one.",
    "workers_spec",
)
@click.option("--tokenizer", help="Local tokenizer.json (or its folder) for exact prompt lengths.")
@click.option("--dcgm", "dcgm_urls", multiple=True, help="dcgm-exporter URL, recorded next to each step.")
@twin_option(
    "A calibrated twin.json of this server: it predicts each step as it is measured (at the lowest CPU "
    "priority), kept on the step in ramp.json; spoc twin check then reads them."
)
@api_key_options("Bearer token (never written to results).")
@tls_options
def ramp_cmd(
    url: str | None,
    model: str | None,
    exp: ExperimentOptions,
    poll_seconds: float,
    sla: str | None,
    abort_factor: float,
    out_dir: str,
    workers_spec: str,
    tokenizer: str | None,
    dcgm_urls: tuple[str, ...],
    twin_path: str | None,
    api_key: str | None,
) -> None:
    """Step the number of concurrent multi-turn chat users (or, with --rate, the request rate)
    until the latency SLA breaks.

    Exit code 0 when the ramp ran (whatever the verdict), 1 when the server failed, 2 for
    bad arguments. Results are written as steps finish.
    """
    from spoc_tui.cli.ramp import run
    from spoc_tui.collectors.scrape import metrics_url
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
    trace = exp.trace()
    plan = exp.plan(trace)
    prof = load_workload(exp.profile)
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
        **exp.rules().values(),
        limits=limits,
        out_dir=Path(out_dir),
        model=model,
        poll_s=poll_seconds,
        abort_factor=abort_factor,
        workers=workers,
        tokenizer=tokenizer,
        api_key=api_key,
        dcgm_urls=list(dcgm_urls),
        trace=trace,
        shadow=shadow_of(twin_path, prof, limits, trace, exp) if twin_path else None,
    )
    cfg.validate()
    if cfg.spawn_rate is not None and cfg.spawn_rate > 100:
        click.echo("spoc ramp: warning: Locust advises spawn rates of at most 100 users/s", err=True)
    sys.exit(run(cfg))


def shadow_of(
    path: str, prof: Workload, limits: tuple[Limit, ...], trace: TraceSource | None, exp: ExperimentOptions
) -> Callable[[Sequence[StepSummary]], StepShadow | None]:
    """``--twin``'s shadow twin: the twin read (a twin that cannot be read is exit code 2, before
    any load), with the ramp's profile or trace and step rules.

    Raises:
        TwinError: the twin.json or the trace cannot be read.
    """
    from spoc_tui.twin.model import read_twin
    from spoc_tui.twin.predict import read_rows
    from spoc_tui.twin.shadow import ShadowTwin, twin_id
    from spoc_tui.workload import Workload

    twin = read_twin(path)
    rows = read_rows(trace, twin.server.max_model_len) if trace is not None else None
    workload = Workload(name="trace") if trace is not None else prof
    return ShadowTwin(twin, twin_id(twin, path), workload, limits, rows, rules=exp.rules())
