"""The simulator's options, as ``spoc sim`` takes them (a ``vllm serve``-like command line).

Kept apart from the simulator itself so the CLI can read the defaults without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spoc_tui.core.engineflags import DEFAULTS
from spoc_tui.core.errors import InputError

SCENARIOS = ("steady", "thermal", "overload", "imbalanced", "fleet")
"""steady; thermal: one hot GPU in the TP group; overload: far more users than seats;
imbalanced: several replicas (``--replicas``, 3 unless given) sharing the load evenly while the
last one runs on slower GPUs (L40S), so it lags; fleet: ``spoc demo``'s name for imbalanced."""
MULTI_REPLICA = ("imbalanced", "fleet")


class SimConfigError(InputError, ValueError):
    """Bad simulator options; the message says what to change."""


@dataclass
class SimOptions:
    model: str = "llama-3.1-8b"
    gpu: str = "h100-80gb"
    tp: int | None = None
    scenario: str = "steady"
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 8000
    dcgm_port: int | None = 9400
    served_model_name: str | None = None
    max_num_seqs: int = DEFAULTS.max_num_seqs
    max_num_batched_tokens: int | None = DEFAULTS.max_num_batched_tokens
    enable_chunked_prefill: bool = DEFAULTS.enable_chunked_prefill
    enable_prefix_caching: bool = DEFAULTS.enable_prefix_caching
    gpu_memory_utilization: float = DEFAULTS.gpu_memory_utilization
    block_size: int = DEFAULTS.block_size
    max_model_len: int | None = DEFAULTS.max_model_len
    kv_cache_dtype: str = DEFAULTS.kv_cache_dtype
    quantization: str | None = None
    speed: float = 1.0
    load_users: int | None = None
    replicas: int | None = None
    """Replicas served by this process, each an engine of its own on ``port + i`` (and
    ``dcgm_port + i``); 0 for a port picks one per replica. None: 1, or 3 for imbalanced/fleet."""
    truth_log: str | None = None
    api_key: str | None = field(default=None, repr=False)
    """As vLLM's --api-key: /v1 endpoints want ``Authorization: Bearer KEY`` (/metrics, /health stay open)."""
    """Built-in background users (none unless given; `spoc demo` chooses per scenario)."""
