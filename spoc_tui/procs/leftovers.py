"""Servers a killed study left running: found through their marker file and stopped.

:class:`~spoc_tui.procs.server.ServerProcess` writes a marker (``server.json``) naming the
guard's process group while a server runs and removes it when the server stops. A marker that
outlives its study names a group that may still hold a GPU.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from pathlib import Path
from typing import Any

from spoc_tui.core.errors import SpocError
from spoc_tui.procs.group import group_alive, kill_group, owner_alive
from spoc_tui.procs.server import GUARD_MODULE

logger = logging.getLogger(__name__)


def marker_info(path: Path) -> dict[str, Any] | None:
    """The marker's content, or None when there is none (or it is not JSON)."""
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def is_guard(pid: int) -> bool:
    """The process is still our guard (not a later process that got the same pid)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return GUARD_MODULE.encode() in f.read()
    except OSError:
        return False


class StudyRunning(SpocError):
    """The study whose marker this is still runs: it must not be disturbed."""


def stop_leftover(path: Path) -> str | None:
    """Stop a server a killed study left running (its marker file names the process group);
    returns what was done, or None when nothing was running.

    Raises:
        StudyRunning: the marker's owner (the study that started the server) is still alive:
            its server is in use, not left over.
    """
    info = marker_info(path)
    if info is None:
        return None
    if owner_alive(info.get("owner")):
        raise StudyRunning(
            f"the study in {path.parent} is still running (pid {info.get('owner')}): "
            "stop it first (Ctrl-C), or use another --out"
        )
    pid = info.get("pid")
    msg = None
    if isinstance(pid, int) and group_alive(pid) and is_guard(pid) and kill_group(pid, signal.SIGTERM):
        for _ in range(100):
            if not group_alive(pid):
                break
            time.sleep(0.1)
        if group_alive(pid):
            kill_group(pid, signal.SIGKILL)
        msg = f"stopped a server left running by an interrupted study (pid {pid}, port {info.get('port')})"
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        logger.warning("cannot remove the marker %s: %s", path, e)
    return msg
