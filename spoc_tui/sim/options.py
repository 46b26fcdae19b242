"""The simulator's options, as ``spoc sim`` takes them (a ``vllm serve``-like command line).

Kept apart from the simulator itself so the CLI can read the defaults without loading it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spoc_tui.core.errors import InputError
from spoc_tui.core.tuning.engineflags import EngineFlags

SCENARIOS = ("steady", "thermal", "overload", "imbalanced", "fleet")
"""steady; thermal: one hot GPU in the TP group; overload: far more users than seats;
imbalanced: several replicas (``--replicas``, 3 unless given) sharing the load evenly while the
last one runs on slower GPUs (L40S), so it lags; fleet: ``spoc demo``'s name for imbalanced."""
MULTI_REPLICA = ("imbalanced", "fleet")


class SimConfigError(InputError, ValueError):
    """Bad simulator options; the message says what to change."""


@dataclass(frozen=True, kw_only=True)
class SimOptions(EngineFlags):
    """``spoc sim``'s options: vLLM's flags (:class:`EngineFlags`) and the simulator's own."""

    model: str = "llama-3.1-8b"
    gpu: str = "h100-80gb"
    tp: int | None = None
    scenario: str = "steady"
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 8000
    dcgm_port: int | None = 9400
    served_model_name: str | None = None
    quantization: str | None = None
    speed: float = 1.0
    load_users: int | None = None
    replicas: int | None = None
    """Replicas served by this process, each an engine of its own on ``port + i`` (and
    ``dcgm_port + i``); 0 for a port picks one per replica. None: 1, or 3 for imbalanced/fleet."""
    truth_log: str | None = None
    twin: str | None = None
    """Serve a calibrated twin (twin.json): the server's settings and fitted step time instead of a
    model and GPU preset; the engine flags given (:attr:`given`) are what-ifs on it."""
    given: tuple[str, ...] = ()
    """The engine flags given on the command line (a twin takes only these, even at their defaults)."""
    api_key: str | None = field(default=None, repr=False)
    """As vLLM's --api-key: /v1 endpoints want ``Authorization: Bearer KEY`` (/metrics, /health stay open)."""
    """Built-in background users (none unless given; `spoc demo` chooses per scenario)."""
