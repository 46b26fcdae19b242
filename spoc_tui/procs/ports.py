"""Loopback ports."""

from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct free loopback ports (all held open while choosing, so no repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def free_block(n: int, tries: int = 200) -> int:
    """The first of ``n`` consecutive free loopback ports (``spoc sim --replicas`` takes
    ``port + i``); held together while checking.

    Raises:
        OSError: no such block found.
    """
    import random

    rng = random.Random()
    for _ in range(tries):
        base = rng.randrange(20000, 60000 - n)
        socks: list[socket.socket] = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise OSError(f"no {n} consecutive free ports on 127.0.0.1")


def port_holder(port: int) -> str | None:
    """Which process listens on TCP ``port`` (any address), as ``pid 1234 (vllm serve ...)``, read
    from /proc (Linux: the listening socket's inode, then the process holding it). None where it
    cannot tell: another OS, another user's process, or nobody listening."""
    import os
    from pathlib import Path

    from spoc_tui.core.redact import redact_argv

    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f[9])
    if not inodes:
        return None
    wanted = {f"socket:[{i}]" for i in inodes}
    for pid in (d for d in os.listdir("/proc") if d.isdigit()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    raw = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                    cmd = " ".join(redact_argv([a for a in raw.split("\0") if a]))  # never a key or a password
                    return f"pid {pid} ({cmd[:80] + '...' if len(cmd) > 80 else cmd})"
            except OSError:
                continue
    return None
