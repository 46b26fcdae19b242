"""The ``spoc`` command line: click only. Each command turns its flags into a request object,
calls the service that does the work (the same one the TUI calls) and prints the result.

Errors: every error a service raises is a :class:`~spoc_tui.core.errors.SpocError` with its exit
code; :func:`main` prints it as one line (``spoc: error: ...``) and exits with that code, so no
command needs its own handling for errors it does not word itself.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click

from spoc_tui import __version__
from spoc_tui.capacity.args import CapacityArgs
from spoc_tui.cli.options import api_key_options, from_config, served_model_option, tls_options
from spoc_tui.cli.types import FINITE, trace_selection
from spoc_tui.config import Settings, config_path, data_dir, load_file, read_key_file
from spoc_tui.core.engineflags import DEFAULTS
from spoc_tui.core.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, InputError, SpocError
from spoc_tui.core.presets import GPUS
from spoc_tui.core.redact import RedactingFormatter
from spoc_tui.core.sla import parse_users
from spoc_tui.core.textsafe import for_terminal
from spoc_tui.load.defaults import DEFAULT_PROFILE
from spoc_tui.sim.options import SCENARIOS, SimOptions
from spoc_tui.tune.args import TuneArgs

# The heavy modules (the ramp's machinery, Optuna, numpy, httpx) are imported by the commands
# that use them, not here: `spoc --help` and a bad flag answer at once (issue 35).

F = TypeVar("F", bound=Callable[..., Any])
"""Local Locust worker processes: each takes a core; more than this is a typo."""


def _fail(msg: str) -> NoReturn:
    """Bad input: one line on stderr, exit code 2."""
    raise InputError(msg)


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="spoc")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """spoc-tui: what limits your vLLM server, live, over SSH.

    Without a command, opens the monitor (same as `spoc monitor`).
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(monitor)


# ---------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------


def sim_options(f: F) -> F:
    """The ``vllm serve``-like flags of the simulator (defaults: :class:`SimOptions`)."""
    d = SimOptions
    opts = [
        click.option(
            "--model", "model_opt", default=None, help=f"Model preset or path to a config.json (default {d.model})."
        ),
        click.option(
            "--gpu",
            default=d.gpu,
            show_default=True,
            help=f"GPU preset: {', '.join(GPUS)}.",
        ),
        click.option(
            "--tp",
            "--tensor-parallel-size",
            "tp",
            type=int,
            default=None,
            help="Tensor-parallel size (thermal scenario: 4).",
        ),
        click.option(
            "--scenario",
            type=click.Choice(SCENARIOS),
            default=d.scenario,
            show_default=True,
            help="steady | thermal (one hot GPU in the TP group) | overload | imbalanced/fleet (replicas, one lags).",
        ),
        click.option(
            "--seed", type=int, default=d.seed, show_default=True, help="Random seed of the simulated engine."
        ),
        click.option(
            "--served-model-name", default=None, help="Name the model is served under [default: the preset's]."
        ),
        click.option(
            "--max-num-seqs",
            type=int,
            default=d.max_num_seqs,
            show_default=True,
            help="Most requests in a batch (vLLM's flag).",
        ),
        click.option(
            "--max-num-batched-tokens", type=int, default=None, help="Token budget of a step [default: vLLM's rule]."
        ),
        click.option(
            "--enable-chunked-prefill/--no-enable-chunked-prefill",
            default=d.enable_chunked_prefill,
            show_default=True,
            help="Split long prefills across steps (vLLM's flag).",
        ),
        click.option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            default=d.enable_prefix_caching,
            show_default=True,
            help="Reuse the KV cache of shared prompt prefixes (vLLM's flag).",
        ),
        click.option(
            "--gpu-memory-utilization",
            type=FINITE,
            default=d.gpu_memory_utilization,
            show_default=True,
            help="Share of GPU memory vLLM may use (weights + KV cache).",
        ),
        click.option(
            "--block-size", type=int, default=d.block_size, show_default=True, help="KV-cache block size, tokens."
        ),
        click.option(
            "--max-model-len", type=int, default=None, help="Longest sequence [default: the model's maximum]."
        ),
        click.option("--kv-cache-dtype", default=d.kv_cache_dtype, show_default=True, help="auto | fp8"),
        click.option("--quantization", "-q", default=None, help="fp8: FP8 weights."),
        click.option(
            "--speed", type=FINITE, default=d.speed, show_default=True, help="Simulated seconds per real second."
        ),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@cli.command(context_settings={"show_default": True})
