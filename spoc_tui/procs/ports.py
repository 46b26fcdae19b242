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
