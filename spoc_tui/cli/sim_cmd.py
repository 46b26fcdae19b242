"""``spoc sim``: the engine simulator as a server (its options declared once, `sim_options`, for
``spoc demo``'s and the tests' use)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from spoc_tui.cli.types import FINITE
from spoc_tui.core.errors import InputError
from spoc_tui.core.hardware.presets import GPUS
from spoc_tui.sim.options import SCENARIOS, SimOptions

F = TypeVar("F", bound=Callable[..., Any])


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


@click.command(context_settings={"show_default": True})
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