@click.argument("model", required=False)
@sim_options
@click.option("--host", default=SimOptions.host, help="Address to bind (loopback unless told otherwise).")
@click.option(
    "--port", type=int, default=SimOptions.port, show_default=True, help="Port of the OpenAI API and /metrics."
)
@click.option(
    "--dcgm-port",
    type=int,
    default=SimOptions.dcgm_port,
    help="Port of the simulated dcgm-exporter (0: any free port).",
)
@click.option("--load-users", type=int, default=None, help="Built-in background users (default none).")
@click.option(
    "--replicas",
    type=int,
    default=None,
    help="Replicas, each on --port + i (and --dcgm-port + i) [default: 1; imbalanced/fleet: 3].",
)
@click.option(
    "--api-key",
    envvar="VLLM_API_KEY",
    default=None,
    show_default=False,
    help="As vLLM: /v1 endpoints want this Bearer token (/metrics and /health stay open).",
)
@click.option(
    "--twin",
    type=click.Path(dir_okay=False),
    default=None,
    help="Serve a calibrated twin (spoc twin calibrate): the real server's settings and step time; engine flags "
    "given here are what-ifs on it.",
)
@click.option(
    "--truth-log",
    type=click.Path(dir_okay=False),
    default=None,
    help="Append each request's server-side token times (JSON lines), for measurement checks.",
)
def sim(model: str | None, model_opt: str | None, host: str, **kw: Any) -> None:
    """Run the engine simulator in the foreground: a SIMULATED vLLM server and dcgm-exporter.

    Accepts a `vllm serve`-like command line (`spoc sim MODEL --max-num-seqs 64 ...`), so the
    tuner can launch it exactly as it launches vLLM.
    """
    from spoc_tui.sim import run as simrun

    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"spoc sim: warning: binding to {host}, not loopback", err=True)
    if model and model_opt and model != model_opt:
        _fail(f"two models given: {model!r} and --model {model_opt!r}")
    ctx = click.get_current_context()
    given = tuple(
        k
        for k in kw
        if ctx.get_parameter_source(k)
        in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    )
    opts = SimOptions(model=model or model_opt or SimOptions.model, host=host, given=given, **kw)
    if opts.twin is not None:  # the twin's engine, composed here: the simulator knows no twin
        from spoc_tui.twin.serve import twin_engine

        sys.exit(simrun.main(opts, twin_engine))
    sys.exit(simrun.main(opts))


@cli.command()
@click.option(
    "--scenario",
    type=click.Choice(SCENARIOS),
    default=SimOptions.scenario,
    show_default=True,
    help="fleet: three replicas behind a round-robin split, one of them lagging.",
)
@click.option("--model", default=SimOptions.model, show_default=True, help="Model preset of the simulated server.")
@click.option("--gpu", default=SimOptions.gpu, show_default=True, help=f"GPU preset: {', '.join(GPUS)}.")
@click.option("--tp", type=int, default=None, help="Tensor-parallel size [default: 1; thermal: 4].")
@click.option("--users", type=int, default=None, help="Background users (default: 48, overload: 3x max-num-seqs).")
@click.option("--seed", type=int, default=SimOptions.seed, show_default=True, help="Random seed of the simulator.")
def demo(scenario: str, model: str, gpu: str, tp: int | None, users: int | None, seed: int) -> None:
    """Start the simulator with a background load and open the monitor on it.

    Everything runs on loopback and is stopped when the monitor exits (Ctrl-C included).
    """
    from spoc_tui.cli.demo import run_demo

    sys.exit(run_demo(scenario=scenario, model=model, gpu=gpu, tp=tp, users=users, seed=seed))


# ---------------------------------------------------------------------------------------


@cli.command()
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
@click.option(
    "--sla",
    envvar="SPOC_SLA",
    show_envvar=True,
    default=None,
    help="Latency limits to judge against, e.g. ttft_p99<=2s,itl_p99<=100ms: latency cells turn red past them.",
)
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
        _fail(f"config file {path} does not exist")
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


