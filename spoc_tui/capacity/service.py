"""Capacity: KV-cache arithmetic before measuring, predicted against a server's own figures, and
the queueing view. ``spoc capacity`` and the Capacity screen both call :func:`capacity_report`
(or :func:`compute` and :func:`render` for a screen that recomputes as it is edited)."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from spoc_tui.capacity.args import CapacityArgs
from spoc_tui.collectors.http import new_client
from spoc_tui.collectors.scrape import DEFAULT_TIMEOUT, SourceError, fetch
from spoc_tui.core import fmt
from spoc_tui.core.hardware.capacity import CapacityError, CapacityPlan, dtype_bytes, plan
from spoc_tui.core.hardware.presets import (
    GIB,
    GPUS,
    GpuSpec,
    ModelSpec,
    PresetError,
    custom_gpu,
    gpu_preset,
    model_preset,
)
from spoc_tui.core.hardware.queueing import queue_curve, saturation_users
from spoc_tui.core.metrics.vllm import cache_config
from spoc_tui.core.ramp.steps import StepSummary
from spoc_tui.core.results import RampDoc, read_ramp
from spoc_tui.core.tuning.engineflags import DEFAULTS


def resolve(args: CapacityArgs) -> tuple[ModelSpec, GpuSpec]:
    """Raises: PresetError, CapacityError with a message naming the problem."""
    model = model_preset(args.model)
    if args.gpu and args.gpu_memory_gib is not None:
        raise PresetError("give --gpu or --gpu-memory-gib, not both")
    if args.gpu_memory_gib is not None:
        gpu = custom_gpu(args.gpu_memory_gib)
    elif args.gpu:
        gpu = gpu_preset(args.gpu)
    elif args.kv_cache_gib is not None:
        gpu = custom_gpu(1024)  # unused: the KV space is given
    else:
        raise PresetError("give --gpu PRESET or --gpu-memory-gib X (or --kv-cache-gib for a CPU server)")
    for dt in (args.weights_dtype, args.kv_cache_dtype):
        if dt is not None:
            dtype_bytes(dt)
    return model, gpu


_PLAN_ARGS = (
    "tp",
    "gpu_memory_utilization",
    "max_model_len",
    "avg_context",
    "weights_dtype",
    "kv_cache_dtype",
    "block_size",
)
"""The options :func:`~spoc_tui.core.hardware.capacity.plan` takes under the same names."""


def compute(args: CapacityArgs, model: ModelSpec, gpu: GpuSpec, **override: object) -> CapacityPlan:
    kw: dict[str, object] = {name: getattr(args, name) for name in _PLAN_ARGS}
    kw["kv_cache_bytes_override"] = args.kv_cache_gib * GIB if args.kv_cache_gib is not None else None
    if args.reserve_gib is not None:
        kw["reserve_bytes"] = args.reserve_gib * GIB
    kw.update(override)
    return plan(model, gpu, **kw)  # type: ignore[arg-type]  # each value has its parameter's type; **kw mixes them


def rule_of_thumb_note(model: ModelSpec) -> str | None:
    if model.num_kv_heads == model.num_heads:
        return None
    ratio = model.num_heads / model.num_kv_heads
    return (
        f"Grouped-query attention: {model.num_kv_heads} KV heads, not {model.num_heads}. Sizing the cache with "
        f"all attention heads (a common rule of thumb) overstates KV bytes per token {ratio:.0f}x."
    )


def alternatives(args: CapacityArgs, model: ModelSpec, gpu: GpuSpec) -> list[tuple[str, CapacityPlan | str]]:
    out: list[tuple[str, CapacityPlan | str]] = []
    options: list[tuple[str, dict[str, object], GpuSpec]] = []
    if args.kv_cache_dtype != "fp8":
        options.append(("fp8 KV cache", {"kv_cache_dtype": "fp8"}, gpu))
    if args.kv_cache_gib is None:
        if model.num_heads % (args.tp * 2) == 0:
            options.append((f"TP {args.tp * 2}", {"tp": args.tp * 2}, gpu))
        if gpu.next_up and gpu.next_up in GPUS:
            nxt = GPUS[gpu.next_up]
            options.append((f"on {nxt.name}", {}, nxt))
    for label, over, g in options:
        try:
            out.append((label, compute(args, model, g, **over)))
        except CapacityError as e:
            out.append((label, str(e)))
    return out


def render(
    args: CapacityArgs, model: ModelSpec, gpu: GpuSpec, p: CapacityPlan, actual: dict[str, str] | None = None
) -> str:
    lines = []
    where = f"{args.tp}x {gpu.label}" if args.kv_cache_gib is None else f"{args.kv_cache_gib:g} GiB KV space"
    lines.append(
        f"{model.name}: {model.num_layers} layers, {model.num_heads} heads / {model.num_kv_heads} KV heads x "
        f"{model.head_dim}, "
        f"{model.total_params / 1e9:.2f} B params"
        + (f" ({model.active_params / 1e9:.1f} B active)" if model.num_experts else "")
        + f"  on {where}"
    )
    rows = [
        (
            "weights (whole model)",
            fmt.count(p.weights_bytes) + "B" if p.weights_bytes < 1e9 else f"{p.weights_bytes / GIB:.2f} GiB",
        ),
        ("weights per GPU", f"{p.weights_bytes_per_gpu / GIB:.2f} GiB"),
        ("KV bytes per token", f"{p.kv_bytes_per_token / 1024:.1f} KiB"),
        (
            "KV bytes per request",
            f"{p.kv_bytes_per_request / 2**20:.1f} MiB (context "
            f"{args.avg_context or args.max_model_len or model.max_position})",
        ),
        ("KV cache", f"{p.kv_cache_bytes / GIB:.2f} GiB = {p.num_blocks} blocks x {p.block_size} tokens"),
        ("KV cache tokens", f"{p.kv_cache_tokens:,}"),
        ("concurrent sequences", f"{p.max_concurrent_sequences:,}"),
    ]
    width = max(len(r[0]) for r in rows)
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    alts = alternatives(args, model, gpu)
    if alts:
        lines.append("  what if:")
        for label, res in alts:
            if isinstance(res, str):
                lines.append(f"    {label:<18} does not fit: {res}")
            else:
                lines.append(
                    f"    {label:<18} {res.kv_cache_tokens:>12,} KV tokens  {res.max_concurrent_sequences:>8,} "
                    f"sequences"
                )
    if actual:
        lines.append("  predicted vs the server's own cache_config_info:")
        for key, mine in (
            ("kv_cache_size_tokens", p.kv_cache_tokens),
            ("num_gpu_blocks", p.num_blocks),
            ("block_size", p.block_size),
        ):
            theirs = actual.get(key)
            if theirs is None or theirs == "None":
                continue
            diff = ""
            try:
                t = float(theirs)
                diff = f"  ({(mine - t) / t * 100:+.1f}%)" if t else ""
            except ValueError:
                pass
            lines.append(f"    {key:<22} predicted {mine:>12,}   server {theirs:>12}{diff}")
    note = rule_of_thumb_note(model)
    for n in ([note] if note else []) + list(p.notes):
        lines.append(f"  note: {n}")
    return "\n".join(lines)


def as_json(p: CapacityPlan, actual: dict[str, str] | None) -> str:
    d = p.as_dict()
    if actual:
        d["server_cache_config"] = actual
    return json.dumps(d, indent=2)


def server_cache_config(url: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` from a running server.

    Raises:
        PresetError: unreachable server or no cache_config_info.
    """

    async def go() -> dict[str, str]:
        async with new_client(DEFAULT_TIMEOUT) as c:
            r = await fetch(c, url)
        return cache_config(r.exposition)

    try:
        cfg = asyncio.run(go())
    except SourceError as e:
        raise PresetError(str(e)) from None
    if not cfg:
        raise PresetError(f"{url}: the server reports no vllm:cache_config_info")
    return cfg


