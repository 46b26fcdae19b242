"""A script that starts processes stops them whatever stops it (issue 56, item 1): the benchmarks.

``supervise()``, first thing in a script's ``__main__``, runs the script again as a child of this
process and waits for it; this process is the child's *subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``),
so every process the script starts, at any depth and in any session or process group, is
reparented here when its own parent dies instead of drifting to init. When the script ends, however
it ends (its exit, Ctrl-C, SIGTERM, SIGHUP, even SIGKILL of the script alone), the processes left
under this one get SIGTERM, then SIGKILL after :data:`GRACE_S`. SIGINT, SIGTERM and SIGHUP sent here
are passed on to the script, whose own ``finally`` blocks then run (they raise ``SystemExit`` there).

Should this process itself be killed by SIGKILL, the script gets SIGTERM from the kernel
(``PR_SET_PDEATHSIG``) and stops what it started in its ``finally`` blocks; servers started through
:class:`~spoc_tui.procs.server.ServerProcess` also have their guard, and a monitor in a
pseudo-terminal exits when the terminal closes. Nothing is ever killed by name: only this process's
own descendants, found by their parent ids.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from types import FrameType

ENV = "SPOC_SUPERVISED"
"""Set in the supervised script (and inherited by what it starts): supervise once, not again."""
GRACE_S = 5.0
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def _prctl(option: int, arg: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _die_with_parent() -> None:
    """In the child before it runs: SIGTERM when the supervisor dies, however it dies; and SIGINT
    at its default, so that Python raises KeyboardInterrupt for the SIGINT the supervisor passes on.
    A shell starts a background job (``make bench &``, a CI runner's step) with SIGINT ignored, the
    child inherited that, and a SIGINT to the supervisor reached a script that ignored it: both
    waited for ever (seen as a hung test when the suite ran in the background)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def descendants(root: int) -> list[int]:
    """The processes below ``root`` (children, theirs, ...), from /proc's parent ids."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(pid)
    return out


def living(pids: list[int]) -> list[int]:
    """Those of ``pids`` that run (not gone, not zombies)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


def _reap_zombies() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def stop_descendants(grace: float = GRACE_S) -> list[int]:
    """SIGTERM to every living descendant, SIGKILL to those left after ``grace``; returns the
    pids that were stopped."""
    me = os.getpid()
    left = living(descendants(me))
    stopped = list(left)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline:
            _reap_zombies()
            left = living(descendants(me))
            if not left:
                return stopped
            time.sleep(0.05)
    return stopped


def _exit_on_stop_signals() -> None:
    """In the script: SIGTERM and SIGHUP raise SystemExit, so its ``finally`` blocks stop children."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        # once: a second stop signal (the supervisor passing on one the child was also sent) raised
        # again inside the first's unwinding, and the interpreter's shutdown printed a traceback
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, stop)
        except (ValueError, OSError):  # not the main thread
            pass


def supervise() -> None:
    """Run the rest of this script as a supervised child (see the module's text); returns only in
    the child. Where it cannot (not Linux), the script runs as it is, its stop signals made exits."""
    if os.environ.get(ENV) or not sys.platform.startswith("linux") or not _prctl(_PR_SET_CHILD_SUBREAPER, 1):
        _exit_on_stop_signals()
        return
    child = subprocess.Popen([sys.executable, *sys.argv], env={**os.environ, ENV: "1"}, preexec_fn=_die_with_parent)

    def forward(signum: int, _frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    rc = child.wait()
    stopped = stop_descendants()
    if stopped:
        print(f"supervise: stopped {len(stopped)} process(es) the script left: {stopped}", file=sys.stderr)
    sys.exit(rc if rc >= 0 else 128 - rc)