@cli.command()
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
@click.option(
    "--sla",
    envvar="SPOC_SLA",
    show_envvar=True,
    default=None,
    help='Limits (Optuna constraints), e.g. "ttft_p99<=2s,itl_p99<=100ms" [default: config.toml\'s sla].',
)
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
    "--trace",
    default=None,
    type=click.Path(dir_okay=False),
    help="Score flags on this traffic trace instead of a profile: each trial replays it once at --speed.",
)
@click.option(
    "--speed", type=FINITE, default=TuneArgs.speed, show_default=True, help="With --trace: the speed multiple."
)
@trace_selection(filters=False)
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
@click.option(
    "--twin",
    "twin_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Search on this calibrated twin (spoc twin calibrate) in virtual time, seconds a trial, then run the best "
    "--confirm configurations on the server (--launch) and report predicted beside measured.",
)
@click.option(
    "--confirm",
    type=click.IntRange(1, 20),
    default=2,
    show_default=True,
    help="With --twin: how many of the twin's best configurations run on the real server.",
)
@api_key_options("Bearer token for the server (never written to results).")
@tls_options
def tune(twin_path: str | None, confirm: int, **kw: Any) -> None:
    """Search server flags with NSGA-II: each trial starts the server, runs a ramp, scores it.

    Prints a line per trial, appends OUT/trials.jsonl as trials finish and keeps
    OUT/pareto.json (the Pareto-optimal flags, their objectives and the hypervolume) current.
    Ctrl-C stops the running server and keeps every finished trial; --resume continues.
    """
    from spoc_tui.cli.tune import run, run_with_twin

    kw["sla"] = from_config(kw.get("sla"), "sla", "--sla")
    if twin_path is not None:
        sys.exit(run_with_twin(TuneArgs(**kw), twin_path, confirm))
    sys.exit(run(TuneArgs(**kw)))


@cli.command("load-worker")
@click.option("--master", required=True, help="Host of the machine running `spoc ramp --workers N`.")
@click.option("--master-port", type=int, default=5557, show_default=True, help="The master's Locust port.")
@click.option("--url", required=True, help="The server under test (as the master has it).")
@click.option("--model", required=True, help="Served model name (as the master has it).")
@click.option("--profile", default=DEFAULT_PROFILE, show_default=True, help="The master's load profile.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of this worker's users.")
@tls_options
def load_worker(master: str, master_port: int, url: str, model: str, profile: str, seed: int) -> None:
    """Join a ramp from another machine as a Locust worker (Locust's master/worker protocol)."""
    from spoc_tui.load.ramp import runner_argv, runner_env
    from spoc_tui.workload import load_workload

    prof = load_workload(profile)
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(prof.as_dict(), f)
    argv = runner_argv(
        url, model, Path(f.name), seed, "--worker", "--master-host", master, "--master-port", str(master_port)
    )
    sys.exit(subprocess.call(argv, env=runner_env(url)))


@cli.command()
@click.option("--model", required=True, help="Model preset or path to a config.json (or its folder).")
@click.option("--gpu", default=None, help=f"GPU preset: {', '.join(GPUS)}.")
@click.option("--gpu-memory-gib", type=FINITE, default=None, help="Memory of a GPU not in the presets.")
@click.option("--tp", type=int, default=CapacityArgs.tp, show_default=True, help="Tensor-parallel size.")
@click.option("--max-model-len", type=int, default=None, help="Longest sequence [default: the model's maximum].")
@click.option(
    "--avg-context", type=int, default=None, help="Typical tokens in flight per request [default: max-model-len]."
)
@click.option("--weights-dtype", default=None, help="bf16 | fp8 | int4 [default: the model's].")
@click.option("--kv-cache-dtype", default=CapacityArgs.kv_cache_dtype, show_default=True, help="auto | fp8")
@click.option(
    "--gpu-memory-utilization",
    type=FINITE,
    default=CapacityArgs.gpu_memory_utilization,
    show_default=True,
    help="Share of GPU memory vLLM may use.",
)
@click.option("--block-size", type=int, default=CapacityArgs.block_size, show_default=True, help="KV-cache block size.")
@click.option(
    "--kv-cache-gib", type=FINITE, default=None, help="KV space given directly (CPU servers: VLLM_CPU_KVCACHE_SPACE)."
)
@click.option(
    "--reserve-gib",
    type=FINITE,
    default=None,
    help="Runtime reserve per GPU for activations and CUDA graphs [default: 1.5].",
)
@click.option(
    "--server", default=None, help="A running vLLM server: compare the prediction with its own cache_config_info."
)
@click.option("--queue", "queue_users", default=None, help="Queueing view for these user counts, e.g. 1,8,32,64,128.")
@click.option("--service-time", type=FINITE, default=None, help="Seconds per request at light load (queueing view).")
@click.option("--think-time", type=FINITE, default=None, help="Seconds a user waits between requests (queueing view).")
@click.option(
    "--max-num-seqs",
    type=int,
    default=DEFAULTS.max_num_seqs,
    show_default=True,
    help="The server's seat limit (queueing view).",
)
@click.option(
    "--ramp",
    "ramp_path",
    default=None,
    help="A ramp result (folder or ramp.json): estimates service/think time and shows the measured curve.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def capacity(
    server: str | None,
    as_json: bool,
    queue_users: str | None,
    service_time: float | None,
    think_time: float | None,
    max_num_seqs: int,
    ramp_path: str | None,
    **kw: Any,
) -> None:
    """How much KV cache fits and how many sequences it holds, from the model's real shape.

    With --queue (or --ramp), also the queueing view: utilisation and expected wait as users
    grow, next to the ramp's measured curve when one is given.
    """
    from spoc_tui.capacity.service import CapacityRequest, capacity_report

    req = CapacityRequest(
        CapacityArgs(**kw),
        server=server,
        queue_users=parse_users(queue_users) if queue_users else [],
        service_s=service_time,
        think_s=think_time,
        max_num_seqs=max_num_seqs,
        ramp=ramp_path,
    )
    try:
        report = capacity_report(req)
    except SpocError as e:  # an unreachable --server is bad input here
        _fail(str(e))
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else report.text())