def args_from_server(args: CapacityArgs, cfg: dict[str, str]) -> CapacityArgs:
    """Take block size, KV dtype and, for CPU servers, the KV space from the server."""
    out = replace(args)
    if cfg.get("block_size", "None").isdigit():
        out.block_size = int(cfg["block_size"])
    if cfg.get("cache_dtype") not in (None, "None", "auto") and "fp8" in cfg["cache_dtype"]:
        out.kv_cache_dtype = "fp8"
    return out


# ---------------------------------------------------------------------------------------
# Answering in users (the Capacity screen)

TYPICAL_CONTEXT = 2048
"""Average context of a typical chat conversation, for sizing the cache when nothing is typed:
the chatbot profile (400 system tokens, 4-14 turns of ~50 user and ~215 answer tokens) averages
about 1.6k tokens of context over a conversation's life and 2.8k at its last turn. The model's
maximum length (128k for Llama 3.1) would read as "3 sequences" for an 8B on an H100."""
TYPICAL_OUTPUT_TOKENS = 215
"""Mean answer length of the chatbot profile (lognormal, median 180, sigma 0.6)."""
TYPICAL_THINK_S = 9.0
"""Mean think time of the chatbot profile (uniform 3-15 s)."""
DEFAULT_MAX_NUM_SEQS = DEFAULTS.max_num_seqs
"""vLLM's default --max-num-seqs: the batch never holds more, whatever the cache could."""


