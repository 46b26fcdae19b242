"""``spoc capacity``: KV-cache capacity, the roofline and the queueing view of a model on a GPU."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from spoc_tui.capacity.args import CapacityArgs
from spoc_tui.cli.types import FINITE
from spoc_tui.core.errors import InputError, SpocError
from spoc_tui.core.hardware.presets import GPUS
from spoc_tui.core.ramp.sla import parse_users
from spoc_tui.core.tuning.engineflags import DEFAULTS

F = TypeVar("F", bound=Callable[..., Any])


@click.command()
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
        raise InputError(str(e)) from None
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else report.text())
