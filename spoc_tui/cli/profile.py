"""``spoc profile``: where a vLLM server's step time goes, by kernel class, from a profiler trace."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click

from spoc_tui.cli.options import api_key_options, default_option, json_option
from spoc_tui.cli.types import FINITE
from spoc_tui.core.errors import EXIT_INTERRUPTED, InputError, SpocError
from spoc_tui.core.textsafe import for_terminal


def _say(msg: str) -> None:
    click.echo(msg, err=True)


@click.command("profile")
@click.option("--url", envvar="SPOC_VLLM_URL", show_envvar=True, help="The vLLM server to profile.")
@click.option(
    "--trace-dir",
    type=click.Path(file_okay=False),
    help="The server's torch_profiler_dir (on this host or a shared mount); the newest new trace there is read.",
)
@default_option("--seconds", 10.0, "How long the profiler records.", type=FINITE)
@default_option("--users", 0, "Concurrent users driven while profiling (0: profile the traffic there is).", type=int)
@default_option("--profile", "chatbot", "Load profile of --users.", "load_profile_name")
@default_option("--warmup-seconds", 5.0, "Load before the profiler starts.", type=FINITE)
@click.option("--served-model", help="Served model name for the load [default: the server's first].")
@click.option(
    "--from-trace",
    type=click.Path(dir_okay=False),
    help="Analyse an existing *.pt.trace.json(.gz) instead of profiling a server.",
)
@click.option(
    "--nsys",
    "nsys_report",
    type=click.Path(dir_okay=False),
    help="Analyse an Nsight Systems report (.nsys-rep, needs nsys on PATH) or its kernel-summary CSV.",
)
@click.option("--model", help="Model preset or config.json, for the decode roofline.")
@click.option("--gpu", help="GPU preset (h100-80gb, h200, ...), for the decode roofline.")
@default_option("--tp", 1, "Tensor-parallel size, for the decode roofline.", type=int)
@json_option()
@api_key_options("Bearer token (never printed).")
def profile_cmd(
    from_trace: str | None,
    nsys_report: str | None,
    model: str | None,
    gpu: str | None,
    tp: int,
    as_json: bool,
    **capture: Any,
) -> None:
    """Where the engine's time goes: GEMM, attention, KV-cache writes, communication, sampling,
    norms and element-wise work, copies, other, and idle time between kernels, per prefill and
    decode step, next to the decode roofline.

    Profiles a running server (started with the torch profiler; the error says the flag when it
    was not) for --seconds while driving --users of load, or reads --from-trace / --nsys.
    """
    from spoc_tui.core.hardware.presets import gpu_preset, model_preset
    from spoc_tui.profile.analyze import Breakdown, analyse
    from spoc_tui.profile.nsys import read_nsys
    from spoc_tui.profile.report import decode_roofline, render_text
    from spoc_tui.profile.trace import read_trace

    url = capture["url"]  # with the rest of the capture's options: _capture's parameters
    sources = [x for x in (url if not (from_trace or nsys_report) else None, from_trace, nsys_report) if x]
    if from_trace and nsys_report:
        raise InputError("give --from-trace or --nsys, not both")
    if not sources:
        raise InputError("give --url with --trace-dir to profile a server, or --from-trace FILE, or --nsys FILE")
    if (model is None) != (gpu is None):
        raise InputError("the decode roofline needs both --model and --gpu")
    if not 1 <= tp <= 64:
        raise InputError("--tp must be between 1 and 64")
    roofline = None
    if model is not None and gpu is not None:
        roofline = decode_roofline(model_preset(model), gpu_preset(gpu), tp)
    if from_trace:
        trace: Path = Path(from_trace)
        if not trace.exists():
            raise InputError(f"--from-trace {from_trace}: no such file")
    elif nsys_report:
        pass
    else:
        trace = _capture(**capture)
        _say(f"reading {trace}")
    b: Breakdown = read_nsys(Path(nsys_report)) if nsys_report else analyse(read_trace(trace))
    if roofline is not None:
        b.roofline_step_s, b.roofline_basis = roofline
    click.echo(json.dumps(b.as_dict(), indent=2) if as_json else render_text(b))


def _capture(
    url: str | None,
    trace_dir: str | None,
    seconds: float,
    users: int,
    load_profile_name: str,
    warmup_seconds: float,
    served_model: str | None,
    api_key: str | None,
) -> Path:
    from spoc_tui.collectors.scrape import base_url, metrics_url
    from spoc_tui.profile.capture import CaptureConfig, capture
    from spoc_tui.workload import load_workload

    try:
        metrics_url(url or "")
    except SpocError as e:
        raise InputError(str(e)) from None
    if not trace_dir:
        raise InputError("--trace-dir is needed with --url: the folder the server writes its traces to")
    if not 0 < seconds <= 600 or math.isnan(seconds):
        raise InputError("--seconds must be above 0 and at most 600 (traces grow by megabytes a second)")
    if not 0 <= users <= 4096:
        raise InputError("--users must be between 0 and 4096")
    if not 0 <= warmup_seconds <= 600:
        raise InputError("--warmup-seconds must be between 0 and 600")
    cfg = CaptureConfig(
        url=base_url(url or ""),
        trace_dir=Path(trace_dir),
        seconds=seconds,
        users=users,
        profile=load_workload(load_profile_name) if users else None,
        model=served_model,
        warmup_s=warmup_seconds,
        api_key=api_key,
    )
    try:
        import asyncio

        return asyncio.run(capture(cfg, _say))
    except KeyboardInterrupt:
        _say("interrupted: the profiler was stopped")
        sys.exit(EXIT_INTERRUPTED)
    except SpocError as e:
        _say(f"spoc profile: error: {for_terminal(str(e))}")
        sys.exit(e.exit_code)
