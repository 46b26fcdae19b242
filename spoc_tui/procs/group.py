"""Process groups: every server and load generator runs as the leader of its own group, so
stopping the group stops whatever it started too."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable


def kill_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to a process group; False when the group is gone (or not ours)."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_process_group(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM a process group, wait, SIGKILL what is left; safe on a finished process."""
    if proc.poll() is None:
        kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc.pid, signal.SIGKILL)  # children left behind by the group leader
    proc.wait()


def pid_alive(pid: int) -> bool:
    """The process exists (a zombie counts as gone)."""
    return _exists(os.kill, pid)


def group_alive(pgid: int) -> bool:
    """Some process of the group exists (its leader a zombie counts as gone)."""
    return _exists(os.killpg, pgid)


def _exists(send: Callable[[int, int], None], pid: int) -> bool:
    try:
        send(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when there is no such process:
    with the pid it names one process, never a later one that got the same pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def owner_stamp() -> str:
    """``pid:start`` of this process, as markers and locks record their owner."""
    return f"{os.getpid()}:{start_time(os.getpid())}"


def owner_alive(stamp: object) -> bool:
    """The process a ``pid:start`` stamp names (the study that wrote it) still runs; this
    process itself does not count."""
    if not isinstance(stamp, str) or ":" not in stamp:
        return False
    pid_s, _, start_s = stamp.partition(":")
    if not pid_s.isdigit() or int(pid_s) == os.getpid():
        return False
    now = start_time(int(pid_s))
    return now is not None and str(now) == start_s
