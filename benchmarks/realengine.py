"""The real-engine tier's vLLM, in one place for its tests and the benchmarks: where
``scripts/realengine_setup.sh`` puts it, its environment, and how it is started."""

from __future__ import annotations

import os
from pathlib import Path

from spoc_tui.procs.server import ServerProcess

DIR = Path(os.environ.get("SPOC_REALENGINE_DIR", Path.home() / ".cache" / "spoc-tui"))
VENV = DIR / "vllm-0.32.0"
MODEL = DIR / "tiny-llama"
KV_GIB = 1
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": str(KV_GIB),
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
NOT_SET_UP = f"the real-engine tier is not set up in {DIR}: run bash scripts/realengine_setup.sh (make test does)"


def ready() -> bool:
    """Whether the set-up script finished (the vLLM venv and the tiny model)."""
    return (VENV / ".ready").exists() and (MODEL / ".ready").exists()


def serve_command(port: str | int = "{port}") -> str:
    """``vllm serve`` of the tiny model as one command line (a ``--launch`` template by default)."""
    return (
        f"{VENV / 'bin' / 'vllm'} serve {MODEL} --host 127.0.0.1 --port {port} --max-model-len 2048 "
        "--dtype float32 --served-model-name tiny"
    )


def vllm_argv(port: int, *flags: str) -> list[str]:
    """``vllm serve`` of the tiny model on 127.0.0.1:``port`` with ``flags``."""
    return [*serve_command(port).split(), *flags]


def vllm_server(log: Path, port: int, *flags: str, core: int | None = None, guard: bool = False) -> ServerProcess:
    """The tiny model's server (not started), its threads on ``core`` if given."""
    argv, env = vllm_argv(port, *flags), dict(VLLM_ENV)
    if core is not None:
        argv = ["taskset", "-c", str(core), *argv]
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    return ServerProcess(argv, port, log, env, guard=guard)
