import sys

import pytest

from spoc_tui.procs.ports import free_ports
from spoc_tui.procs.server import LaunchError, ServerProcess


def test_launch_sim_ready_then_stopped(tmp_path):
    port, dport = free_ports(2)
    s = ServerProcess(
        [sys.executable, "-m", "spoc_tui.cli", "sim", "--port", str(port), "--dcgm-port", str(dport)],
        port,
        tmp_path / "sim.log",
        guard=True,  # a test process killed mid-test leaves no simulator behind
    )
    took = s.start(timeout=30)
    assert took < 30 and s.alive()
    tmp = s.tmpdir
    s.stop()
    assert not s.alive() and s.tmpdir is None and not __import__("os").path.exists(tmp)
    s.stop()  # twice is fine


def test_launch_failure_keeps_the_log_tail(tmp_path):
    (port,) = free_ports(1)
    s = ServerProcess(
        [sys.executable, "-m", "spoc_tui.cli", "sim", "--port", str(port), "--gpu", "v100"], port, tmp_path / "bad.log"
    )
    with pytest.raises(LaunchError) as e:
        s.start(timeout=30)
    assert "unknown GPU" in e.value.log_tail


def test_missing_binary(tmp_path):
    (port,) = free_ports(1)
    with pytest.raises(LaunchError, match="cannot run"):
        ServerProcess(["/nonexistent/vllm"], port, tmp_path / "x.log").start()


def test_a_start_interrupted_stops_the_half_started_server(tmp_path):
    """Issue 56: a benchmark stopped while its vLLM was still starting left the server running (the
    start waited outside any clean-up). Whatever interrupts the wait now stops the server."""
    import os
    import signal

    (port,) = free_ports(1)
    never_ready = [sys.executable, "-c", "import time; time.sleep(300)"]
    server = ServerProcess(never_ready, port, tmp_path / "server.log")

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            server.start(timeout=60, poll=0.1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert server.proc is not None and server.proc.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(server.proc.pid, 0)  # the whole group is gone
