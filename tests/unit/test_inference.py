"""The knee inferred across steps: the crossing of each limit's isotonic fit, its bootstrap
interval, the binding limit, cliffs and one-sided bounds."""

import math

import numpy as np
import pytest

from spoc_tui.core.ramp.inference import KneeEstimate, infer_knee, isotonic
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import RequestSample


def _step(level, n, ttft_median, seed, itl=0.01, fail=0.0):
    """n requests whose TTFT is lognormal around ``ttft_median`` (sigma 0.3)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ok = rng.random() >= fail
        t = float(ttft_median * math.exp(0.3 * rng.standard_normal()))
        out.append(
            RequestSample(
                start=float(i),
                step=1,
                users=int(level),
                ok=ok,
                ttft=t if ok else None,
                e2e=t + 1 if ok else None,
                itl=(itl,) * 10 if ok else (),
                output_tokens=11 if ok else None,
                end=i + 1.0,
            )
        )
    return out


def _median_at(x):
    return 0.02 * math.exp(x / 8)  # TTFT median rises smoothly with the level


def test_isotonic_pools_violators_by_weight():
    assert isotonic([1.0, 3.0, 2.0, 4.0], [1, 1, 1, 1]) == [1.0, 2.5, 2.5, 4.0]
    assert isotonic([5.0, 1.0], [3, 1]) == [4.0, 4.0]


def test_a_smooth_knee_is_found_between_levels_with_an_interval_that_holds_it():
    lims = parse_sla("ttft_p50<=200ms")
    true = 8 * math.log(0.2 / 0.02)  # where the median crosses 200 ms: 18.4
    levels = [(x, _step(x, 120, _median_at(x), seed=x)) for x in (4, 8, 16, 24, 32)]
    k = infer_knee(levels, lims)
    assert k is not None and k.boundary == "smooth" and k.binding_limit == "ttft_p50"
    assert k.ci95[0] is not None and k.ci95[1] is not None
    assert k.ci95[0] <= true <= k.ci95[1] and abs(k.estimate - true) < 3
    assert "binding ttft_p50" in k.text and k.levels == 5


def test_the_binding_limit_is_the_one_that_crosses_first():
    lims = parse_sla("ttft_p50<=1s,itl_p50<=5ms")
    levels = [(x, _step(x, 60, _median_at(x), seed=x, itl=0.002 * x)) for x in (1, 2, 4, 8)]
    k = infer_knee(levels, lims)
    assert k is not None and k.binding_limit == "itl_p50" and 2 <= k.estimate <= 4


def test_short_steps_still_contribute_their_point_estimates():
    """A p99 of 20 requests has no upper bound of its own, but the fit across levels uses it."""
    lims = parse_sla("ttft_p99<=400ms")
    levels = [(x, _step(x, 20, _median_at(x), seed=x)) for x in (2, 4, 8, 16, 32)]
    k = infer_knee(levels, lims)
    assert k is not None and k.boundary in ("smooth", "cliff") and 4 <= k.estimate <= 32


def test_bounds_when_no_level_or_every_level_broke_it():
    lims = parse_sla("ttft_p50<=10s")
    above = infer_knee([(x, _step(x, 40, 0.05, seed=x)) for x in (1, 2, 4)], lims)
    assert above == KneeEstimate(4.0, (4.0, None), None, "bound", "users", 3, above.replicates)
    assert above.text.startswith("more than 4 users")
    below = infer_knee([(x, _step(x, 40, 50.0, seed=x)) for x in (2, 4)], lims)
    assert below is not None and below.boundary == "bound" and below.ci95 == (None, 2.0)
    assert below.text.startswith("fewer than 2 users")


def test_a_jump_the_trend_does_not_explain_is_a_cliff_and_its_interval_the_bracket():
    lims = parse_sla("ttft_p50<=500ms")
    flat = [(x, _step(x, 100, 0.05 + 0.001 * x, seed=x)) for x in (2, 4, 8, 12)]
    k = infer_knee([*flat, (16, _step(16, 100, 5.0, seed=16))], lims)
    assert k is not None and k.boundary == "cliff" and k.ci95 == (12.0, 16.0) and k.estimate == 12.0


def test_errors_count_and_the_knee_reads_back_from_json():
    lims = parse_sla("error_rate<=5%")
    levels = [(x, _step(x, 400, 0.05, seed=x, fail=f)) for x, f in ((1, 0.0), (2, 0.03), (3, 0.06), (4, 0.09))]
    k = infer_knee(levels, lims)
    assert k is not None and k.binding_limit == "error_rate" and k.boundary == "smooth" and 2 < k.estimate < 4
    assert KneeEstimate.from_dict(k.as_dict(), "users") == k
    assert infer_knee([], lims) is None and infer_knee([(1, [])], lims) is None


def test_the_interval_covers_the_truth_in_most_seeds():
    lims = parse_sla("ttft_p90<=300ms")
    true = 8 * math.log(0.3 / (0.02 * math.exp(0.3 * 1.2816)))
    held = 0
    for seed in range(12):
        levels = [(x, _step(x, 80, _median_at(x), seed=100 * seed + x)) for x in (4, 8, 16, 24, 32)]
        k = infer_knee(levels, lims, replicates=150)
        assert k is not None and k.ci95[0] is not None and k.ci95[1] is not None
        held += k.ci95[0] <= true <= k.ci95[1]
    assert held >= 9, held


@pytest.mark.parametrize("unit", ["users", "req/s"])
def test_units_read_in_the_text(unit):
    k = KneeEstimate(2.5, (2.0, 3.0), "ttft_p99", "smooth", unit, 4, 200)
    assert k.text == f"2.5 {unit} (95 %: 2-3), binding ttft_p99"


def test_each_limits_fit_comes_with_its_band():
    """The curve the Load screen draws: the isotonic fit in seconds at every level run, inside
    its resampled band, rising with the load, and near each level's own median."""
    lims = parse_sla("ttft_p50<=200ms,itl_p50<=50ms")
    levels = [(x, _step(x, 120, _median_at(x), seed=x)) for x in (4, 8, 16, 24, 32)]
    k = infer_knee(levels, lims)
    assert k is not None and {c.limit for c in k.curves} == {"ttft_p50", "itl_p50"}
    c = k.curve("ttft_p50")
    assert c is not None and c.levels == (4, 8, 16, 24, 32)
    assert all(a <= b for a, b in zip(c.fitted, c.fitted[1:]))  # monotone
    for x, f, (lo, hi) in zip(c.levels, c.fitted, c.band):
        assert lo <= f <= hi and f == pytest.approx(_median_at(x), rel=0.2)
        assert hi - lo > 0  # 120 requests do not pin a median exactly
    assert c.at(16) == (c.fitted[2], *c.band[2]) and c.at(5) is None
    assert k.curve("itl_p50").fitted[0] == pytest.approx(0.01)
    # the curve rides along in memory only: ramp.json's knee is unchanged
    assert "curves" not in k.as_dict()
    assert KneeEstimate.from_dict(k.as_dict(), "users") == k  # (curves do not take part in equality)


