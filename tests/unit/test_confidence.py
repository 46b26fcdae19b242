"""The intervals a step's figures carry (spoc_tui/core/confidence.py)."""

from __future__ import annotations

import numpy as np
import pytest

from spoc_tui.core.confidence import (
    Resampler,
    decide,
    min_samples_for_upper_bound,
    order_stat_ranks,
    proportion_interval,
    quantile_interval,
)


def test_order_statistic_ranks_match_the_binomial():
    assert order_stat_ranks(100, 0.5) == (40, 61)
    assert order_stat_ranks(1000, 0.99) == (983, 997)
    # the p99 of 367 samples has no upper bound at 95 %; of 368 it has
    assert order_stat_ranks(367, 0.99)[1] is None and order_stat_ranks(368, 0.99)[1] == 368
    assert min_samples_for_upper_bound(0.99) == 368 and min_samples_for_upper_bound(0.9) == 36
    assert order_stat_ranks(0, 0.5) == (None, None)


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_order_statistic_intervals_cover_the_true_quantile(q):
    """Distribution-free: at least 95 % coverage on a skewed distribution (400 trials)."""
    rng = np.random.default_rng(3)
    true = -np.log(1 - q)  # exponential(1)
    hits = 0
    for _ in range(400):
        lo, hi = quantile_interval(rng.exponential(1.0, size=600), q)
        hits += lo is not None and hi is not None and lo <= true <= hi
    assert hits / 400 >= 0.93


def test_clopper_pearson():
    assert proportion_interval(0, 40) == (0.0, pytest.approx(0.0881, abs=1e-4))
    lo, hi = proportion_interval(50, 100)
    assert lo == pytest.approx(0.3983, abs=1e-4) and hi == pytest.approx(0.6017, abs=1e-4)
    assert proportion_interval(0, 0) == (None, None)


def test_bootstrap_by_request_keeps_a_requests_gaps_together():
    """Gaps correlated within a request: the interval by request is wider than one that treats
    every gap as independent, and it covers the p99 of the generating process."""
    rng = np.random.default_rng(5)
    n_req, per = 200, 50
    speed = rng.lognormal(0.0, 0.5, size=n_req)  # each request has its own pace
    gaps = np.concatenate([rng.exponential(0.01 * s, size=per) for s in speed])
    owner = np.repeat(np.arange(n_req), per)
    by_request = Resampler.for_requests(n_req, 1).pooled_quantiles(gaps, owner, [0.99])[0]
    naive = Resampler.for_requests(gaps.size, 1).pooled_quantiles(gaps, np.arange(gaps.size), [0.99])[0]
    assert (by_request[1] - by_request[0]) > 1.5 * (naive[1] - naive[0])
    truth = np.quantile(
        np.concatenate([rng.exponential(0.01 * s, size=per) for s in rng.lognormal(0.0, 0.5, size=20000)]), 0.99
    )
    assert by_request[0] <= truth <= by_request[1]


def test_decide():
    assert decide(0.5, (0.4, 0.6), 1.0) == "meets"
    assert decide(1.5, (1.2, 1.8), 1.0) == "breaks"
    assert decide(0.9, (0.8, 1.1), 1.0) == "inconclusive"
    assert decide(0.5, (0.4, None), 1.0) == "inconclusive"  # no upper bound: cannot say it meets
    assert decide(None, (None, None), 1.0) == "inconclusive"


def test_widened_intervals_of_non_negative_figures_stay_non_negative():
    """Few requests (7) and a skewed latency: stretching the bootstrap interval about its median
    once gave a TTFT p50 interval of [-103.5ms, 176ms]."""
    from spoc_tui.core.confidence import Resampler

    values = [0.02, 0.03, 0.16, 0.17, 0.17, 0.18, 0.18]
    rs = Resampler.for_blocks(list(range(len(values))), seed=1)
    lo, hi = rs.pooled_quantiles(values, list(range(len(values))), [0.5])[0]
    assert lo is not None and hi is not None and 0.0 <= lo <= hi


def test_students_quantile_is_exact_where_the_expansion_falls_short():
    """Cornish-Fisher read 9.7 and 4.17 at 1 and 2 degrees of freedom (a step of three users'
    interval 3 % too narrow); the closed forms there, the expansion within 1 % from 3 up."""
    import math

    from spoc_tui.core.confidence import t_quantile

    assert t_quantile(1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-12)
    assert t_quantile(2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), rel=1e-12)
    for df, exact in ((3, 3.182446), (5, 2.570582), (10, 2.228139), (30, 2.042272)):
        assert t_quantile(df) == pytest.approx(exact, rel=0.01), df


def _pooled_quantiles_every_value(rs, values, owner, qs):
    """The replicates' quantiles from cumulative weights over every value (how pooled_quantiles
    worked until issue 73): its windowed, whole-number form must read the same values."""
    import numpy as np

    order = np.argsort(np.asarray(values, dtype=float), kind="stable")
    xs, own = np.asarray(values, dtype=float)[order], np.asarray(owner, dtype=int)[order]
    est = np.full((len(qs), rs.weights.shape[0]), np.nan)
    for r, c in enumerate(np.cumsum(rs.weights[:, own].astype(np.float32), axis=1)):
        if c[-1] > 0:
            est[:, r] = xs[np.minimum(np.searchsorted(c, np.asarray(qs) * c[-1], side="left"), xs.size - 1)]
    return [rs.interval(e) for e in est]


def test_pooled_quantiles_read_the_same_replicates_as_summing_every_value():
    import numpy as np

    from spoc_tui.core.confidence import Resampler

    rng = np.random.default_rng(1)
    for trial in range(60):
        n_req = int(rng.integers(1, 300))
        lens = rng.integers(0, 200 if trial % 3 else 3, n_req)
        values = np.round(rng.lognormal(-3, 0.7, int(lens.sum())), 4).tolist()
        owner = np.repeat(np.arange(n_req), lens).tolist()
        # blocks of time (searched block by block) and requests each their own unit (summed)
        blocks = rng.integers(0, max(1, n_req // 5), n_req).tolist()
        rs = Resampler.for_blocks(blocks, seed=trial) if trial % 2 else Resampler.for_requests(n_req, seed=trial)
        qs = [0.5, 0.9, 0.95, 0.99]
        want = _pooled_quantiles_every_value(rs, values, owner, qs) if values else [(None, None)] * 4
        assert rs.pooled_quantiles(values, owner, qs) == want


def test_a_pooled_percentile_is_numpys_of_the_gathered_values():
    import numpy as np

    from spoc_tui.core.confidence import PooledPercentile

    rng = np.random.default_rng(3)
    for trial in range(300):
        n_req = int(rng.integers(1, 60))
        lens = rng.integers(0, 3 if trial % 7 == 0 else 40, n_req)
        values = np.round(rng.lognormal(-3, 0.8, int(lens.sum())), int(rng.integers(2, 6)))
        ranked = PooledPercentile(values, np.repeat(np.arange(n_req), lens))
        starts = np.concatenate(([0], np.cumsum(lens)[:-1]))
        idx = rng.integers(0, n_req, n_req)
        picked = np.concatenate([values[starts[i] : starts[i] + lens[i]] for i in idx])
        if not picked.size:
            continue
        for pct in (0.0, 50.0, 90.0, 99.0, 99.9, 100.0):
            counts = np.bincount(idx, minlength=n_req)
            assert ranked.percentile(counts, picked.size, pct) == float(np.percentile(picked, pct))
