"""Run a server and stop it when the process that started it dies, even by SIGKILL.

``python -m spoc_tui.procs.guard PARENT_PID -- ARGV...``: the launcher starts this as the leader of
a new process group; the server runs as its child in the same group. Stopping the group stops
both. If PARENT_PID goes away (spoc-tui crashed or the SSH session dropped), the guard stops
the group itself, so a tuning study never leaves a server holding a GPU behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time


def remove_private_tmp() -> None:
    """Remove the private TMPDIR the launcher made for this server (its parent cannot any more)."""
    tmp = os.environ.get("TMPDIR", "")
    if os.path.basename(tmp.rstrip("/")).startswith(("spoc-server-", "spoc-sim-")):
        shutil.rmtree(tmp, ignore_errors=True)


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: python -m spoc_tui.procs.guard PARENT_PID -- ARGV...", file=sys.stderr)
        return 2
    parent, argv = int(args[0]), args[2:]
    try:
        child = subprocess.Popen(argv)
    except OSError as e:
        print(f"cannot run {argv[0]}: {e.strerror or e}", file=sys.stderr, flush=True)
        return 127

    def forward(sig: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    orphaned_at: float | None = None
    while True:
        try:
            rc = child.wait(1.0)
            if orphaned_at is not None:
                remove_private_tmp()
            return rc if rc >= 0 else 128 - rc
        except subprocess.TimeoutExpired:
            pass
        if orphaned_at is None and os.getppid() != parent:
            print(
                f"spoc guard: the process that started this server ({parent}) is gone; stopping the server",
                file=sys.stderr,
                flush=True,
            )
            orphaned_at = time.monotonic()
            child.send_signal(signal.SIGTERM)
        elif orphaned_at is not None and time.monotonic() - orphaned_at > 15:
            remove_private_tmp()
            os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