def _tail_step(level, n, seed):
    """n requests: TTFT 50 ms, and 2 % of them (level / 10 % past 20 users) 1 s: the p99
    crosses 300 ms between 20 and 21 users (no earlier: 1 % of requests past it is allowed)."""
    rng = np.random.default_rng(seed)
    share = 0.005 if level <= 20 else 0.05
    out = []
    for i in range(n):
        t = 1.0 if rng.random() < share else 0.05
        out.append(RequestSample(start=float(i), step=1, users=level, ok=True, ttft=t, e2e=t + 1, end=i + 1.0))
    return out


def test_steps_too_short_for_a_p99_claim_no_end_their_requests_cannot_show():
    """50 requests cannot bound a p99: the slowest of 50 is no upper end of it. The interval's low
    end is a level the requests (pooled with the levels above it) show within the limit, or none."""
    lims = parse_sla("ttft_p99<=300ms")
    for seed in range(10):
        levels = [(x, _tail_step(x, 50, seed * 100 + x)) for x in (8, 16, 18, 19, 20, 22, 24)]
        k = infer_knee(levels, lims, replicates=100)
        assert k is not None
        assert k.ci95[0] is None or k.ci95[0] <= 20, (seed, k.ci95)


def test_enough_requests_bound_a_p99_knee_from_both_sides():
    lims = parse_sla("ttft_p99<=300ms")
    levels = [(x, _tail_step(x, 1500, x)) for x in (8, 16, 20, 24, 32)]
    k = infer_knee(levels, lims, replicates=100)
    assert k is not None and k.ci95[0] is not None and k.ci95[1] is not None
    assert k.ci95[0] <= 20 <= k.ci95[1] <= 24, k.ci95