@dataclass(frozen=True)
class UsersEstimate:
    seats: int
    service_s: float
    think_s: float
    basis: str
    saturation: float
    rows: list[tuple[int, float, float]]
    """(users, utilisation, expected wait s; inf when saturated)."""


def users_estimate(
    model: ModelSpec, gpu: GpuSpec, p: CapacityPlan, tp: int, ramp: RampDoc | None = None
) -> UsersEstimate:
    """How many chat users the configuration holds, as operators ask.

    Seats: the batch, ``min(concurrent sequences, max-num-seqs 256)``. Service time: from the
    ramp when one of this model is given (its lightest step's E2E mean, think time from its
    request rate), else from the model and GPU: a typical answer's tokens times a decode step
    that reads each GPU's weights and the batch's KV cache once at peak HBM bandwidth (the
    fastest it can be: real steps add launch and attention overhead). Then an M/M/c view.
    """
    seats = max(1, min(p.max_concurrent_sequences, DEFAULT_MAX_NUM_SEQS))
    est = estimate_from_ramp(ramp) if ramp else None
    if est is not None:
        service, think = est
        basis = f"service {fmt.seconds(service)} and think {think:.1f} s measured by the last ramp"
    else:
        step = (p.weights_bytes_per_gpu + seats * p.kv_bytes_per_request / max(1, tp)) / gpu.mem_bw_bytes_s
        service, think = TYPICAL_OUTPUT_TOKENS * step, TYPICAL_THINK_S
        basis = (
            f"service {fmt.seconds(service)} = {TYPICAL_OUTPUT_TOKENS} answer tokens x {step * 1e3:.1f} ms "
            f"decode steps (weights + KV of {seats} running read at peak HBM bandwidth: a lower bound), "
            f"think {think:g} s (the chatbot profile); run a ramp to measure them"
        )
    sat = saturation_users(seats, service, think)
    users = sorted({max(1, round(sat * f)) for f in (0.5, 0.8, 0.95, 1.2)})
    rows = [(pt.users, pt.utilisation, pt.expected_wait_s) for pt in queue_curve(users, seats, service, think)]
    return UsersEstimate(seats, service, think, basis, sat, rows)


