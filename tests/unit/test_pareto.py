import itertools
import random

import pytest

from spoc_tui.core.tuning.pareto import dominates, hypervolume, pareto_indices

DIRS = ("max", "min")  # throughput up, latency down


def test_front_throughput_vs_latency():
    pts = [(100, 2.0), (200, 3.0), (150, 1.5), (90, 5.0), (200, 2.5)]
    assert pareto_indices(pts, DIRS) == [2, 4]


def test_hypervolume_simple_rectangles():
    # minimising both, reference (10, 10): one point (2, 3) dominates 8 x 7
    assert hypervolume([(2, 3)], ("min", "min"), (10, 10)) == pytest.approx(56)
    # two points: (2, 6) and (5, 3) -> 8*4 + 5*3 = 47
    assert hypervolume([(2, 6), (5, 3)], ("min", "min"), (10, 10)) == pytest.approx(47)
    # dominated and out-of-reference points add nothing
    assert hypervolume([(2, 6), (5, 3), (6, 7), (11, 1)], ("min", "min"), (10, 10)) == pytest.approx(47)


def test_hypervolume_against_a_grid_count():
    rng = random.Random(3)
    pts = [(rng.randint(0, 20), rng.randint(0, 20)) for _ in range(15)]
    ref = (20, 20)
    grid = sum(1 for x, y in itertools.product(range(20), range(20)) if any(px <= x and py <= y for px, py in pts))
    assert hypervolume(pts, ("min", "min"), ref) == pytest.approx(grid)


def test_max_direction_and_front_only_hv():
    pts = [(100, 2.0), (200, 3.0), (150, 1.5), (90, 5.0)]
    front = [pts[i] for i in pareto_indices(pts, DIRS)]
    assert hypervolume(pts, DIRS, (0, 10)) == pytest.approx(hypervolume(front, DIRS, (0, 10)))
    assert dominates((1, 1), (1, 2)) and not dominates((1, 1), (1, 1))
    with pytest.raises(ValueError):
        pareto_indices([(1, 2)], ("up", "min"))
