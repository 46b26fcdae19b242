"""The real-engine tier's vLLM, in one place for its tests and the benchmarks: where
``scripts/realengine_setup.sh`` puts it, its environment, and how it is started."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from spoc_tui.procs.group import stop_process_group
from spoc_tui.procs.ports import free_ports
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


def guarded() -> list[str]:
    """The prefix that runs a program under spoc's guard (it is stopped when this test process
    dies, however it dies); the guard leads the new process group ``stop_process_group`` stops."""
    return [sys.executable, "-m", "spoc_tui.procs.guard", str(os.getpid()), "--"]


def start_prometheus(
    targets: dict[str, list[str]], blocks: Path | None = None
) -> tuple[str, subprocess.Popen[bytes], Path]:
    """A real Prometheus on loopback scraping ``job -> [host:port]`` every second; fails the test
    when it does not become ready (RuntimeError). Stop it with ``stop_process_group`` and remove the folder.
    ``blocks``: TSDB blocks it starts with (``promtool tsdb create-blocks-from``: a history)."""
    binary = shutil.which("prometheus") or "/usr/bin/prometheus"
    if not Path(binary).exists():
        raise RuntimeError("prometheus is not installed: run `bash scripts/realengine_setup.sh` (make test does)")
    (port,) = free_ports(1)
    work = Path(tempfile.mkdtemp(prefix="spoc-prom-"))
    cfg = work / "prometheus.yml"
    if blocks is not None:
        shutil.copytree(blocks, work / "data")
    jobs = {"prometheus": [f"127.0.0.1:{port}"], **targets}
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        + "".join(
            f"  - job_name: {job}\n    static_configs:\n      - targets: [{', '.join(repr(t) for t in hosts)}]\n"
            for job, hosts in jobs.items()
        )
    )
    proc = subprocess.Popen(
        [
            *guarded(),
            binary,
            f"--config.file={cfg}",
            f"--storage.tsdb.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(work / "prometheus.log", "wb"),
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                return url, proc, work
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    stop_process_group(proc)
    raise RuntimeError("prometheus did not become ready:\n" + (work / "prometheus.log").read_text()[-2000:])
