"""``--rate``'s arrival schedule (``load/defaults.PoissonArrivals``, the one each open-loop user
of the load generator draws from), on a clock the test owns: Poisson at the asked rate, on an
absolute schedule, restarted by a new rate. The live generator's sends against this schedule are
tests/e2e/test_ramp.py's (structure only); how late a loaded host sends is load_fidelity.py's."""

from __future__ import annotations

import random
import statistics

import pytest

from spoc_tui.load.defaults import PoissonArrivals


def gaps_cv(times: list[float]) -> tuple[float, float]:
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    mean = statistics.fmean(gaps)
    return mean, statistics.pstdev(gaps) / mean


def test_arrivals_are_poisson_at_the_asked_rate():
    a = PoissonArrivals(random.Random(7))
    times = [a.next(20.0, 0.0) for _ in range(20_000)]
    mean, cv = gaps_cv(times)
    # 20,000 gaps: the mean within 3 % of 1/20 s and the cv within 0.05 of 1 (each over 4 of its
    # spreads); a fixed pace reads a cv of 0, a closed loop well under 1
    assert mean == pytest.approx(1 / 20, rel=0.03) and cv == pytest.approx(1.0, abs=0.05)


def test_users_together_make_the_steps_rate_and_stay_poisson():
    """Four users at a quarter of the rate each: their arrivals merged are the step's rate, Poisson."""
    users = [PoissonArrivals(random.Random(k)) for k in range(4)]
    merged = sorted(t for u in users for t in (u.next(5.0, 0.0) for _ in range(5_000)))
    merged = [t for t in merged if t <= 900.0]  # where every user's schedule still runs
    mean, cv = gaps_cv(merged)
    assert mean == pytest.approx(1 / 20, rel=0.03) and cv == pytest.approx(1.0, abs=0.05)


def test_a_late_wake_up_does_not_lower_the_rate_and_a_new_rate_restarts_the_schedule():
    a = PoissonArrivals(random.Random(3))
    first = a.next(2.0, 100.0)
    # the sender woke 10 s late: the next arrival follows the last one's time, not the wake-up
    second = a.next(2.0, first + 10.0)
    assert first > 100.0 and 0.0 < second - first < 10.0
    late = [a.next(2.0, 1e6) for _ in range(200)]  # however late it woke, the schedule holds
    assert late[0] < 200.0 and statistics.fmean(b - x for x, b in zip(late, late[1:], strict=False)) < 1.0
    # a new rate (the next step) starts from now
    t = a.next(8.0, 500.0)
    assert 500.0 < t < 502.0