def fits_instead(args: CapacityArgs, model: ModelSpec, gpu: GpuSpec) -> list[str]:
    """When the model does not fit: the changes that make it fit (fp8 weights, fp8 KV cache, more
    tensor parallelism, a bigger GPU), each with the sequences it would hold."""
    tries: list[tuple[str, CapacityArgs, GpuSpec]] = []
    if args.weights_dtype not in ("fp8", "int4"):
        tries.append(("fp8 weights", replace(args, weights_dtype="fp8"), gpu))
    if args.kv_cache_dtype != "fp8":
        tries.append(("fp8 KV cache", replace(args, kv_cache_dtype="fp8"), gpu))
    for tp in (args.tp * 2, args.tp * 4, args.tp * 8):
        if tp <= 8 and model.num_heads % tp == 0:
            tries.append((f"TP {tp}", replace(args, tp=tp), gpu))
    g = gpu
    while g.next_up and g.next_up in GPUS:
        g = GPUS[g.next_up]
        tries.append((f"on {g.name}", replace(args, gpu=g.name), g))
    out = []
    for label, a, gg in tries:
        try:
            res = compute(a, model, gg)
        except CapacityError:
            continue
        out.append(f"{label}: {res.max_concurrent_sequences:,} sequences")
    return out


# ---------------------------------------------------------------------------------------
# Queueing view


@dataclass
class QueueArgs:
    users: list[int]
    service_s: float | None = None
    think_s: float | None = None
    max_num_seqs: int = DEFAULTS.max_num_seqs
    ramp: str | None = None


def estimate_from_ramp(doc: RampDoc) -> tuple[float, float] | None:
    """(service time, think time) from the lightest step of a ramp: E2E mean, and the rest of
    each user's request cycle (users / request rate - E2E)."""
    steps = [s for s in doc.steps if s.requests]
    if not steps:
        return None
    s = steps[0]
    e2e = s.latency.e2e.mean
    rate = s.request_rate
    if not e2e or not rate:
        return None
    cycle = s.users / rate
    return e2e, max(0.0, cycle - e2e)


def queue_rows(q: QueueArgs, seats: int) -> tuple[list[dict[str, Any]], float, float]:
    """Model rows (with the ramp's measured figures where user counts match), service, think.

    Raises:
        PresetError: no service/think time and no ramp to estimate them from.
    """
    measured: dict[int, StepSummary] = {}
    service, think = q.service_s, q.think_s
    if q.ramp:
        doc = read_ramp(q.ramp)
        est = estimate_from_ramp(doc)
        if est and service is None:
            service = est[0]
        if est and think is None:
            think = est[1]
        for s in doc.steps:
            measured[s.users] = s
    if service is None or think is None:
        raise PresetError("the queueing view needs --service-time and --think-time (or --ramp to estimate them)")
    if not 0 < service < math.inf or not 0 <= think < math.inf:
        raise PresetError("--service-time must be a positive number of seconds and --think-time 0 or more")
    users = sorted(set(q.users) | set(measured))
    rows = []
    for pt in queue_curve(users, seats, service, think):
        m = measured.get(pt.users)
        rows.append(
            {
                "users": pt.users,
                "arrival_rate": pt.arrival_rate,
                "utilisation": pt.utilisation,
                "p_wait": pt.p_wait,
                "expected_wait_s": None if pt.expected_wait_s == float("inf") else pt.expected_wait_s,
                "measured_ttft_p50_s": m.latency.ttft.p50 if m else None,
                "measured_e2e_p50_s": m.latency.e2e.p50 if m else None,
                "measured_queue_max": m.server.waiting_max if m else None,
            }
        )
    return rows, service, think


