"""``spoc demo``: the simulator with a background load, and the monitor on it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx

from spoc_tui.config import Settings
from spoc_tui.launcher import stop_process_group


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all held open while choosing, so no repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def start_sim(args: list[str], port: int, timeout: float = 20.0) -> subprocess.Popen[bytes]:
    """Start ``spoc sim`` in its own process group and wait for /health.

    Raises:
        RuntimeError: when it exits or does not become ready; with its stderr.
    """
    cmd = [sys.executable, "-m", "spoc_tui.cli", "sim", *args, "--port", str(port)]
    env = {**os.environ, "SPOC_SIM_PARENT_PID": str(os.getpid())}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, env=env)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            raise RuntimeError(err or f"simulator exited with code {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=0.5).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    stop_group(proc)
    raise RuntimeError("simulator did not become ready in time")


def stop_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """Stop a simulator started by :func:`start_sim` (its whole process group)."""
    stop_process_group(proc, grace)


def run_demo(scenario: str, model: str, gpu: str, tp: int | None, users: int | None, seed: int) -> int:
    from spoc_tui.app import run_monitor
    from spoc_tui.sim.run import SimConfigError, SimOptions, build, demo_users

    opts = SimOptions(model=model, gpu=gpu, tp=tp, scenario=scenario, seed=seed)
    try:
        engine, _ = build(opts)  # validate before starting anything
    except SimConfigError as e:
        print(f"spoc demo: error: {e}", file=sys.stderr)
        return 2
    n_users = users if users is not None else demo_users(scenario, engine)
    port, dport = free_ports(2)
    args = ["--model", model, "--gpu", gpu, "--scenario", scenario, "--seed", str(seed), "--dcgm-port", str(dport), "--load-users", str(n_users)]
    if tp is not None:
        args += ["--tp", str(tp)]
    print(f"spoc demo: starting the SIMULATED {model} on {gpu} ({scenario}, {n_users} users)...", flush=True)
    try:
        proc = start_sim(args, port)
    except RuntimeError as e:
        print(f"spoc demo: error: {e}", file=sys.stderr)
        return 1
    try:
        settings = Settings(
            vllm_urls=[f"http://127.0.0.1:{port}"],
            dcgm_urls=[f"http://127.0.0.1:{dport}/metrics"],
            nvml=False,
            tp_groups=f"0-{engine.cfg.tp - 1}" if engine.cfg.tp > 1 else None,
            interval=1.0,
            window=30.0,
            tune_launch=f"{sys.executable} -m spoc_tui.cli sim {model} --gpu {gpu} --port {{port}} --dcgm-port 0 {{flags}}",
        )
        return run_monitor(settings)
    except KeyboardInterrupt:
        return 130
    finally:
        stop_group(proc)
