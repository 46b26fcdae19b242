"""KV-cache capacity and roofline maths shared by the simulator and the capacity planner."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from spoc_tui.core.errors import InputError
from spoc_tui.core.hardware.presets import GIB, GpuSpec, ModelSpec
from spoc_tui.core.tuning.engineflags import DEFAULTS

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "auto": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "mxfp4": 0.53,
}

DEFAULT_RESERVE_BYTES = int(1.5 * GIB)
"""Per-GPU runtime reserve: activations at the profiling batch, CUDA graphs, NCCL buffers.
A stated assumption; vLLM measures its own at start-up."""


class CapacityError(InputError, ValueError):
    """A configuration that cannot run; the message says by how much it misses."""


def dtype_bytes(dtype: str) -> float:
    try:
        return DTYPE_BYTES[dtype.lower()]
    except KeyError:
        raise CapacityError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


def kv_bytes_per_token(model: ModelSpec, kv_dtype: str = "auto", full_layers_only: bool = True) -> float:
    """K and V for one token in every full-attention layer: 2 x layers x KV heads x head dim x bytes.

    Grouped-query attention stores ``num_kv_heads``, not ``num_heads``.
    """
    b = dtype_bytes(model.dtype if kv_dtype == "auto" and model.dtype in ("fp32", "fp16") else kv_dtype)
    layers = model.full_attention_layers if full_layers_only else model.num_layers
    return 2 * layers * model.num_kv_heads * model.head_dim * b


def sliding_kv_bytes(model: ModelSpec, context: int, kv_dtype: str = "auto") -> float:
    """KV bytes a request holds in sliding-window layers (capped at the window)."""
    if not model.sliding_layers or not model.sliding_window:
        return 0.0
    b = dtype_bytes(kv_dtype)
    return 2 * model.sliding_layers * model.num_kv_heads * model.head_dim * b * min(context, model.sliding_window)


def weights_bytes(model: ModelSpec, weights_dtype: str | None = None) -> float:
    """Whole-model weight bytes (MoE: all experts resident)."""
    if weights_dtype is None and model.weights_bytes_override:
        return float(model.weights_bytes_override)
    return model.total_params * dtype_bytes(weights_dtype or model.dtype)


@dataclass(frozen=True, slots=True)
class CapacityPlan:
    weights_bytes: float
    weights_bytes_per_gpu: float
    kv_bytes_per_token: float
    kv_bytes_per_request: float
    kv_cache_bytes: float
    kv_cache_tokens: int
    max_concurrent_sequences: int
    block_size: int
    num_blocks: int
    notes: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "weights_bytes": self.weights_bytes,
            "weights_bytes_per_gpu": self.weights_bytes_per_gpu,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_bytes_per_request": self.kv_bytes_per_request,
            "kv_cache_bytes": self.kv_cache_bytes,
            "kv_cache_tokens": self.kv_cache_tokens,
            "max_concurrent_sequences": self.max_concurrent_sequences,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "notes": list(self.notes),
        }


def plan(
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int = 1,
    gpu_memory_utilization: float = DEFAULTS.gpu_memory_utilization,
    max_model_len: int | None = None,
    avg_context: int | None = None,
    weights_dtype: str | None = None,
    kv_cache_dtype: str = DEFAULTS.kv_cache_dtype,
    block_size: int = DEFAULTS.block_size,
    reserve_bytes: float = DEFAULT_RESERVE_BYTES,
    kv_cache_bytes_override: float | None = None,
) -> CapacityPlan:
    """How much KV cache fits and how many sequences it holds.

    KV cache = GPU memory x utilisation x TP - weights - reserve x TP (or the given override,
    e.g. a CPU server's ``VLLM_CPU_KVCACHE_SPACE``).

    Raises:
        CapacityError: bad TP, weights larger than memory, a cache that cannot hold one
            full-length sequence; the message says by how much.
    """
    notes: list[str] = []
    if tp < 1:
        raise CapacityError("tensor parallel size must be at least 1")
    if model.num_heads % tp:
        raise CapacityError(f"TP {tp} does not divide the {model.num_heads} attention heads")
    if not 0 < gpu_memory_utilization <= 1:
        raise CapacityError("gpu-memory-utilization must be in (0, 1]")
    max_len = max_model_len or model.max_position
    if max_len <= 0:
        raise CapacityError("max-model-len must be positive")
    ctx = min(avg_context or max_len, max_len)
    w = weights_bytes(model, weights_dtype)
    w_gpu = w / tp
    per_token = kv_bytes_per_token(model, kv_cache_dtype)
    if tp > model.num_kv_heads:
        # Each GPU keeps a copy of the KV heads it needs: the cache is replicated.
        per_token *= tp / model.num_kv_heads
        notes.append(f"TP {tp} > {model.num_kv_heads} KV heads: KV heads are replicated across GPUs")
    per_request = per_token * ctx + sliding_kv_bytes(model, ctx, kv_cache_dtype)
    if kv_cache_bytes_override is not None:
        cache = float(kv_cache_bytes_override)
        notes.append("KV cache size given by the server, not derived from GPU memory")
    else:
        budget = gpu.memory_bytes * gpu_memory_utilization
        if w_gpu + reserve_bytes > budget:
            short = (w_gpu + reserve_bytes - budget) / GIB
            raise CapacityError(
                f"weights need {w_gpu / GIB:.1f} GiB per GPU (+{reserve_bytes / GIB:.1f} GiB runtime reserve) but "
                f"{gpu_memory_utilization:g} x {gpu.memory_bytes / GIB:.1f} GiB = {budget / GIB:.1f} GiB is allowed: "
                f"{short:.1f} GiB short per GPU"
            )
        cache = (budget - w_gpu - reserve_bytes) * tp
        notes.append(f"runtime reserve assumed {reserve_bytes / GIB:.1f} GiB per GPU (activations, CUDA graphs)")
    per_token_block = per_token * block_size
    num_blocks = int(cache // per_token_block) if per_token_block > 0 else 0
    tokens = num_blocks * block_size
    need_one = per_token * max_len + sliding_kv_bytes(model, max_len, kv_cache_dtype)
    if cache < need_one:
        raise CapacityError(
            f"one {max_len}-token sequence needs {need_one / GIB:.2f} GiB of KV cache but only "
            f"{cache / GIB:.2f} GiB is free: {(need_one - cache) / GIB:.2f} GiB short "
            f"(lower max-model-len or raise memory)"
        )
    blocks_per_req = math.ceil(ctx / block_size)
    seqs = num_blocks // blocks_per_req if blocks_per_req else 0
    if model.sliding_layers:
        notes.append(
            f"{model.sliding_layers} of {model.num_layers} layers use a {model.sliding_window}-token sliding window"
        )
    if model.num_experts:
        notes.append(f"MoE: all {model.num_experts} experts resident, {model.experts_per_token} active per token")
    return CapacityPlan(
        weights_bytes=w,
        weights_bytes_per_gpu=w_gpu,
        kv_bytes_per_token=per_token,
        kv_bytes_per_request=per_request,
        kv_cache_bytes=cache,
        kv_cache_tokens=tokens,
        max_concurrent_sequences=seqs,
        block_size=block_size,
        num_blocks=num_blocks,
        notes=tuple(notes),
    )


# ---------------------------------------------------------------------------------------
# Roofline of one engine iteration

MEM_EFFICIENCY = 0.85
"""Fraction of datasheet HBM bandwidth that decode kernels reach."""
COMPUTE_EFFICIENCY = 0.6
"""Fraction of dense BF16 peak that prefill GEMMs reach."""
ITERATION_OVERHEAD_S = 0.0004
"""Scheduler, sampling and kernel-launch time per iteration (CUDA graphs on)."""
ALLREDUCE_LATENCY_S = 8e-6


@dataclass(frozen=True, slots=True)
class IterationCost:
    seconds: float
    mem_seconds: float
    compute_seconds: float
    comm_seconds: float
    bytes_read: float
    flops: float


def iteration_time(
    model: ModelSpec,
    gpu: GpuSpec,
    tp: int,
    decode_contexts: Collection[int],
    prefill_chunks: list[tuple[int, int]] | tuple[tuple[int, int], ...],
    weights_per_gpu: float,
    kv_per_token: float,
    clock_ratio: float = 1.0,
    flops_scale: float = 1.0,
) -> IterationCost:
    """Time of one engine step on the slowest GPU of the TP group.

    Args:
        decode_contexts: context length of each decoding sequence (1 new token each).
        prefill_chunks: ``(new tokens, tokens already in context)`` per prefilling sequence.
        clock_ratio: SM clock / max SM clock of the slowest GPU in the group.
        flops_scale: tensor throughput relative to BF16 (2 for FP8 GEMMs on Hopper).
    """
    n_decode = len(decode_contexts)
    decode_ctx = sum(decode_contexts)
    # a step of decodes alone (most steps) sums no chunks: the same ints, 0 for each sum
    n_prefill_tokens = sum(c for c, _ in prefill_chunks) if prefill_chunks else 0
    tokens = n_decode + n_prefill_tokens
    if tokens == 0:
        return IterationCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    w_bytes = weights_per_gpu
    if model.num_experts:
        # Experts touched by this batch: E x (1 - (1 - k/E)^tokens) per layer.
        frac = 1 - (1 - model.experts_per_token / model.num_experts) ** tokens
        expert_bytes = weights_per_gpu * 0.95
        w_bytes = weights_per_gpu - expert_bytes + expert_bytes * frac
    kv_read = kv_per_token / tp * (decode_ctx + (sum(done + c for c, done in prefill_chunks) if prefill_chunks else 0))
    bytes_read = w_bytes + kv_read
    attn_flops_per_ctx = 4 * model.num_layers * model.num_heads * model.head_dim
    flops = 2 * model.active_params * tokens + attn_flops_per_ctx * (
        decode_ctx + (sum(c * (done + c / 2) for c, done in prefill_chunks) if prefill_chunks else 0)
    )
    flops /= tp
    mem_s = bytes_read / (gpu.mem_bw_bytes_s * MEM_EFFICIENCY)
    comp_s = flops / (gpu.bf16_flops * flops_scale * COMPUTE_EFFICIENCY)
    r = max(0.05, min(1.0, clock_ratio))
    # Memory-bound kernels slow less than compute-bound ones when the SM clock drops.
    kernel_s = max(mem_s / (0.6 + 0.4 * r), comp_s / r)
    comm_s = 0.0
    if tp > 1:
        msg = tokens * model.hidden_size * 2
        comm_s = 2 * model.num_layers * (ALLREDUCE_LATENCY_S + msg * 2 * (tp - 1) / tp / gpu.interconnect_bytes_s)
    secs = kernel_s + comm_s + ITERATION_OVERHEAD_S / r
    return IterationCost(secs, mem_s, comp_s, comm_s, bytes_read, flops)


def decode_roofline_tokens_per_s(
    model: ModelSpec, gpu: GpuSpec, tp: int = 1, context: int = 0, weights_dtype: str | None = None
) -> float:
    """Single-stream decode speed if every step only streamed weights + KV at achievable bandwidth."""
    w = weights_bytes(model, weights_dtype) / tp
    kv = kv_bytes_per_token(model) / tp * context
    return gpu.mem_bw_bytes_s * MEM_EFFICIENCY / (w + kv)
