"""One writer per output folder: a ramp's ``--out`` and a study's folder.

The lock is an ``flock`` on a small file in the folder: the kernel drops it when the process
ends, however it ends (SIGKILL included), so a lock is never left stale, and taking it is atomic
(two ramps started in the same second cannot both win). The file also names its owner
(``pid:start``), for the message a second writer gets.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from spoc_tui.core.errors import EXIT_USAGE, SpocError
from spoc_tui.core.files import write_atomic
from spoc_tui.procs.group import owner_stamp


class FolderBusy(SpocError):
    """Another live process writes results into this folder."""

    def __init__(self, message: str, owner_pid: str) -> None:
        super().__init__(message, exit_code=EXIT_USAGE)
        self.owner_pid = owner_pid


_HELD: dict[str, list[int]] = {}
"""Locks this process holds: path -> [fd, holders]. One process may open the same folder twice (a
screen that reopens a study): only other processes are kept out, as before."""


class FolderLock:
    """Held from :meth:`acquire` until :meth:`release` (or the process's end)."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        """Raises: FolderBusy (another process holds it), OSError (the folder cannot be written)."""
        key = os.path.abspath(self.path)
        if key in _HELD:
            _HELD[key][1] += 1
            self._fd = _HELD[key][0]
            return self
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _read_owner(fd)
                os.close(fd)
                pid = owner.partition(":")[0] or "unknown"
                raise FolderBusy(
                    f"{self.path.parent} is in use by another {self.what} (pid {pid}): wait for it to end or "
                    "choose another --out",
                    pid,
                ) from None
            # the holder before us may have removed the file after we opened it: then ours is stale
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner_stamp().encode(), 0)
        self._fd = fd
        _HELD[key] = [fd, 1]
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        key = os.path.abspath(self.path)
        if key in _HELD:
            _HELD[key][1] -= 1
            if _HELD[key][1] > 0:
                return
            del _HELD[key]
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(fd)


def _read_owner(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode("ascii", "replace").strip()
    except OSError:
        return ""


def mark_interrupted(path: Path, reason: str) -> bool:
    """A result file (ramp.json, pareto.json) still saying ``"status": "running"`` after the
    process writing it died: rewritten atomically as ``interrupted`` with ``reason`` (every
    finished step it holds is kept). The load generator does this when it finds its parent gone,
    so even a SIGKILL leaves a final status. Returns whether the file was changed."""
    import json

    from spoc_tui.core.results import ResultError, schema_of

    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(doc, dict) or doc.get("status") != "running":
        return False
    try:
        schema_of(doc, str(path))
    except ResultError:
        return False  # a newer program's file: not ours to rewrite
    doc["status"] = "interrupted"
    doc["stop_reason"] = reason
    try:
        write_atomic(path, json.dumps(doc, indent=2, allow_nan=False))
    except (OSError, ValueError):
        return False
    return True
