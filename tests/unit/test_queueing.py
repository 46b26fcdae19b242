import math

import pytest

from spoc_tui.core.hardware.queueing import erlang_c, queue_curve, saturation_users


def test_erlang_c_known_values():
    # textbook: c=2, a=1 -> P(wait) = 1/3; M/M/1: P(wait) = rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(1, 0.7) == pytest.approx(0.7)
    assert erlang_c(10, 8.0) == pytest.approx(0.4092, abs=1e-3)
    assert erlang_c(4, 4.0) == 1.0 and erlang_c(4, 0) == 0.0


def test_wait_explodes_near_saturation():
    pts = queue_curve([10, 50, 80, 86, 88, 120], seats=8, service_s=2.0, think_s=20.0)  # saturates at 88
    waits = [p.expected_wait_s for p in pts]
    assert waits == sorted(waits)
    assert waits[0] < 0.01 and waits[3] > 3 * waits[2] and math.isinf(waits[4]) and math.isinf(waits[5])
    assert saturation_users(8, 2.0, 20.0) == pytest.approx(88)
    assert pts[1].utilisation == pytest.approx(50 / 22 * 2 / 8)


def test_bad_inputs():
    with pytest.raises(ValueError):
        queue_curve([1], seats=0, service_s=1, think_s=1)
