"""``spoc sim``: the engine simulator as a server (its options declared once, `sim_options`, for
``spoc demo``'s and the tests' use)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from spoc_tui.cli.options import default_option, twin_option
from spoc_tui.cli.types import FINITE
from spoc_tui.core.errors import InputError
from spoc_tui.core.hardware.presets import GPUS
from spoc_tui.sim.options import SCENARIOS, SimOptions

F = TypeVar("F", bound=Callable[..., Any])


def sim_options(f: F) -> F:
    """The ``vllm serve``-like flags of the simulator (defaults: :class:`SimOptions`)."""
    d = SimOptions
    opts = [
        click.option("--model", "model_opt", help=f"Model preset or path to a config.json (default {d.model})."),
        default_option("--gpu", d.gpu, f"GPU preset: {', '.join(GPUS)}."),
        click.option(
            "--tp", "--tensor-parallel-size", "tp", type=int, help="Tensor-parallel size (thermal scenario: 4)."
        ),
        default_option(
            "--scenario",
            d.scenario,
            "steady | thermal (one hot GPU in the TP group) | overload | imbalanced/fleet (replicas, one lags).",
            type=click.Choice(SCENARIOS),
        ),
        default_option("--seed", d.seed, "Random seed of the simulated engine.", type=int),
        click.option("--served-model-name", help="Name the model is served under [default: the preset's]."),
        default_option("--max-num-seqs", d.max_num_seqs, "Most requests in a batch (vLLM's flag).", type=int),
        click.option("--max-num-batched-tokens", type=int, help="Token budget of a step [default: vLLM's rule]."),
        default_option(
            "--enable-chunked-prefill/--no-enable-chunked-prefill",
            d.enable_chunked_prefill,
            "Split long prefills across steps (vLLM's flag).",
        ),
        default_option(
            "--enable-prefix-caching/--no-enable-prefix-caching",
            d.enable_prefix_caching,
            "Reuse the KV cache of shared prompt prefixes (vLLM's flag).",
        ),
        default_option(
            "--gpu-memory-utilization",
            d.gpu_memory_utilization,
            "Share of GPU memory vLLM may use (weights + KV cache).",
            type=FINITE,
        ),
        default_option("--block-size", d.block_size, "KV-cache block size, tokens.", type=int),
        click.option("--max-model-len", type=int, help="Longest sequence [default: the model's maximum]."),
        default_option("--kv-cache-dtype", d.kv_cache_dtype, "auto | fp8"),
        click.option("--quantization", "-q", help="fp8: FP8 weights."),
        default_option("--speed", d.speed, "Simulated seconds per real second.", type=FINITE),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@click.command(context_settings={"show_default": True})
@click.argument("model", required=False)
@sim_options
@click.option("--host", default=SimOptions.host, help="Address to bind (loopback unless told otherwise).")
@default_option("--port", SimOptions.port, "Port of the OpenAI API and /metrics.", type=int)
@click.option(
    "--dcgm-port",
    type=int,
    default=SimOptions.dcgm_port,
    help="Port of the simulated dcgm-exporter (0: any free port).",
)
@click.option("--load-users", type=int, help="Built-in background users (default none).")
@click.option(
    "--replicas", type=int, help="Replicas, each on --port + i (and --dcgm-port + i) [default: 1; imbalanced/fleet: 3]."
)
@click.option(
    "--api-key",
    envvar="VLLM_API_KEY",
    show_default=False,
    help="As vLLM: /v1 endpoints want this Bearer token (/metrics and /health stay open).",
)
@twin_option(
    "Serve a calibrated twin (spoc twin calibrate): the real server's settings and step time; engine flags "
    "given here are what-ifs on it.",
    "twin",
    type=click.Path(dir_okay=False),
)
@click.option(
    "--truth-log",
    type=click.Path(dir_okay=False),
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
        raise InputError(f"two models given: {model!r} and --model {model_opt!r}")
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
