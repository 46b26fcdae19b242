"""vLLM's engine flags that shape capacity and scheduling, and their defaults, declared once.

The simulator's engine (``sim/engine.EngineConfig``), its command line (``sim/options``), the
capacity maths (``core/hardware/capacity.plan``, ``capacity/service``) and the CLI's defaults read them
from :data:`DEFAULTS`. The defaults are vLLM's (V1, 0.8 and later) where vLLM has one; a
``None`` means vLLM derives it (``max_num_batched_tokens`` from chunked prefill and
``max_model_len``; ``max_model_len`` from the model's context).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineFlags:
    """The flags, each a vLLM ``serve`` option; the class's attributes are the defaults (no slots,
    so ``SimOptions.max_num_seqs`` reads as one for the CLI's option declarations)."""

    max_num_seqs: int = 256
    """--max-num-seqs: the most requests in a batch (the seats)."""
    max_num_batched_tokens: int | None = None
    """--max-num-batched-tokens: a step's token budget (None: vLLM's rule)."""
    enable_chunked_prefill: bool = True
    """--[no-]enable-chunked-prefill: split long prefills across steps."""
    enable_prefix_caching: bool = True
    """--[no-]enable-prefix-caching: reuse the KV blocks of a shared prefix."""
    gpu_memory_utilization: float = 0.9
    """--gpu-memory-utilization: the share of each GPU's memory vLLM may use."""
    block_size: int = 16
    """--block-size: tokens per KV-cache block."""
    max_model_len: int | None = None
    """--max-model-len: the longest sequence (None: the model's context)."""
    kv_cache_dtype: str = "auto"
    """--kv-cache-dtype: ``auto`` (the model's dtype) or ``fp8``."""


DEFAULTS = EngineFlags()
"""vLLM's defaults."""

BLOCK_SIZES = (1, 8, 16, 32, 64, 128, 256)
"""The block sizes vLLM accepts."""
