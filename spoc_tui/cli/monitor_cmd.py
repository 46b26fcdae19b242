"""``spoc monitor``: the settings by the one rule (flags, environment, config.toml, defaults),
then the app. Light to import: the app loads when the command runs."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from spoc_tui.cli.options import env_option, file_option, seats_option, sla_option, tls_options
from spoc_tui.cli.types import FINITE
from spoc_tui.config import Settings, config_path, load_file, read_key_file
from spoc_tui.core.errors import InputError

F = TypeVar("F", bound=Callable[..., Any])


@click.command()
@env_option("--url", "SPOC_VLLM_URL", "vLLM server URL (repeat for replicas).", "vllm_urls", multiple=True)
@env_option("--dcgm", "SPOC_DCGM_URL", "dcgm-exporter URL (repeatable).", "dcgm_urls", multiple=True)
@env_option(
    "--prometheus", "SPOC_PROMETHEUS_URL", "Read replicas through this Prometheus server (PromQL).", "prometheus_url"
)
@click.option("--nvml/--no-nvml", default=None, help="Read local GPUs through NVML (default: on when a GPU exists).")
@env_option("--nvml-trace", "SPOC_NVML_TRACE", "Replay a recorded NVML trace (JSONL) as the local GPU.")
@env_option("--tp-groups", "SPOC_TP_GROUPS", "Tensor-parallel groups, e.g. 0-3,4-7.")
@env_option(
    "--interval", "SPOC_INTERVAL", f"Refresh interval in seconds [default: {Settings.interval:g}].", type=FINITE
)
@env_option(
    "--window", "SPOC_WINDOW", f"Percentile/rate window in seconds [default: {Settings.window:g}].", type=FINITE
)
@env_option("--api-key", "SPOC_API_KEY", "Bearer token for the servers (never displayed).")
@file_option("--api-key-file", "api_key_file", "Read the bearer token from this file.")
@env_option(
    "--gpu-cost-per-hour",
    "SPOC_GPU_COST_PER_HOUR",
    "Price of one GPU-hour: shows the cost per million output tokens.",
    type=FINITE,
)
@sla_option("Latency limits to judge against, e.g. ttft_p99<=2s,itl_p99<=100ms: latency cells turn red past them")
@click.option(
    "--headroom/--no-headroom",
    default=None,  # unset: the config file or the default decides
    help="Learn each server's headroom (how much more of its recent traffic it takes within --sla) from "
    "the scrapes, shown under the servers [default: on].",
)
@click.option(
    "--headroom-alert",
    type=FINITE,
    help=f"Alert when a server's headroom is under this multiple [default: {Settings.headroom_alert:g}].",
)
@env_option("--twin", "SPOC_TWIN", "A calibrated twin.json (spoc twin calibrate): the headroom's prior.")
@seats_option(
    "The servers' max-num-seqs (vLLM's flag), which /metrics does not report; without it the "
    "headroom assumes 256 until a queue shows the seats."
)
@click.option(
    "--serve-metrics",
    help="Serve each server's headroom, and the fleet's, as Prometheus metrics at PORT or HOST:PORT "
    "(loopback unless a host is given): spoc_headroom_ratio and its kin, docs/fleet.md.",
)
@env_option(
    "--trace-dir",
    "SPOC_TRACE_DIR",
    "The first server's torch_profiler_dir, to profile a running step from the Load screen (F6).",
)
@file_option(
    "--record",
    "record",
    "Append what the monitor sees to this file (JSON lines, safe on a crash); play it back with spoc replay.",
)
@file_option(
    "--config",
    "config_file",
    "TOML config file [default: <platform config dir>/config.toml].",
    envvar="SPOC_CONFIG",
    show_envvar=True,
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
