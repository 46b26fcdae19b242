"""The step model learned from windows of a server's counters (issue 52): known coefficients are
recovered from synthetic windows with noise, inside their intervals; windows that do not vary
say so instead of a number; a calibrated twin is the prior and a server that moved from it is
named."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

import pytest

from spoc_tui.core.metrics.stats import LatencySummary
from spoc_tui.twin.lengths import Lengths
from spoc_tui.twin.model import StepModel
from spoc_tui.twin.passive import TERMS, PassiveWindow, fit_passive, running_seen, window_of

TRUE = StepModel(b0=0.012, b_prefill=2.0e-5, b_attn=0.0, b_decode=3.0e-4, b_context=8.0e-5, b_mixed=0.004,
                 a0=0.0, a_prompt=0.0)  # fmt: skip


def windows(
    n: int,
    users: tuple[int, int],
    noise: float = 0.03,
    seed: int = 1,
    model: StepModel = TRUE,
    context: tuple[float, float] = (0.6, 2.4),
):
    """``n`` windows of 30 s whose users wander between ``users`` and whose conversations'
    context (k-tokens a sequence) between ``context``, timed by ``model`` with multiplicative
    noise on each window's mean step, as a server measures them (:func:`measured`)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        d, seen = measured(rng.uniform(*users))
        ctx_per_seq = rng.uniform(*context)  # long and short conversations come and go
        c = d * ctx_per_seq
        p = rng.uniform(20, 200)
        m = min(1.0, rng.uniform(0.1, 0.7))
        step = (
            model.b0 + (model.b_decode + model.b_context * ctx_per_seq) * seen + model.b_prefill * p + model.b_mixed * m
        )
        out.append(
            PassiveWindow(
                t=30.0 * (i + 1),
                seconds=30.0,
                step_s=step * (1 + rng.gauss(0, noise)),
                gaps=30.0 / step * d,
                decodes=d,
                context_k=c,
                prefill=p,
                mixed=m,
            )
        )
    return out


def measured(running: float) -> tuple[float, float]:
    """What a window's counters and its gaps' mean see of a batch whose running count is Poisson
    of mean ``running`` (an open stream's requests in service): the engine steps only while one
    runs, so the steps' mean batch is the zero-truncated mean, and each step's gaps are as many as
    its decodes, so the gaps' mean weighs a step by its batch, E[D^2] / E[D], ``1 + running``."""
    lam = running
    return lam / -math.expm1(-lam), 1.0 + lam


def test_a_decodes_step_holds_more_than_the_steps_mean_batch():
    """The inter-token gaps' mean weighs each step by its decodes: at a few sequences it sees a
    batch a third above the steps' mean (the simulated A100 at 1.4-3.3 read 15-47 % above). The
    fit's regressors are the batch a gap sees, drawn here step by step."""
    from spoc_tui.twin.passive import batch_seen

    rng = random.Random(5)
    for lam in (0.5, 1.5, 3.0, 12.0):
        batches = []
        while len(batches) < 40_000:
            k, t = 0, rng.expovariate(1.0)
            while t < lam:  # a Poisson count of mean lam
                k, t = k + 1, t + rng.expovariate(1.0)
            if k:  # the engine steps only while one runs
                batches.append(k)
        mean, seen = statistics.fmean(batches), sum(b * b for b in batches) / sum(batches)
        assert batch_seen(mean) == pytest.approx(seen, rel=0.02), (lam, mean, seen)
        assert running_seen(mean) == pytest.approx(lam, rel=0.03)
    assert batch_seen(0.6) == 1.0 and running_seen(1.0) == 0.0


def test_varied_windows_recover_the_coefficients_and_their_intervals_hold_them():
    """Over 20 seeds of 40 windows each: the fixed, per-sequence and per-context terms within
    25 %, and their 95 % intervals hold the truth at least 17 times in 20 (a 95 % interval that
    held it 20 times in 20 at every seed would be wider than it says)."""
    held = dict.fromkeys(("b0", "b_decode", "b_context"), 0)
    for seed in range(20):
        fit = fit_passive(windows(40, (4, 48), seed=seed), seed=seed)
        assert fit.identified, fit.reason
        assert fit.reason.startswith("identified by the windows: 40 windows, batch")
        for term in held:
            lo, hi = fit.interval(term)
            held[term] += lo <= getattr(TRUE, term) <= hi
            assert getattr(fit.model, term) == pytest.approx(getattr(TRUE, term), rel=0.25), (seed, term)
    assert all(n >= 17 for n in held.values()), held


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_what_a_headroom_asks_is_close(seed):
    fit = fit_passive(windows(40, (4, 48), seed=seed), seed=seed)
    # what the headroom asks of it: the step at twice the busiest batch, within a few %
    d, c = 96, 96 * 1.5
    true_step = TRUE.b0 + TRUE.b_decode * d + TRUE.b_context * c
    assert fit.step_s(d, c) == pytest.approx(true_step, rel=0.05)
    assert fit.residual_pct < 5 and fit.windows == 40 and len(fit.draws) == 200
    # the terms windows cannot identify are the prior's, here none: 0
    assert fit.model.b_attn == fit.model.b_shared == fit.model.a0 == 0.0