def render_queue(rows: list[dict[str, Any]], seats: int, service: float, think: float) -> str:
    lines = [
        f"queueing view: {seats} seats, service {fmt.seconds(service)}, think {think:.1f}s "
        f"-> saturation at {saturation_users(seats, service, think):.0f} users (M/M/c estimate)"
    ]
    lines.append(
        f"  {'users':>6} {'req/s':>7} {'util':>6} {'P(wait)':>8} {'exp. wait':>10}   {'meas. TTFT p50':>14} "
        f"{'meas. E2E p50':>13} {'queue':>6}"
    )
    for r in rows:
        wait = r["expected_wait_s"]
        lines.append(
            f"  {r['users']:>6} {r['arrival_rate']:>7.2f} {r['utilisation'] * 100:>5.0f}% {r['p_wait'] * 100:>7.0f}% "
            f"{'saturated' if wait is None else fmt.seconds(wait):>10}   {fmt.seconds(r['measured_ttft_p50_s']):>14} "
            f"{fmt.seconds(r['measured_e2e_p50_s']):>13} {fmt.num(r['measured_queue_max']):>6}"
        )
    lines.append("  note: an open M/M/c approximation; decode slows as the batch grows, so real waits begin earlier.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# The whole report, as `spoc capacity` prints it


@dataclass
class QueueView:
    seats: int
    service_s: float
    think_s: float
    rows: list[dict[str, Any]]


@dataclass
class CapacityReport:
    args: CapacityArgs
    model: ModelSpec
    gpu: GpuSpec
    plan: CapacityPlan
    server_config: dict[str, str] | None = None
    """The server's own ``cache_config_info`` (``--server``)."""
    queue: QueueView | None = None

    def text(self) -> str:
        out = render(self.args, self.model, self.gpu, self.plan, self.server_config)
        if self.queue is not None:
            q = self.queue
            out += "\n" + render_queue(q.rows, q.seats, q.service_s, q.think_s)
        return out

    def as_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(as_json(self.plan, self.server_config))
        if self.queue is not None:
            q = self.queue
            doc["queueing"] = {"seats": q.seats, "service_s": q.service_s, "think_s": q.think_s, "rows": q.rows}
        return doc


@dataclass
class CapacityRequest:
    args: CapacityArgs
    server: str | None = None
    """A running server to take block size and KV dtype from, and compare with."""
    queue_users: list[int] = field(default_factory=list)
    service_s: float | None = None
    think_s: float | None = None
    max_num_seqs: int = DEFAULTS.max_num_seqs
    ramp: str | None = None

    @property
    def wants_queue(self) -> bool:
        return bool(self.queue_users) or self.ramp is not None


def check_args(args: CapacityArgs) -> None:
    """Raises: CapacityError naming the flag that cannot be."""
    if args.tp < 1:
        raise CapacityError("--tp must be at least 1")
    for name in ("max_model_len", "avg_context", "block_size"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise CapacityError(f"--{name.replace('_', '-')} must be positive")
    for name in ("gpu_memory_gib", "gpu_memory_utilization", "kv_cache_gib", "reserve_gib"):
        v = getattr(args, name)
        if v is not None and (not math.isfinite(v) or v < 0 or (v == 0 and name != "reserve_gib")):
            raise CapacityError(f"--{name.replace('_', '-')} must be a positive number, not {v}")


def capacity_report(req: CapacityRequest) -> CapacityReport:
    """Everything ``spoc capacity`` shows.

    Raises:
        PresetError, CapacityError: with a message naming the problem.
    """
    args = req.args
    check_args(args)
    actual = server_cache_config(req.server) if req.server else None
    if actual:
        args = args_from_server(args, actual)
    model, gpu = resolve(args)
    p = compute(args, model, gpu)
    queue = None
    if req.wants_queue:
        if req.max_num_seqs < 1:
            raise PresetError("--max-num-seqs must be at least 1")
        seats = max(1, min(req.max_num_seqs, p.max_concurrent_sequences))
        rows, service, think = queue_rows(
            QueueArgs(req.queue_users, req.service_s, req.think_s, req.max_num_seqs, req.ramp), seats
        )
        queue = QueueView(seats, service, think, rows)
    return CapacityReport(args, model, gpu, p, actual, queue)
