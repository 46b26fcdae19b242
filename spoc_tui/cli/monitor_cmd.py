"""``spoc monitor``: the settings by the one rule (flags, environment, config.toml, defaults),
then the app. Light to import: the app loads when the command runs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from spoc_tui.cli.options import sla_option, tls_options
from spoc_tui.cli.types import FINITE
from spoc_tui.config import Settings, config_path, load_file, read_key_file
from spoc_tui.core.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])


@click.command()
@click.option(
    "--url",
    "vllm_urls",
    multiple=True,
    envvar="SPOC_VLLM_URL",
    show_envvar=True,
    help="vLLM server URL (repeat for replicas).",
)
@click.option(
    "--dcgm",
    "dcgm_urls",
    multiple=True,
    envvar="SPOC_DCGM_URL",
    show_envvar=True,
    help="dcgm-exporter URL (repeatable).",
)
@click.option(
    "--prometheus",
    "prometheus_url",
    envvar="SPOC_PROMETHEUS_URL",
    show_envvar=True,
    default=None,
    help="Read replicas through this Prometheus server (PromQL).",
)
@click.option("--nvml/--no-nvml", default=None, help="Read local GPUs through NVML (default: on when a GPU exists).")
@click.option(
    "--nvml-trace",
    envvar="SPOC_NVML_TRACE",
    show_envvar=True,
    default=None,
    help="Replay a recorded NVML trace (JSONL) as the local GPU.",
)
@click.option(
    "--tp-groups", envvar="SPOC_TP_GROUPS", show_envvar=True, default=None, help="Tensor-parallel groups, e.g. 0-3,4-7."
)
@click.option(
    "--interval",
    type=FINITE,
    envvar="SPOC_INTERVAL",
    show_envvar=True,
    default=None,
    help=f"Refresh interval in seconds [default: {Settings.interval:g}].",
)
@click.option(
    "--window",
    type=FINITE,
    envvar="SPOC_WINDOW",
    show_envvar=True,
    default=None,
    help=f"Percentile/rate window in seconds [default: {Settings.window:g}].",
)
@click.option(
    "--api-key",
    envvar="SPOC_API_KEY",
    show_envvar=True,
    default=None,
    help="Bearer token for the servers (never displayed).",
)
@click.option(
    "--api-key-file", type=click.Path(dir_okay=False), default=None, help="Read the bearer token from this file."
)
@click.option(
    "--gpu-cost-per-hour",
    type=FINITE,
    envvar="SPOC_GPU_COST_PER_HOUR",
    show_envvar=True,
    default=None,
    help="Price of one GPU-hour: shows the cost per million output tokens.",
)
@sla_option("Latency limits to judge against, e.g. ttft_p99<=2s,itl_p99<=100ms: latency cells turn red past them")
@click.option(
    "--headroom/--no-headroom",
    default=None,
    help="Learn each server's headroom (how much more of its recent traffic it takes within --sla) from "
    "the scrapes, shown under the servers [default: on].",
)
@click.option(
    "--headroom-alert",
    type=FINITE,
    default=None,
    help=f"Alert when a server's headroom is under this multiple [default: {Settings.headroom_alert:g}].",
)
@click.option(
    "--twin",
    envvar="SPOC_TWIN",
    show_envvar=True,
    default=None,
    help="A calibrated twin.json (spoc twin calibrate): the headroom's prior.",
)
@click.option(
    "--max-num-seqs",
    type=int,
    default=None,
    help="The servers' max-num-seqs (vLLM's flag), which /metrics does not report; without it the "
    "headroom assumes 256 until a queue shows the seats.",
)
@click.option(
    "--serve-metrics",
    default=None,
    help="Serve each server's headroom, and the fleet's, as Prometheus metrics at PORT or HOST:PORT "
    "(loopback unless a host is given): spoc_headroom_ratio and its kin, docs/fleet.md.",
)
@click.option(
    "--trace-dir",
    envvar="SPOC_TRACE_DIR",
    show_envvar=True,
    default=None,
    help="The first server's torch_profiler_dir, to profile a running step from the Load screen (F6).",
)
@click.option(
    "--record",
    type=click.Path(dir_okay=False),
    default=None,
    help="Append what the monitor sees to this file (JSON lines, safe on a crash); play it back with spoc replay.",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    envvar="SPOC_CONFIG",
    show_envvar=True,
    default=None,
    help="TOML config file [default: <platform config dir>/config.toml].",
)
@tls_options
@click.pass_context
def monitor(
    ctx: click.Context, /, config_file: str | None, api_key_file: str | None, record: str | None, **flags: Any
) -> None:
    """Watch vLLM servers and their GPUs live."""
    settings = resolve_settings(ctx, config_file, api_key_file, flags)
    from spoc_tui.tui.app import run_monitor

    sys.exit(run_monitor(settings, record=record))


def resolve_settings(
    ctx: click.Context, config_file: str | None, api_key_file: str | None, flags: dict[str, Any]
) -> Settings:
    """Defaults < TOML file < environment < command line (only flags the user gave).

    Raises:
        ConfigError: a bad file or setting (exit code 2).
    """
    path = Path(config_file) if config_file else config_path()
    if config_file and not path.exists():
        raise InputError(f"config file {path} does not exist")
    values = load_file(path)
    for name, value in flags.items():
        if ctx.get_parameter_source(name) is None or value in (None, ()):
            continue
        values[name] = list(value) if isinstance(value, tuple) else value
    if api_key_file:
        values["api_key"] = read_key_file(api_key_file, f"--api-key-file {api_key_file}")
    settings = Settings(**values)  # type: ignore[arg-type]  # load_file checked each value's type against its field
    settings.validate()
    from spoc_tui.collectors.http import check_credentials

    check_credentials([*settings.vllm_urls, *settings.dcgm_urls], settings.api_key)
    return settings