def test_windows_that_do_not_vary_say_so_and_what_would_settle_it():
    flat = windows(30, (8, 11), seed=3, context=(1.4, 1.6))  # a constant few users of one profile
    fit = fit_passive(flat)
    assert not fit.identified
    assert fit.reason.startswith("not enough variety yet: 30 windows, batch 8-11"), fit.reason
    assert "calibrate: `spoc twin calibrate`" in fit.reason


def test_too_few_windows_or_none_are_not_a_fit():
    fit = fit_passive(windows(5, (4, 48)))
    assert not fit.identified and fit.reason.startswith("too little traffic yet: 5 windows"), fit.reason
    idle = fit_passive([])
    assert not idle.identified and idle.reason.startswith("too little traffic yet: no window") and idle.windows == 0


def test_a_calibrated_twin_is_the_prior_and_drift_is_named():
    sd = StepModel(*(0.05 * x for x in TRUE.vector()))
    flat = windows(30, (8, 11), seed=3, context=(1.4, 1.6))
    held = fit_passive(flat, prior=TRUE, prior_sd=sd)
    assert held.identified and "the windows and the calibrated twin" in held.reason, held.reason
    assert held.drift == ()
    # the server now decodes 60 % slower per sequence (a hotter GPU, a new build): named
    slower = replace(TRUE, b_decode=TRUE.b_decode * 1.6)
    moved = fit_passive(windows(40, (4, 48), seed=2, model=slower), prior=TRUE, prior_sd=sd)
    assert any(x.startswith("b_decode ") for x in moved.drift), moved.drift
    assert moved.model.b_decode == pytest.approx(slower.b_decode, rel=0.25)


def test_the_draws_carry_the_calibrated_twins_own_spread():
    """Over windows that barely vary, the terms they cannot tell apart are the prior's, and the
    draws spread them as the calibration did: drawn over the windows alone with the prior held
    at its value, every draw read the prior's b_decode to the digit, and the headroom's interval
    said the calibration was exact."""
    sd = StepModel(*(0.05 * x for x in TRUE.vector()))
    flat = windows(30, (8, 11), seed=3, context=(1.4, 1.6))
    fit = fit_passive(flat, prior=TRUE, prior_sd=sd)
    for term in ("b_decode", "b_context"):  # held at the prior: 0.2 and 0.09 of its spread
        spread = statistics.pstdev(getattr(d, term) for d in fit.draws)
        assert 0.6 * getattr(sd, term) < spread < 1.3 * getattr(sd, term), (term, spread)
    # the windows still hold what they see: every draw's step at their batch within a few per cent
    d, c = 9.5, 9.5 * 1.5
    steps = [m.b0 + m.b_decode * d + m.b_context * c for m in fit.draws]
    assert statistics.pstdev(steps) / statistics.fmean(steps) < 0.05


