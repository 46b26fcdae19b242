"""Processes the suite started, found by a marker in their environment (every child inherits it,
whatever session or process group it moved to, and however its parent died): never by name."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

from spoc_tui.procs.supervise import descendants as below
from spoc_tui.procs.supervise import living

MARKER = "SPOC_TEST_RUN"


def ensure_marker() -> str:
    return os.environ.setdefault(MARKER, uuid.uuid4().hex)


def marked(token: str | None = None) -> list[int]:
    """Live (not zombie) processes other than this one whose environment carries the marker."""
    needle = f"{MARKER}={token or os.environ[MARKER]}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if needle not in (d / "environ").read_bytes().split(b"\0"):
                continue
            state = (d / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z":
            out.append(int(d.name))
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children...)."""
    return living(below(pid))


def alive(pids: list[int]) -> list[int]:
    return living(pids)


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        cmd = "?"
    return f"{pid}: {cmd[:160]}"


def stop(pids: list[int]) -> None:
    for pid in alive(pids):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def interruptible() -> None:
    """``preexec_fn`` for a child a test stops with SIGINT, as Ctrl-C in a terminal would: a shell
    that runs the suite in the background (``make test &``, CI runners) starts it with SIGINT
    ignored, and a child inherits that, so Python would never raise KeyboardInterrupt in it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


TRACEBACKS_ENV = {"PYTHONFAULTHANDLER": "1"}
"""A child started with this in its environment prints every thread's stack on SIGABRT."""


def communicate_or_show_where(p, timeout: float) -> tuple[str, str]:
    """``p.communicate(timeout)``; a child still running then is sent SIGABRT (started with
    :data:`TRACEBACKS_ENV`, Python prints where each of its threads was) and the test fails with
    that, so a hang says where it hung instead of only that it did."""
    import subprocess

    try:
        return p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        # it may have ended while a child of its holds its output open (communicate waits for that)
        state = "still running" if p.poll() is None else f"ended ({p.returncode}) but its output is held open"
        held = [describe(pid) for pid in marked() if pid != p.pid]
        if p.poll() is None:
            p.send_signal(signal.SIGABRT)
        try:
            out, err = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            out, err = "", "(its output still held open)"
        raise AssertionError(
            f"{state} after {timeout} s; the suite's processes: {held}\nwhere it was:\n{err[-6000:]}\n{out[-2000:]}"
        ) from None
