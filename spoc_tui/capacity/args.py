"""What ``spoc capacity`` and the Capacity screen ask (:class:`CapacityArgs`), light on purpose:
``spoc --help`` reads its defaults without loading the service's dependencies."""

from __future__ import annotations

from dataclasses import dataclass

from spoc_tui.core.tuning.engineflags import DEFAULTS


@dataclass
class CapacityArgs:
    model: str
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    tp: int = 1
    max_model_len: int | None = None
    avg_context: int | None = None
    weights_dtype: str | None = None
    kv_cache_dtype: str = DEFAULTS.kv_cache_dtype
    gpu_memory_utilization: float = DEFAULTS.gpu_memory_utilization
    block_size: int = DEFAULTS.block_size
    kv_cache_gib: float | None = None
    """KV space given directly (a CPU server's VLLM_CPU_KVCACHE_SPACE)."""
    reserve_gib: float | None = None
