"""The noise-aware front: pooling runs, confirmed / provisional / candidate, the re-run policy."""

from __future__ import annotations

import math
import random

import pytest

from spoc_tui.core.tuning.noisyfront import Run, classify, dominated_by_front, pick_rerun, pool, run_to_run_cv, widen

DIRS = ["max", "min"]  # tokens/s up, latency down


def run(tok, lat, rel=0.05):
    return Run((tok, lat), ((tok * (1 - rel), tok * (1 + rel)), (lat * (1 - rel), lat * (1 + rel))))


def test_one_run_keeps_its_interval_and_missing_sides_mirror():
    e = pool("a", [Run((100.0, 1.0), ((90.0, 110.0), (None, 1.2)))])
    assert e.values == (100.0, 1.0) and e.lo == (90.0, pytest.approx(0.8)) and e.hi == (110.0, 1.2) and e.runs == 1


def test_pooled_runs_take_the_larger_of_within_and_between_run_variance():
    tight = pool("a", [run(100, 1.0, 0.01), run(100, 1.0, 0.01)])
    assert tight.values == (100, 1.0) and tight.hi[0] - tight.lo[0] == pytest.approx(2 / math.sqrt(2), rel=1e-6)
    # runs that disagree far more than their own intervals say: the spread between them rules
    apart = pool("a", [run(80, 1.0, 0.01), run(120, 1.0, 0.01)])
    assert apart.values[0] == 100 and apart.lo[0] < 80 + 1 and apart.hi[0] > 120 - 1
    assert apart.spread[0] == pytest.approx(math.sqrt(800) / 100)


def test_pooled_interval_covers_the_truth_about_95_percent():
    rng = random.Random(1)
    hits = 0
    for _ in range(2000):
        runs = []
        for _ in range(3):
            v = rng.gauss(100, 10)  # a run's value is off by N(0, 10); its own interval says so
            runs.append(Run((v, 1.0), ((v - 19.6, v + 19.6), (0.9, 1.1))))
        e = pool("a", runs)
        hits += e.lo[0] <= 100 <= e.hi[0]
    assert 0.93 <= hits / 2000 <= 0.99


def test_classify_confirmed_provisional_candidate_dominated():
    es = [
        pool("fast", [run(1000, 0.100)]),
        pool("lean", [run(500, 0.020)]),
        pool("close", [run(990, 0.101)]),  # off the front by a hair: overlaps "fast"
        pool("bad", [run(300, 0.200)]),  # surely dominated by "lean"
    ]
    by = {e.key: e for e in classify(es, DIRS)}
    assert by["fast"].status == "provisional" and by["fast"].over == ["close"]
    assert by["lean"].status == "confirmed"
    assert by["close"].status == "candidate"
    assert by["bad"].status == "dominated"


def test_rerun_policy_fewest_runs_then_provisional_then_widest():
    es = classify(
        [
            pool("fast", [run(1000, 0.100), run(1000, 0.100)]),
            pool("close", [run(990, 0.101, 0.08)]),
            pool("lean", [run(500, 0.020)]),
        ],
        DIRS,
    )
    assert pick_rerun(es, DIRS).key == "close"  # one run beats two
    settled = classify([pool("lean", [run(500, 0.020)]), pool("bad", [run(300, 0.2)])], DIRS)
    assert pick_rerun(settled, DIRS) is None
    capped = classify([pool("a", [run(1000, 0.1)] * 4), pool("b", [run(990, 0.101)] * 4)], DIRS)
    assert pick_rerun(capped, DIRS) is None  # at most 4 runs each


def test_early_stop_only_against_confirmed_members():
    es = classify([pool("lean", [run(500, 0.020)]), pool("fast", [run(1000, 0.1)])], DIRS)
    # a partial measurement whose whole box lies below and right of "lean": dominated
    assert dominated_by_front((300, 0.03), (400, 0.05), es, DIRS).key == "lean"
    # one that could still beat it somewhere: not stopped
    assert dominated_by_front((300, 0.01), (520, 0.05), es, DIRS) is None


def test_run_to_run_noise_is_pooled_over_repeated_configurations_as_an_upper_bound():
    # two configurations, each run twice, 10 % apart around their means; one run alone says nothing
    groups = [[run(90, 1.0, 0.01), run(110, 1.0, 0.01)], [run(180, 2.0, 0.01), run(220, 2.0, 0.01)], [run(50, 3.0)]]
    cv = run_to_run_cv(groups)
    assert cv is not None
    point = math.sqrt((0.01 + 0.01 + 0.01 + 0.01) / 2)  # squared relative deviations over 2 degrees of freedom
    assert cv[0] == pytest.approx(point / math.sqrt(0.210721 / 2), rel=1e-6)  # chi-square 10 % quantile, 2 dof
    assert cv[1] == 0.0
    assert run_to_run_cv([[run(1, 1)], [run(2, 2)]]) is None
    # many degrees of freedom: the bound approaches the estimate
    rng = random.Random(0)
    many = [[run(100 * (1 + 0.1 * rng.gauss(0, 1)), 1.0) for _ in range(4)] for _ in range(60)]
    big = run_to_run_cv(many)
    assert big is not None and 0.1 < big[0] < 0.12


def test_a_single_runs_interval_widens_to_the_measured_run_to_run_noise():
    e = pool("b", [run(100, 1.0, 0.01)])  # its own interval claims 1 %
    widen(e, (0.10, 0.0))
    assert e.lo[0] == pytest.approx(100 - 1.959963984540054 * 10) and e.hi[0] == pytest.approx(100 + 19.6, rel=1e-3)
    assert (e.lo[1], e.hi[1]) == (0.99, 1.01)  # no noise measured there: its own interval stays
    assert e.values == (100, 1.0)
    pooled = widen(pool("c", [run(100, 1.0, 0.01)] * 4), (0.10, 0.0))  # four runs: half as wide
    assert pooled.hi[0] - pooled.values[0] == pytest.approx(1.959963984540054 * 10 / 2)