@cli.command()
@click.argument("what", type=click.Choice(["config", "data"]))
def locate(what: str) -> None:
    """Print where spoc-tui keeps its config file or its data."""
    click.echo(str(config_path() if what == "config" else data_dir()))


def _register() -> None:
    from spoc_tui.cli.compare import compare_cmd
    from spoc_tui.cli.inspect import inspect_cmd
    from spoc_tui.cli.plan import plan_cmd
    from spoc_tui.cli.profile import profile_cmd
    from spoc_tui.cli.ramp_cmd import ramp_cmd
    from spoc_tui.cli.replay import replay_cmd
    from spoc_tui.cli.report import report_cmd
    from spoc_tui.cli.trace import trace_cmd
    from spoc_tui.cli.twin import twin_cmd

    cli.add_command(inspect_cmd)
    cli.add_command(ramp_cmd)
    cli.add_command(report_cmd)
    cli.add_command(profile_cmd)
    cli.add_command(trace_cmd)
    cli.add_command(plan_cmd)
    cli.add_command(replay_cmd)
    cli.add_command(compare_cmd)
    cli.add_command(twin_cmd)


_register()

LOG_LEVEL_ENV = "SPOC_LOG_LEVEL"


class _LogFile(logging.FileHandler):
    """A log file whose folder (and the file) is made only when a first record is written."""

    def _open(self) -> Any:
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def configure_logging() -> None:
    """Each module logs to its own logger (``spoc_tui.<module>``); here they go to one file in the
    data folder, never to the terminal the TUI draws on. WARNING and above by default
    (``SPOC_LOG_LEVEL=DEBUG`` for more); the file is only created once something is logged."""
    level = os.environ.get(LOG_LEVEL_ENV, "WARNING").upper()
    handler = _LogFile(data_dir() / "spoc.log", delay=True)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("spoc_tui")
    root.addHandler(handler)
    root.setLevel(level if level in logging.getLevelNamesMapping() else logging.WARNING)
    root.propagate = False


def main() -> None:
    """The ``spoc`` entry point: a :class:`SpocError` is one line on stderr and its exit code."""
    configure_logging()
    try:
        rc = cli(standalone_mode=False)
    except SpocError as e:
        click.echo(f"spoc: error: {for_terminal(str(e))}", err=True)
        if e.hint:
            click.echo(for_terminal(e.hint), err=True)
        sys.exit(e.exit_code)
    except click.UsageError as e:  # a bad flag or value: the same one-line prefix as every other error
        cmd = e.ctx.command_path if e.ctx is not None else "spoc"
        click.echo(f"spoc: error: {for_terminal(e.format_message())} (see {cmd} --help)", err=True)
        sys.exit(EXIT_USAGE)
    except click.ClickException as e:
        click.echo(f"spoc: error: {for_terminal(e.format_message())}", err=True)
        sys.exit(e.exit_code)
    except (KeyboardInterrupt, click.Abort):
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(rc if isinstance(rc, int) else EXIT_OK)
