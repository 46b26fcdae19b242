"""Benchmarks stop what they started whatever stops them (issue 56 item 1): the supervisor
(spoc_tui.procs.supervise) on a small script and on the benchmark the review caught leaving its
monitor behind. Real time is the subject here: processes, signals and what is left after them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spoc_tui.procs.supervise import descendants

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import subprocess, sys, time
    sys.path.insert(0, {root!r})
    if __name__ == "__main__":
        from spoc_tui.procs.supervise import supervise
        supervise()
        # a child in a session of its own that ignores SIGTERM, and one that would clean up
        stubborn = subprocess.Popen(
            [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"],
            start_new_session=True,
        )
        plain = subprocess.Popen(["sleep", "300"], start_new_session=True)
        try:
            # said inside the try: a stop signal right after it still finds the finally armed (said
            # before it, a loaded host let SIGTERM land between the two: the plain child was left)
            print("started", stubborn.pid, plain.pid, flush=True)
            time.sleep(300)
        finally:
            plain.kill()
    """
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture
def started() -> Iterator[list[int]]:
    """Whatever a test started: SIGKILLed at its end, whatever the test found (a failed assert left
    the supervisor, the script and both children running)."""
    pids: list[int] = []
    yield pids
    for p in pids:
        if _alive(p):
            os.kill(p, signal.SIGKILL)


def _start(tmp_path: Path, started: list[int], sigint_ignored: bool = False) -> tuple[subprocess.Popen[str], list[int]]:
    """The supervisor, and the processes below it: the script and its two children. The children
    are named by the pids the script prints, not by their command lines: right after its fork
    returns, a child may still be inside exec with no command line yet (a loaded host's CI run
    found no 'sleep' among them)."""
    script = tmp_path / "bench.py"
    script.write_text(SCRIPT.format(root=str(ROOT)))
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_ignore_sigint if sigint_ignored else None,
    )
    started.append(proc.pid)
    assert proc.stdout is not None
    said = proc.stdout.readline().split()
    assert said[:1] == ["started"], said
    children = [int(p) for p in said[1:]]
    started.extend(children)
    tree = descendants(proc.pid)
    started.extend(tree)
    scripts = [p for p in tree if p not in children]
    assert len(scripts) == 1 and set(children) <= set(tree), (tree, children)
    return proc, [scripts[0], *children]


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_to_the_supervisor_leaves_nothing(tmp_path, started, sig):
    proc, tree = _start(tmp_path, started)
    os.kill(proc.pid, sig)
    assert proc.wait(30) != 0
    assert _gone_within(tree, 10) == []


def test_sigint_reaches_the_script_of_a_benchmark_started_in_the_background(tmp_path, started):
    """A shell starts a background job (`make bench &`, a CI runner's step) with SIGINT ignored:
    the supervisor still passes SIGINT on, and the script no longer inherits the ignoring (it did,
    and both waited for ever: the case above hung when the suite itself ran in the background)."""
    proc, tree = _start(tmp_path, started, sigint_ignored=True)
    os.kill(proc.pid, signal.SIGINT)
    assert proc.wait(30) != 0
    assert _gone_within(tree, 10) == []


def test_the_script_killed_alone_its_orphans_are_stopped(tmp_path, started):
    proc, tree = _start(tmp_path, started)
    script = tree[0]
    os.kill(script, signal.SIGKILL)
    assert proc.wait(30) == 137
    assert _gone_within(tree, 10) == []


def test_the_supervisor_killed_the_script_stops_what_it_started(tmp_path, started):
    """SIGKILL to the supervisor: the script gets SIGTERM (PR_SET_PDEATHSIG) and its finally runs;
    its stubborn child, in a session of its own and deaf to SIGTERM, is the script's to stop: the
    plain one is stopped by the script's finally."""
    proc, (script, _stubborn, plain) = _start(tmp_path, started)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    # the stubborn one outlives a SIGKILLed supervisor: the fixture stops it
    assert _gone_within([script, plain], 10) == []


def test_the_monitor_benchmark_killed_leaves_no_monitor_and_no_simulator():
    """The review's case: monitor_cpu.py killed by timeout (SIGTERM) left its child monitor at 90 %
    of a core. (SIGKILL to a supervisor: test_the_supervisor_killed_the_script_stops_what_it_started.)"""
    sig = signal.SIGTERM
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "monitor_cpu.py"), "--smoke"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    tree: list[int] = []
    while time.monotonic() < deadline and proc.poll() is None:
        tree = descendants(proc.pid)
        cmds = [Path(f"/proc/{p}/cmdline").read_bytes() if _alive(p) else b"" for p in tree]
        if any(b"monitor\0--url" in c for c in cmds):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the benchmark never started its monitor")
    os.kill(proc.pid, sig)
    proc.wait(30)
    assert _gone_within(tree, 15) == []
