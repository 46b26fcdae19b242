"""SIGTERM and SIGHUP stop a headless ramp or study as Ctrl-C does.

A dropped SSH session sends SIGHUP, ``kill`` and systemd send SIGTERM: without this both ended the
process at once, leaving ``ramp.json`` saying ``running`` and the load generator behind. Here each
is handed to whatever handles SIGINT at that moment (asyncio's runner cancels its main task, so
the ramp's clean-up runs; elsewhere Python raises ``KeyboardInterrupt``). After SIGHUP the
terminal is gone: standard output and error are pointed at ``/dev/null`` first, so the final
lines cannot fail with EIO half-way through the clean-up.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, TypeVar

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
T = TypeVar("T")


def _detach_terminal() -> None:
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and os.isatty(stream.fileno()):
                os.dup2(null, stream.fileno())
        except (OSError, ValueError):  # already closed, or not a real file
            continue
    os.close(null)


def _as_interrupt(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGHUP:
        _detach_terminal()
    current = signal.getsignal(signal.SIGINT)
    if callable(current):
        current(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP act as Ctrl-C (main thread only)."""
    old = {sig: signal.signal(sig, _as_interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def run_stoppable(main: Coroutine[Any, Any, T]) -> T:
    """``main`` on a new event loop, as ``asyncio.run`` runs it, SIGTERM and SIGHUP acting as Ctrl-C
    (:func:`stop_signals_interrupt`); whatever ends it (its end, an error, a stop signal: then
    ``KeyboardInterrupt``, raised here), the loop is closed with further stop signals held off.
    Two signals close together (a process group's SIGTERM and its guard's, forwarded; Ctrl-C
    pressed twice) had interrupted the loop's own close half-way, and the loop, collected at
    exit, printed a traceback ("Invalid file descriptor: -1")."""
    runner = asyncio.Runner()
    try:
        with stop_signals_interrupt():
            return runner.run(main)
    finally:
        held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, *STOP_SIGNALS)}
        try:
            runner.close()
        finally:
            for sig, handler in held.items():
                signal.signal(sig, handler)
