"""Start a model server (vLLM or the simulator) and always stop it.

The command runs without a shell, in its own process group, with a private TMPDIR (vLLM
leaves IPC socket files there) and its output in a log file. Ready means ``/health`` answers
200 while the process is still alive. Stopping sends SIGTERM to the whole group, then SIGKILL.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from spoc_tui.core.errors import SpocError
from spoc_tui.core.redact import redact_argv
from spoc_tui.procs.group import owner_stamp, stop_process_group
from spoc_tui.procs.ports import port_holder, port_in_use

logger = logging.getLogger(__name__)

LaunchKind = Literal["port", "exec", "exited", "timeout"]
""""port": something else serves the port; "exec": the command cannot run; "exited": the
server quit while starting; "timeout": not ready in time."""

GUARD_MODULE = "spoc_tui.procs.guard"


class LaunchError(SpocError, RuntimeError):
    """The server did not become ready; ``log_tail`` says why and ``kind`` how."""

    def __init__(self, message: str, log_tail: str = "", kind: LaunchKind = "exited") -> None:
        super().__init__(message)
        self.log_tail = log_tail
        self.kind: LaunchKind = kind


UNIX_SOCKET_PATH_MAX = 107
"""The longest path a Unix socket takes (``sockaddr_un.sun_path``, less its NUL)."""
IPC_NAME_LEN = 37
"""What vLLM appends to TMPDIR for each of its ZMQ IPC sockets: ``/`` and a UUID."""


def private_tmp_parent() -> str | None:
    """Where a server's private TMPDIR goes: the user's temporary folder, unless the folder's path
    is so long that vLLM's sockets in it would not fit a Unix socket path (vLLM then exits with
    "ipc path ... is longer than 107 characters"; a test run's TMPDIR did); /tmp then. None: the
    default."""
    base = tempfile.gettempdir()
    room = UNIX_SOCKET_PATH_MAX - IPC_NAME_LEN - len("/spoc-server-") - 8  # mkdtemp's 8 characters
    if len(base) <= room or not os.path.isdir("/tmp"):
        return None
    logger.info("TMPDIR %s is too long for a server's sockets: its private TMPDIR goes under /tmp", base)
    return "/tmp"


@dataclass
class ServerProcess:
    argv: Sequence[str]
    port: int
    log_path: Path | None = None
    """Where the server's output goes (None: a file in its private TMPDIR, gone when it stops)."""
    env: Mapping[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    proc: subprocess.Popen[bytes] | None = None
    tmpdir: str | None = None
    started_at: float | None = None
    guard: bool = False
    """Run through :mod:`spoc_tui.procs.guard`: the server stops if this process dies (SIGKILL included)."""
    tmp_prefix: str = "spoc-server-"
    """Prefix of the private TMPDIR (``spoc-server-`` or ``spoc-sim-``: the guard removes those)."""
    marker: Path | None = None
    """A JSON file naming the running server (pid = process group), removed when it stops:
    a study killed outright finds and stops its server on resume."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 300.0, poll: float = 0.5) -> float:
        """Start and wait until ready; returns the seconds it took.

        Raises:
            LaunchError: port already served, process exited, or not ready in time.
        """
        if port_in_use(self.port, self.host):
            holder = port_holder(self.port)
            by = f"by {holder}" if holder else "by another process"
            raise LaunchError(f"port {self.port} is already served {by}; refusing to start", kind="port")
        self.tmpdir = tempfile.mkdtemp(prefix=self.tmp_prefix, dir=private_tmp_parent())
        env = {**os.environ, **self.env, "TMPDIR": self.tmpdir}
        if self.log_path is None:
            self.log_path = Path(self.tmpdir) / "server.log"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.started_at = time.monotonic()
        try:
            argv = (
                [sys.executable, "-m", GUARD_MODULE, str(os.getpid()), "--", *self.argv]
                if self.guard
                else list(self.argv)
            )
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True
            )
        except OSError as e:
            log.close()
            self.cleanup_tmp()
            raise LaunchError(f"cannot run {self.argv[0]}: {e.strerror or e}", kind="exec") from None
        finally:
            if not log.closed:
                log.close()
        if self.marker is not None:
            self.marker.parent.mkdir(parents=True, exist_ok=True)
            doc = {
                "pid": self.proc.pid,
                "owner": owner_stamp(),
                "port": self.port,
                "argv": redact_argv(self.argv),
                "started_at": time.time(),
            }
            fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(doc))
        try:
            deadline = self.started_at + timeout
            while time.monotonic() < deadline:
                code = self.proc.poll()
                if code is not None:
                    tail = self.log_tail()
                    self.stop()
                    if code == 127 and self.guard and tail.startswith("cannot run"):
                        raise LaunchError(tail.splitlines()[0], tail, kind="exec")
                    raise LaunchError(f"server exited with code {code} before it was ready", tail)
                try:
                    if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                        return time.monotonic() - self.started_at
                except httpx.HTTPError:
                    pass
                time.sleep(poll)
            tail = self.log_tail()
            self.stop()
            raise LaunchError(f"server not ready after {timeout:.0f} s", tail, kind="timeout")
        except BaseException:
            # interrupted while it starts (Ctrl-C, SIGTERM made an exit, a test's timeout): a server
            # half started is stopped here, not left for its guard or never stopped at all
            self.stop()
            raise

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        if self.log_path is None:
            return ""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        """Stop the whole process group; safe to call twice."""
        if self.proc is not None:
            stop_process_group(self.proc, grace)
        if self.marker is not None:
            try:
                self.marker.unlink(missing_ok=True)
            except OSError as e:  # a marker we cannot remove is found and checked on resume
                logger.warning("cannot remove %s: %s", self.marker, e)
        self.cleanup_tmp()

    def cleanup_tmp(self) -> None:
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