def test_a_window_comes_from_a_servers_windowed_view():
    from spoc_tui.core.metrics.promparse import parse_text
    from spoc_tui.core.metrics.vllm import ServerWindows, cache_config
    from tests.conftest import fixture_text

    idle = parse_text(fixture_text("vllm/vllm_0.32_cpu_full_idle.txt"))
    load = parse_text(fixture_text("vllm/vllm_0.32_cpu_full_load.txt"))
    w = ServerWindows(30.0)
    w.view("s", "s", 0.0, idle)
    view, _ = w.view("s", "s", 30.0, load)
    cc = cache_config(load)
    kv_tokens = int(cc["num_gpu_blocks"]) * int(cc["block_size"])
    win = window_of(view.total, 30.0, 30.0, kv_tokens)
    assert win is not None
    itl = view.total.latency["itl"]
    assert win.step_s == itl.mean and win.gaps == itl.count
    # the tokens generated less each request's first (its prefill made it): the share of the gaps
    # among the gaps and first tokens, here 144 first tokens beside their gaps
    ttft = view.total.latency["ttft"]
    share = itl.count / (itl.count + ttft.count)
    assert 0.9 < share < 1 and ttft.count == 144
    assert win.decodes == pytest.approx(view.total.generation_tokens_rate * share / view.total.steps_rate)
    assert 0 <= win.mixed <= 1 and win.context_k >= 0 and win.prefill >= 0
    assert win.prefill_row() is None  # not given the prefill histograms: no prefill row
    # the decode context: the gauge's mean over the window, or where the scrapes counted the running
    # requests, the share of the cache one held times the decodes a step
    assert win.context_k == pytest.approx(view.total.kv_cache_usage * kv_tokens / 1000)
    per = window_of(view.total, 30.0, 30.0, kv_tokens, 0.5, kv_per_running=0.01)
    assert per is not None and per.context_k == pytest.approx(0.01 * win.decodes * kv_tokens / 1000)
    assert per.context_at(3.0) == pytest.approx(0.01 * 3.0 * kv_tokens / 1000)
    # vLLM 0.32 reports each finished request's prefill time and the prompt tokens it computed
    from spoc_tui.core.metrics.vllm import PREFILL_TIME, REQUEST_PREFILL_COMPUTED, Scrape, windowed_histogram

    scrape = Scrape(load, 30.0, idle, 0.0)
    pt, comp = windowed_histogram(scrape, PREFILL_TIME), windowed_histogram(scrape, REQUEST_PREFILL_COMPUTED)
    # (128 requests finished in the window, 144 had their first token)
    assert pt is not None and comp is not None and pt.count == comp.count == 128
    timed = window_of(view.total, 30.0, 30.0, kv_tokens, None, pt, comp)
    assert timed is not None and timed.prefills == 128 and timed.prefill_s == pytest.approx(pt.mean())
    assert timed.prefill_tokens == pytest.approx(comp.mean()) and timed.prefill_tokens > 0
    # the step a prefill rode in: the running it found (fewer than the steps' mean, which counts
    # only steps), their context, its own prompt tokens and those that arrived with it
    lam = running_seen(timed.decodes)
    assert 0 < timed.decodes - lam < 1
    row = (1.0, lam, timed.context_k * lam / timed.decodes, timed.prefill_tokens + timed.prefill, 1.0)
    assert timed.prefill_row() == pytest.approx(row)
    # the tokens each request computed, as the histogram gives them: all of them in 20-50 here,
    # their mean the histogram's
    assert timed.computed is not None and timed.computed.edges == ((20.0, 50.0),) and win.computed is None
    assert timed.computed.mean() == pytest.approx(comp.mean(), rel=1e-6)
    assert timed.past_ridge(0.0) == 1.0 and 0 < timed.past_ridge(40.0 + timed.decodes) < timed.past_ridge(30.0) < 1
    # an idle window, or a server that hides its KV cache's size, is not a window
    assert window_of(view.total, 30.0, 30.0, None) is None
    quiet = replace(view.total, latency={**view.total.latency, "itl": LatencySummary("30s", 3, 0.01, None, None, None)})
    assert window_of(quiet, 30.0, 30.0, kv_tokens) is None
    assert set(TERMS) == {"b0", "b_decode", "b_context", "b_prefill", "b_mixed"}


def test_the_kv_caches_read_cost_is_the_context_terms_prior_where_the_server_reports_it():
    """Flat traffic barely moves the decode context, so the windows alone cannot see its cost (the
    fit held it at 0 and read a headroom 41 % high on the simulator). A server that reports a
    token's KV bytes and the bytes its steps read gives the term without load: bytes over the
    bandwidth its steps show. The prior leans high (a step's fixed cost counts as reading), its
    draws hold the truth, and the reason says what the number rests on."""
    bw, kvb, weights = 1.6e12, 131_072.0, 1.6e10  # a memory-bound decode: 10 ms of weights a step
    truth = StepModel(b0=weights / bw + 4e-4, b_prefill=2.0e-5, b_attn=0.0, b_decode=5e-5, b_context=kvb * 1000 / bw,
                      b_mixed=0.002, a0=0.0, a_prompt=0.0)  # fmt: skip
    for seed in (1, 2, 3):
        flat = [
            replace(w, read_bytes=weights + kvb * 1000 * w.context_k)
            for w in windows(30, (8, 11), seed=seed, context=(1.4, 1.6), model=truth)
        ]
        alone = fit_passive([replace(w, read_bytes=None) for w in flat], kv_bytes_per_token=kvb)
        assert alone.interval("b_context")[0] == 0.0  # the windows alone cannot tell it from nothing
        assert fit_passive(flat).model.b_context == alone.model.b_context  # no bytes told: no prior
        fit = fit_passive(flat, kv_bytes_per_token=kvb)
        assert truth.b_context * 0.9 <= fit.model.b_context <= truth.b_context * 1.5, seed
        lo, hi = fit.interval("b_context")
        assert lo <= truth.b_context <= hi and hi - lo > 0.5 * truth.b_context  # the prior's spread is in the draws
    quiet = [replace(w, read_bytes=weights + kvb * 1000 * w.context_k) for w in windows(30, (8, 11), seed=1,
             context=(1.4, 1.6), model=truth, noise=0.01)]  # fmt: skip
    fit = fit_passive(quiet, kv_bytes_per_token=kvb)
    assert fit.identified and "the windows and the KV cache's read cost (0.0" in fit.reason, fit.reason


