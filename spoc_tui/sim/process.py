"""The simulator as a process of its own (``spoc demo``, tests, benchmarks, screenshots).

It is started as any server is (:class:`~spoc_tui.procs.server.ServerProcess`): its own
process group, ``/health`` readiness, and the guard, so a simulator never outlives the process
that started it, even one killed by SIGKILL.
"""

from __future__ import annotations

import sys

from spoc_tui.procs.server import LaunchError, ServerProcess


def sim_argv(args: list[str], port: int) -> list[str]:
    """The command line of ``spoc sim ARGS --port PORT`` run by this Python."""
    return [sys.executable, "-m", "spoc_tui.cli", "sim", *args, "--port", str(port)]


def start_sim(args: list[str], port: int, timeout: float = 20.0, core: int | None = None) -> ServerProcess:
    """Start ``spoc sim`` and wait until it serves; stop it with ``.stop()``. ``core``: run it on
    that CPU alone (``taskset``; the benchmarks give the clients the other cores).

    Raises:
        LaunchError: when it exits or does not become ready; the message is the simulator's
            own last line (its error) where it printed one.
    """
    argv = sim_argv(args, port)
    if core is not None:
        argv = ["taskset", "-c", str(core), *argv]
    server = ServerProcess(argv, port, guard=True, tmp_prefix="spoc-sim-")
    try:
        server.start(timeout=timeout, poll=0.2)
    except LaunchError as e:
        said = [ln.strip() for ln in e.log_tail.splitlines() if ln.strip()]
        raise LaunchError(said[-1] if said and e.kind == "exited" else str(e), e.log_tail, e.kind) from None
    return server
