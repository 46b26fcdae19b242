"""Why latency explodes near saturation: an M/M/c view of a serving engine.

The engine has ``c`` seats (concurrent sequences: the smaller of ``max_num_seqs`` and what the
KV cache holds). Each user sends a request, waits for the answer (service time ``S``, the E2E
latency at light load) and thinks ``Z`` seconds, so it offers ``1 / (S + Z)`` requests per
second. With ``N`` users the arrival rate is ``N / (S + Z)``, the utilisation
``rho = lambda * S / c``, and the expected queueing wait follows Erlang's C formula. This open
M/M/c approximation of a closed system is a stated back-of-envelope: it ignores that decode
steps slow as the batch grows, so real waits start earlier than it says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits, for ``c`` servers and offered load ``a`` (Erlangs)."""
    if c < 1:
        raise ValueError("need at least one server")
    if a <= 0:
        return 0.0
    if a >= c:
        return 1.0
    # numerically stable recurrence for Erlang B, then B -> C
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    rho = a / c
    return b / (1 - rho + rho * b)


@dataclass(frozen=True, slots=True)
class QueuePoint:
    users: int
    arrival_rate: float
    utilisation: float
    p_wait: float
    expected_wait_s: float
    """math.inf at or past saturation."""


def queue_curve(users: Sequence[int], seats: int, service_s: float, think_s: float) -> list[QueuePoint]:
    """Utilisation and expected wait as users grow.

    Raises:
        ValueError: non-positive seats or service time, negative think time.
    """
    if seats < 1 or service_s <= 0 or think_s < 0:
        raise ValueError("seats and service time must be positive, think time at least 0")
    out = []
    for n in users:
        lam = n / (service_s + think_s)
        a = lam * service_s
        rho = a / seats
        if rho >= 1:
            out.append(QueuePoint(n, lam, rho, 1.0, math.inf))
            continue
        pw = erlang_c(seats, a)
        wait = pw / (seats / service_s - lam)
        out.append(QueuePoint(n, lam, rho, pw, wait))
    return out


def saturation_users(seats: int, service_s: float, think_s: float) -> float:
    """The user count at which utilisation reaches 1."""
    return seats * (service_s + think_s) / service_s