def test_prefill_times_identify_the_prefill_terms_the_gaps_barely_see():
    """At a few requests a second a prefill rides in one step of dozens: the gaps' mean barely
    moves with its cost (a simulated L40S's fit put b_prefill at half its value in one seed of
    five). The server's prefill-time histogram gives each window a second row, the step a prompt
    rode in; with it the prefill term comes back, and its interval is narrower."""
    truth = replace(TRUE, b_prefill=7.0e-5, b_mixed=0.002)
    rng = random.Random(4)
    plain, timed = [], []
    for i in range(40):
        lam = rng.uniform(4, 40)
        d, seen = measured(lam)
        per_seq = rng.uniform(0.6, 2.4)
        c = d * per_seq
        rate = rng.uniform(0.7, 2.0)  # requests a second
        per_request = rng.uniform(400, 900)  # new prompt tokens each
        steps = 1.0 / (truth.b0 + truth.b_decode * d + truth.b_context * c)
        p, m = rate * per_request / steps, min(1.0, rate / steps)
        seq = truth.b_decode + truth.b_context * per_seq  # a sequence's decode cost
        step = truth.b0 + seq * seen + truth.b_prefill * p + truth.b_mixed * m
        n = rate * 30.0
        # the step a prompt rode in: the lam running it found, and the prompts that came with it
        rode = truth.b0 + seq * lam + truth.b_prefill * (per_request + p) + truth.b_mixed
        w = PassiveWindow(t=30.0 * (i + 1), seconds=30.0, step_s=step * (1 + rng.gauss(0, 0.03)),
                          gaps=30.0 / step * d, decodes=d, context_k=c, prefill=p, mixed=m)  # fmt: skip
        plain.append(w)
        # each prefill's time varies with its prompt (a third either way): the mean over n of them
        timed.append(replace(w, prefill_s=rode * (1 + rng.gauss(0, 0.3 / n**0.5)), prefills=n,
                             prefill_tokens=per_request))  # fmt: skip
    without, with_times = fit_passive(plain, seed=1), fit_passive(timed, seed=1)
    assert with_times.model.b_prefill == pytest.approx(truth.b_prefill, rel=0.15), with_times.model
    lo, hi = with_times.interval("b_prefill")
    assert lo <= truth.b_prefill <= hi
    lo0, hi0 = without.interval("b_prefill")
    assert hi - lo < 0.5 * (hi0 - lo0), ((lo, hi), (lo0, hi0))
    # the decode terms the gaps identify stay where they were
    assert with_times.model.b_decode == pytest.approx(truth.b_decode, rel=0.1)
    assert "their gaps and prefill times" in with_times.reason and "prefill times" not in without.reason
    # a window with too few prefills has no prefill row
    assert replace(timed[0], prefills=2).prefill_row() is None and timed[0].prefill_row() is not None