def test_an_open_end_says_what_closes_it():
    k = KneeEstimate(31.4, (None, 34.0), "ttft_p99", "smooth")
    assert k.text.startswith("31.4 users (95 %: ?-34), binding ttft_p99; an open end")
    assert "--max-step-seconds" in k.text
    assert "open end" not in KneeEstimate(31.4, (30.0, 34.0), "ttft_p99", "smooth").text


def test_windows_of_one_level_that_disagree_widen_the_interval():
    """A level measured twice whose windows disagree (the server slowed between them) carries that
    disagreement into the interval; pooled as if every request were independent it was averaged
    away. Windows that agree keep the interval as it was."""
    lims = parse_sla("ttft_p50<=200ms")

    def levels(split: bool, drift: float) -> list:
        out = []
        for x in (8, 12, 16, 17, 18, 19, 20, 24):
            a = _step(x, 120, _median_at(x) / drift, seed=x)
            b = _step(x, 120, _median_at(x) * drift, seed=100 + x)
            out += [(x, a), (x, b)] if split else [(x, a + b)]
        return out

    def width(k):
        return k.ci95[1] - k.ci95[0]

    one, two = (infer_knee(levels(split, 1.5), lims, "req/s") for split in (False, True))
    assert one is not None and two is not None and one.estimate == two.estimate
    assert width(two) > 2 * width(one)
    same_one, same_two = (infer_knee(levels(split, 1.0), lims, "req/s") for split in (False, True))
    assert width(same_two) < 1.3 * width(same_one)


def test_a_runs_levels_laid_out_once_give_every_inference_the_same_knee():
    """The driver infers after each step over every step so far; its levels are laid out once
    (a Columns cache kept by the windows it pools) and each inference's knee is the one worked
    out from scratch, to the last bit, a level measured twice included."""
    from spoc_tui.core.ramp.inference import Columns

    lims = parse_sla("ttft_p99<=200ms,itl_p90<=12ms,e2e_p50<=2s,error_rate<=5%")
    windows = [(x, _step(x, 150, _median_at(x), seed=x, itl=0.001 * x, fail=0.02)) for x in (4, 8, 16, 24, 32)]
    windows.insert(3, (16, _step(16, 90, _median_at(16), seed=99, itl=0.016)))  # 16 measured twice
    kept = Columns()
    for n in range(1, len(windows) + 1):
        levels = windows[:n]
        fresh, cached = infer_knee(levels, lims, seed=3), infer_knee(levels, lims, seed=3, columns=kept)
        assert fresh == cached and (fresh is None or fresh.curves == cached.curves)


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_a_resampled_percentile_is_numpys_of_the_picked_requests_to_the_last_bit(q):
    """A scalar figure's percentile (TTFT, E2E) over a resample is read from its requests' values
    sorted once: the same float as gathering the picked requests' values (the failed ones left
    out) and calling np.percentile on them."""
    from spoc_tui.core.ramp.inference import _Column
    from spoc_tui.core.ramp.sla import Limit

    samples = _step(8, 400, 0.05, seed=4, fail=0.1)
    col = _Column(samples, Limit("ttft", {0.5: "p50", 0.9: "p90", 0.99: "p99"}[q], 1.0))
    values = np.array([np.nan if s.ttft is None else s.ttft for s in samples])
    rng = np.random.default_rng(0)
    for _ in range(200):
        idx = rng.integers(0, len(samples), rng.integers(1, 2 * len(samples)))
        picked = values[idx]
        picked = picked[~np.isnan(picked)]
        want = float(np.percentile(picked, q * 100)) if len(picked) else None
        assert col.figure(idx) == want


