"""``spoc capacity``: KV-cache capacity, the roofline and the queueing view of a model on a GPU."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from spoc_tui.capacity.args import CapacityArgs
from spoc_tui.cli.options import default_option, json_option
from spoc_tui.cli.types import FINITE
from spoc_tui.core.errors import InputError, SpocError
from spoc_tui.core.hardware.presets import GPUS
from spoc_tui.core.ramp.sla import parse_users
from spoc_tui.core.tuning.engineflags import DEFAULTS

F = TypeVar("F", bound=Callable[..., Any])


@click.command()
@click.option("--model", required=True, help="Model preset or path to a config.json (or its folder).")
@click.option("--gpu", help=f"GPU preset: {', '.join(GPUS)}.")
@click.option("--gpu-memory-gib", type=FINITE, help="Memory of a GPU not in the presets.")
@default_option("--tp", CapacityArgs.tp, "Tensor-parallel size.", type=int)
@click.option("--max-model-len", type=int, help="Longest sequence [default: the model's maximum].")
@click.option("--avg-context", type=int, help="Typical tokens in flight per request [default: max-model-len].")
@click.option("--weights-dtype", help="bf16 | fp8 | int4 [default: the model's].")
@default_option("--kv-cache-dtype", CapacityArgs.kv_cache_dtype, "auto | fp8")
@default_option(
    "--gpu-memory-utilization", CapacityArgs.gpu_memory_utilization, "Share of GPU memory vLLM may use.", type=FINITE
)
@default_option("--block-size", CapacityArgs.block_size, "KV-cache block size.", type=int)
@click.option("--kv-cache-gib", type=FINITE, help="KV space given directly (CPU servers: VLLM_CPU_KVCACHE_SPACE).")
@click.option(
    "--reserve-gib", type=FINITE, help="Runtime reserve per GPU for activations and CUDA graphs [default: 1.5]."
)
@click.option("--server", help="A running vLLM server: compare the prediction with its own cache_config_info.")
@click.option("--queue", "queue_users", help="Queueing view for these user counts, e.g. 1,8,32,64,128.")
@click.option("--service-time", type=FINITE, help="Seconds per request at light load (queueing view).")
@click.option("--think-time", type=FINITE, help="Seconds a user waits between requests (queueing view).")
@default_option("--max-num-seqs", DEFAULTS.max_num_seqs, "The server's seat limit (queueing view).", type=int)
@click.option(
    "--ramp",
    "ramp_path",
    help="A ramp result (folder or ramp.json): estimates service/think time and shows the measured curve.",
)
@json_option()
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
        raise InputError(str(e)) from None
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else report.text())