def test_a_gpus_roofline_puts_the_first_prompt_tokens_inside_the_steps_fixed_cost():
    """A GPU step reads every weight whatever it computes, so its first prompt tokens are free and
    each past the ridge costs more than a linear fit of the means says: the p99 gap comes from the
    big prefills past it (on the simulated L40S the linear fit timed 3,000-token prefill steps at
    half their time). With the requests' computed-token histogram, the fit takes the ridge at the
    roofline's fixed point (ridge = b0 / b_prefill) and recovers the marginal cost."""
    from spoc_tui.core.metrics.stats import Histogram

    bounds = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, float("inf"))
    b0, bp, bd, bc = 0.022, 7.2e-5, 3.0e-5, 1.6e-4
    ridge = b0 / bp  # about 306 tokens
    rng = random.Random(7)
    wins = []
    for i in range(40):
        d = rng.uniform(2, 12)
        c = d * rng.uniform(0.6, 2.4)
        rate = rng.uniform(0.7, 2.0)
        base = b0 + bd * d + bc * c
        steps = 30.0 / base
        prompts = [min(9000.0, rng.lognormvariate(math.log(450), 0.8)) for _ in range(int(rate * 30))]
        times = [base + bp * max(0.0, n - (ridge - d)) for n in prompts]  # the steps a prefill rode in
        step_mean = ((steps - len(prompts)) * base + sum(times)) / steps
        counts = tuple(float(sum(n <= b for n in prompts)) for b in bounds)
        hist = Histogram(bounds, counts, float(len(prompts)), sum(prompts))
        wins.append(PassiveWindow(t=30.0 * (i + 1), seconds=30.0, step_s=step_mean * (1 + rng.gauss(0, 0.01)),
                                  gaps=steps * d, decodes=d, context_k=c, prefill=sum(prompts) / steps,
                                  mixed=len(prompts) / steps, prefill_s=sum(times) / len(times),
                                  prefills=len(times), prefill_tokens=hist.mean(), computed=Lengths.of(hist)))  # fmt: skip
    fit = fit_passive(wins, seed=2)
    assert fit.model.ridge == pytest.approx(ridge, rel=0.2), fit.model
    assert fit.model.b_prefill == pytest.approx(bp, rel=0.15), fit.model
    assert "a GPU's roofline" in fit.reason and fit.identified, fit.reason
    assert fit.model.ridge_moves and all(d.ridge_moves for d in fit.draws)
    # the big prefills the p99 gap comes from: a 3,000-token prefill step within 10 %
    big = b0 + bp * (3000 - (ridge - 8))
    m = fit.model
    got = m.b0 + m.b_prefill * max(0.0, 3000 - (m.ridge - 8))
    assert got == pytest.approx(big, rel=0.1), (got, big)
    # without the histogram: the linear fit of the means, no ridge, and the big step read short
    linear = fit_passive([replace(w, computed=None) for w in wins], seed=2)
    assert linear.model.ridge == 0 and "roofline" not in linear.reason
    assert linear.model.b0 + linear.model.b_prefill * 3000 < 0.85 * big
    # a calibrated twin's ridge where one is given, fixed as the calibration fitted it
    prior = replace(TRUE, ridge=128.0)
    sd = StepModel(*(0.05 * x for x in TRUE.vector()))
    held = fit_passive(wins, prior=prior, prior_sd=sd).model
    assert held.ridge == 128.0 and not held.ridge_moves


def test_a_steps_context_read_hides_as_much_prompt_compute_where_the_ridge_moves():
    """A GPU step takes the longer of its reads (weights, then the decodes' KV cache) and its
    compute: while the decodes' context is read, that many more prompt tokens are computed free.
    Added instead, a big prefill beside a long context was timed for both (the simulated A100's
    prefill steps 7-12 % slow)."""
    m = StepModel(b0=0.01, b_prefill=1e-4, b_attn=0.0, b_decode=0.0, b_context=1e-4, b_mixed=0.0,
                  a0=0.0, a_prompt=0.0, ridge=100.0, ridge_moves=True)  # fmt: skip
    decodes = [1000] * 20  # 20 k-tokens of context: 2 ms of reading
    read = m.b0 + m.b_context * 20
    for prompt in (50, 200, 500, 2000):
        compute = m.b_prefill * (prompt + len(decodes))
        assert m.step_s(decodes, [(prompt, 0)]) == pytest.approx(max(read, compute))
    assert m.moved_ridge(20.0) == pytest.approx(120.0)
    fixed = replace(m, ridge_moves=False)  # a calibrated twin's: the context's read added
    assert fixed.step_s(decodes, [(500, 0)]) == pytest.approx(max(read, m.b_prefill * 520) + 0.002)
    # a step with no prompt, or one on a CPU (no ridge), is as before
    assert m.step_s(decodes, []) == fixed.step_s(decodes, []) == pytest.approx(read)
    cpu = replace(m, ridge=0.0, ridge_moves=False)
    assert cpu.step_s(decodes, [(500, 0)]) == pytest.approx(read + m.b_prefill * 500)
    # as twin.json keeps a fit (asdict), read back; a file without the key: a calibrated twin's
    from dataclasses import asdict

    from spoc_tui.twin.model import TWIN_SCHEMA, _model

    assert _model(asdict(m), TWIN_SCHEMA) == m
    assert _model({k: v for k, v in asdict(m).items() if k != "ridge_moves"}, TWIN_SCHEMA) == fixed