def test_a_knee_without_resamples_never_sorts_its_levels_and_reads_every_figure_as_the_resamples_would():
    """A draw's knee is inferred without resampling: its levels' figures over every request are
    read from the values as they are, never sorted (a crossing's draws spent a twentieth of their
    CPU sorting); each is the float the sorted values give for every request picked once, and an
    inference that resamples sorts them when it first needs them."""
    from spoc_tui.core.ramp.inference import Columns, _Column
    from spoc_tui.core.ramp.sla import Limit

    samples = _step(8, 400, 0.05, seed=4, fail=0.1, itl=0.01)
    every = np.arange(len(samples))
    for lim in (
        Limit("ttft", "p99", 1.0),
        Limit("itl", "p90", 1.0),
        Limit("itl", "mean", 1.0),
        Limit("e2e", "p50", 9.0),
    ):
        lazy, eager = _Column(samples, lim), _Column(samples, lim)
        assert lazy.figure(every, whole=True) == eager.figure(every) and lazy._ranked is None
    lims = parse_sla("ttft_p99<=200ms,itl_p90<=12ms")
    levels = [(x, _step(x, 150, _median_at(x), seed=x, itl=0.001 * x)) for x in (4, 8, 16)]
    kept = Columns()
    assert infer_knee(levels, lims, replicates=0, columns=kept) is not None
    columns = [col for _, by_key in kept._kept.values() for col, _ in by_key.values()]
    assert len(columns) == 6 and all(c._ranked is None for c in columns)
    assert infer_knee(levels, lims, seed=3, columns=kept) == infer_knee(levels, lims, seed=3)
    assert all(c._ranked is not None for c in columns)  # sorted once a resample needed them


def _fixed(level, ttft, n=200):
    """n requests whose TTFTs are all ``ttft`` (a figure known exactly)."""
    one = {"step": 1, "users": int(level), "ok": True, "ttft": ttft, "e2e": ttft + 1, "itl": (0.01,) * 10}
    return [RequestSample(start=float(i), output_tokens=11, end=i + 1.0, **one) for i in range(n)]


def test_a_run_read_at_one_level_crosses_where_the_other_runs_trend_moved_through_it_does():
    """A draw replayed once, at the fit's knee: the fit's margins (log of figure over limit) across
    its levels, moved up or down to pass through the draw's own margin there, cross 0 where the
    draw's knee is read. Figures exactly known: the fit's TTFT p99 doubles per level, 0.5 s at
    level 2 and 1 s at 3 (its crossing of 1 s at 3); the draw reads 1 s at 2.5, half a level's
    margin higher, so its line crosses at 2.5 exactly. Where it reads below every level's trend, or
    breaks a limit with no trend to place it by, it says nothing (its own levels then tell)."""
    from spoc_tui.core.ramp.inference import level_trend, shifted_knee

    limits = parse_sla("ttft_p99<=1s")
    fit = level_trend([(x, _fixed(x, 0.5 * 2 ** (x - 2))) for x in (1.0, 2.0, 3.0, 4.0)], limits)
    got = shifted_knee(fit, (2.5, _fixed(2.5, 1.0)), limits)
    assert got is not None and got[1] == "ttft_p99" and got[0] == pytest.approx(2.5), got
    # a draw as the fit itself is (its figure on the fit's line at 2.5): the fit's own crossing, 3
    got = shifted_knee(fit, (2.5, _fixed(2.5, 0.5 * 2**0.5)), limits)
    assert got is not None and got[0] == pytest.approx(3.0, abs=0.02), got
    # a slower draw: its crossing below the fit's lowest level cannot be read from one level
    assert shifted_knee(fit, (1.5, _fixed(1.5, 4.0)), limits) is None
    # a limit broken where the fit's trend never grows: nothing to place the crossing by
    flat = level_trend([(x, _fixed(x, 0.5)) for x in (1.0, 2.0, 3.0)], limits)
    assert shifted_knee(flat, (2.0, _fixed(2.0, 2.0)), limits) is None
    # met everywhere the shifted line runs: no crossing, nothing to say either
    assert shifted_knee(fit, (2.5, _fixed(2.5, 0.01)), limits) is None
    # the limit that crosses first binds
    two = parse_sla("ttft_p99<=1s,ttft_p50<=0.9s")
    levels = [(x, _fixed(x, 0.5 * 2 ** (x - 2))) for x in (1.0, 2.0, 3.0, 4.0)]
    got = shifted_knee(level_trend(levels, two), (2.5, _fixed(2.5, 1.0)), two)
    assert got is not None and got[1] == "ttft_p50" and got[0] < 2.5, got
