"""The twin's step-time fit on synthetic step times, its file, and its engine."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spoc_tui.core.ramp.knee import parse_user_plan
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.twin.engine import TwinEngine
from spoc_tui.twin.fit import Observation, fit_step_model, nnls
from spoc_tui.twin.model import (
    PARAMS,
    ServerConfig,
    StepModel,
    Twin,
    TwinError,
    design_row,
    read_twin,
    shared_context,
    step_features,
    write_twin,
)
from spoc_tui.twin.predict import Prediction, predict, predict_at
from spoc_tui.workload import load_workload

TRUE = StepModel(0.004, 2e-5, 3e-3, 4e-4, 1.5e-3, 0.001, 0.003, 0.0005, 6e-4)
SERVER = ServerConfig("tiny", 2048, 16, 4096, True, 0.9, 64, 2048, True, {"block_size": "reported"})


def synthetic(model: StepModel, noise: float, seed: int = 1) -> list[Observation]:
    """The probes calibrate runs, timed by ``model`` with multiplicative noise."""
    rng = random.Random(seed)
    obs: list[Observation] = []
    p = 0

    def y(v: float) -> float:
        return v * (1 + rng.gauss(0, noise))

    for rep in range(3):
        for n in (16, 64, 256, 1024, 1500):
            p += 1
            f = step_features([], [(n, 0)])
            each = ((1.0, float(n), 0.0),)
            obs.append(
                Observation(
                    "prefill", p, design_row(f, 1.0, n / 1e3), y(model.step_s([], [(n, 0)]) + model.outside_s(n)), each
                )
            )
            obs.append(Observation("server_prefill", p, design_row(f), y(model.step_s([], [(n, 0)])), each))
        for b in (1, 2, 4, 8, 16):
            for c in (32, 800):
                p += 1
                for k in (10, 30):
                    ctx = [c + k] * b
                    obs.append(Observation("decode", p, design_row(step_features(ctx, [])), y(model.step_s(ctx, []))))
        for b in (4, 8, 16):  # the shared-prefix probe: 3/4 of an 800-token prompt in common
            p += 1
            for k in (10, 30):
                ctx, again = [800 + k] * b, 600 * (b - 1)
                obs.append(
                    Observation(
                        "shared", p, design_row(step_features(ctx, []), shared=again), y(model.step_s(ctx, [], again))
                    )
                )
        for n in (128, 512):
            p += 1
            ctx = [100 + rep] * 4
            obs.append(
                Observation(
                    "mixed",
                    p,
                    design_row(step_features(ctx, [(n, 0)])),
                    y(model.step_s(ctx, [(n, 0)])),
                    ((1.0, float(n), 4.0),),
                )
            )
    return obs


def test_nnls_matches_least_squares_when_the_solution_is_positive_and_clips_otherwise():
    rng = np.random.default_rng(0)
    a = rng.random((30, 4))
    x = np.array([1.0, 2.0, 0.5, 3.0])
    assert np.allclose(nnls(a, a @ x), x, atol=1e-8)
    x_neg = np.array([1.0, -2.0, 0.5, 3.0])
    got = nnls(a, a @ x_neg)
    assert (got >= 0).all() and got[1] == 0.0


def test_the_fit_recovers_known_coefficients_within_their_intervals():
    fit, sd, draws, residuals, notes = fit_step_model(synthetic(TRUE, 0.02))
    for k in ("b0", "b_prefill", "b_decode", "b_context", "a0", "b_shared"):
        true, got, spread = getattr(TRUE, k), getattr(fit, k), getattr(sd, k)
        assert abs(got - true) / true < 0.1, k
        assert abs(got - true) <= 4 * spread + 1e-12, k
    assert len(draws) == 32 and notes == []
    assert {r.kind for r in residuals} == {"prefill", "server_prefill", "decode", "shared", "mixed"}
    assert all(r.median_abs_pct < 5 for r in residuals)


def test_the_fit_finds_the_roofline_ridge_and_none_where_there_is_none():
    """A GPU computes a step's first prompt tokens inside the time it reads the weights: a prefill
    of 16 tokens costs what one of 100 does. The fit finds that ridge (and a CPU's 0), and the
    prefill times of 100-300 tokens come out right; without it a linear fit missed them by 20 %."""
    from dataclasses import replace

    from spoc_tui.twin.model import RIDGES

    gpu = replace(TRUE, b0=0.012, b_prefill=8e-5, b_attn=0.0, ridge=128.0)
    fit, sd, draws, residuals, _ = fit_step_model(synthetic(gpu, 0.02))
    assert fit.ridge in RIDGES and 96 <= fit.ridge <= 160, fit.ridge
    assert all(r.median_abs_pct < 5 for r in residuals), residuals
    for n in (100, 200, 300):
        assert fit.step_s([], [(n, 0)]) == pytest.approx(gpu.step_s([], [(n, 0)]), rel=0.08), n
    assert sd.ridge < 64 and {d.ridge for d in draws} <= set(RIDGES)
    cpu, *_ = fit_step_model(synthetic(TRUE, 0.02))
    assert cpu.ridge == 0.0


def test_the_fit_finds_no_shared_prefix_saving_where_there_is_none():
    """Steps that read a shared prefix's KV as often as any other context (b_shared 0), timed with
    2 % noise: the fit keeps no saving worth a tenth of the context's cost, whatever the noise's
    draw. (20 seeds read at most 3 %. The e2e twin test on the live simulator cannot judge this:
    there a step's context costs about 2 % of it, under the timing noise.)"""
    from dataclasses import replace

    for seed in range(1, 6):
        fit, *_ = fit_step_model(synthetic(replace(TRUE, b_shared=0.0), 0.02, seed=seed))
        assert fit.b_shared <= 0.1 * fit.b_context, (seed, fit)


def test_noise_widens_the_spread():
    _, quiet, *_ = fit_step_model(synthetic(TRUE, 0.01))
    _, noisy, *_ = fit_step_model(synthetic(TRUE, 0.08))
    assert noisy.b_decode > 2 * quiet.b_decode


def test_an_unexercised_coefficient_is_held_at_zero_and_said():
    obs = [o for o in synthetic(TRUE, 0.02) if o.kind != "mixed"]
    fit, _, _, _, notes = fit_step_model(obs)
    assert fit.b_mixed == 0.0 and any("b_mixed not measured" in n for n in notes)


def test_too_few_probes_are_refused():
    with pytest.raises(TwinError, match="decodes and prefills"):
        fit_step_model([o for o in synthetic(TRUE, 0.02) if o.kind == "decode"])


def twin(step_cv: float = 0.0) -> Twin:
    rng = random.Random(0)
    draws = tuple(StepModel(*(x * (1 + rng.gauss(0, 0.05)) for x in TRUE.vector())) for _ in range(8))
    return Twin(TRUE, StepModel(*(0.05 * x for x in TRUE.vector())), draws, step_cv, SERVER, calibrated_at=1.0)


def test_twin_json_round_trips_and_refuses_what_it_cannot_read(tmp_path):
    path = tmp_path / "twin.json"
    write_twin(twin(0.1), path)
    back = read_twin(path)
    assert back.fit == TRUE and back.server == SERVER and len(back.draws) == 8 and back.step_cv == 0.1
    doc = json.loads(path.read_text())
    assert doc["schema"] == 3 and doc["kind"] == "spoc-twin" and len(doc["draws"][0]) == 10
    doc["schema"] = 99
    path.write_text(json.dumps(doc))
    with pytest.raises(TwinError, match="newer spoc-tui"):
        read_twin(path)
    path.write_text('{"kind": "spoc-twin", "schema": 1, "fit": {}}')
    with pytest.raises(TwinError, match="does not read"):
        read_twin(path)
    path.write_text("[1]")
    with pytest.raises(TwinError, match="not a twin"):
        read_twin(path)
    write_twin(twin(0.1), path)
    doc = json.loads(path.read_text())
    doc["notes"] = True  # notes of another shape: none, not a TypeError
    path.write_text(json.dumps(doc))
    assert read_twin(path).notes == ()
    with pytest.raises(TwinError, match="no such file"):
        read_twin(tmp_path / "missing.json")


def test_the_engine_times_steps_by_the_fit_and_keeps_the_servers_kv_blocks():
    eng = TwinEngine(twin(), jitter=False)
    assert eng.num_blocks == 4096 and eng.max_len == 2048 and eng.cfg.max_num_seqs == 64
    assert eng.outside_s(1000) == pytest.approx(TRUE.a0 + TRUE.a_prompt)
    what_if = TwinEngine(twin(), flags={"max_num_seqs": 8, "gpu_memory_utilization": 0.45}, jitter=False)
    assert what_if.cfg.max_num_seqs == 8 and what_if.num_blocks == 2048


def test_a_predicted_ramp_rises_with_load_and_its_intervals_hold_the_figures():
    p = Prediction(
        twin=twin(0.05),
        workload=load_workload("chatbot"),
        plan=parse_user_plan("1,8,32"),
        limits=tuple(parse_sla("ttft_p99<=2s,itl_p99<=100ms")),
        step_s=30,
        warmup_s=5,
        max_step_s=30,
        draws=3,
    )
    res = predict(p)
    assert [r.step.users for r in res.runs] == [1, 8, 32]
    itl = [r.step.latency.itl.p50 for r in res.runs]
    assert itl[0] < itl[-1]
    for r, iv in zip(res.runs, res.intervals, strict=True):
        lo, hi = iv["itl_p50"]
        assert lo <= r.step.latency.itl.p50 <= hi
    first, last = res.runs[0].engine, res.runs[-1].engine
    assert first is not None and last is not None and last.busy > first.busy
    at = predict_at(p, [(8, 25.0)])
    assert at.figures[0]["itl_p50"] is not None and at.draws == 3


def test_an_open_loop_prediction_keeps_its_arrival_rate():
    from spoc_tui.core.ramp.knee import FixedRates

    p = Prediction(
        twin=twin(0.05),
        workload=load_workload("chatbot"),
        plan=FixedRates([2.0, 6.0]),
        limits=tuple(parse_sla("ttft_p99<=2s")),
        step_s=70,
        warmup_s=10,
        max_step_s=70,
        draws=2,
    )
    res = predict(p)
    assert [r.step.rate for r in res.runs] == [2.0, 6.0] and res.knee.unit == "req/s"
    calm, busy = res.runs
    # Poisson arrivals at the rate: a minute holds about rate x 60 of them (finished inside it)
    assert res.saturated(0) < 0.25 and abs(calm.step.request_rate - 2.0) / 2.0 < 0.35
    # past what the engine takes: it finishes fewer than arrive, and its queue grows until the queue
    # rule ends the step as a break, as it ends spoc ramp's (the same driver)
    assert busy.step.request_rate < 6.0 and busy.step.server.waiting_max > 10
    assert busy.step.verdict.broken_limit == "queue_unbounded" and busy.seconds < 60


def test_the_mixed_loads_scale_is_bisected_and_never_worse_than_no_correction():
    from spoc_tui.twin.correction import SCALE_BOUNDS, _solve_scale

    def queueing(k: float) -> tuple[float, float]:
        # time per token rises with the step scale, steeply past saturation (k > 1.2): a secant
        # step from k = 1 lands far beyond the root here
        return (0.01 * k if k < 1.2 else 0.012 + 0.5 * (k - 1.2), 0.1 * k)

    k, (tok, _) = _solve_scale(queueing, 0.0113, queueing(1.0))
    assert 1.0 < k < 1.2 and abs(tok / 0.0113 - 1) < 0.02
    k, (tok, _) = _solve_scale(queueing, 0.007, queueing(1.0))  # the fit too slow: scaled down
    assert abs(k - 0.7) < 0.02 and abs(tok / 0.007 - 1) < 0.02
    # a root beyond the bound stops at the bound
    k, _ = _solve_scale(queueing, 0.001, queueing(1.0))
    assert k == SCALE_BOUNDS[0]
    # already within 1 %: no replay at all, no correction
    calls: list[float] = []
    k, _ = _solve_scale(lambda x: calls.append(x) or queueing(x), 0.01005, queueing(1.0))  # type: ignore[func-returns-value]
    assert k == 1.0 and not calls
    # a replay that is not monotone (noise): the best k tried is kept, k = 1 among them
    k, (tok, _) = _solve_scale(lambda x: (0.05, 0.0) if x != 1.0 else (0.0101, 0.0), 0.01, (0.0102, 0.0))
    assert k == 1.0


def test_the_servers_own_gap_between_two_reads():
    from spoc_tui.twin.calibrate import _Metrics, server_gap

    a = _Metrics(None, None, 0.0, 0.0, itl_sum=1.0, itl_count=100.0)
    assert server_gap(a, _Metrics(None, None, 0.0, 0.0, itl_sum=1.5, itl_count=200.0)) == pytest.approx(0.005)
    assert server_gap(a, a) is None  # no token between the reads
    assert server_gap(_Metrics(None, None, 0.0, 0.0), a) is None  # a server without the histogram


def test_a_schema_1_twin_reads_with_no_shared_prefix_saving(tmp_path):
    """twin.json of schema 1 (before the shared-prefix term) had 8 coefficients per draw."""
    doc = twin().as_dict()
    doc["schema"] = 1
    for key in ("fit", "sd"):
        doc[key].pop("b_shared")  # type: ignore[attr-defined]
    doc["draws"] = [row[:8] for row in doc["draws"]]  # type: ignore[attr-defined]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    old = read_twin(path)
    assert old.fit.b_shared == 0.0 and all(d.b_shared == 0.0 for d in old.draws)
    assert old.fit.b_context == TRUE.b_context and len(old.draws) == 8
    doc["draws"][0] = doc["draws"][0] + [0.0]  # type: ignore[index]
    path.write_text(json.dumps(doc))
    with pytest.raises(TwinError, match="wrong number of coefficients"):
        read_twin(path)


def test_a_schema_2_twin_reads_with_no_ridge_and_a_ridge_round_trips(tmp_path):
    """twin.json of schema 2 (before the ridge) had 9 numbers per draw; every prefill token cost."""
    from dataclasses import replace

    gpu = twin()
    gpu = replace(gpu, fit=replace(gpu.fit, ridge=128.0), draws=tuple(replace(d, ridge=96.0) for d in gpu.draws))
    path = tmp_path / "gpu.json"
    write_twin(gpu, path)
    back = read_twin(path)
    assert back.fit.ridge == 128.0 and {d.ridge for d in back.draws} == {96.0}
    # inside the ridge a prefill costs the fixed cost (and its attention) only
    assert back.fit.step_s([], [(100, 0)]) == pytest.approx(back.fit.b0 + back.fit.b_attn * 0.005)
    assert any("ridge" in line for line in back.summary())
    doc = gpu.as_dict()
    doc["schema"] = 2
    for key in ("fit", "sd"):
        doc[key].pop("ridge")  # type: ignore[attr-defined]
    doc["draws"] = [row[:9] for row in doc["draws"]]  # type: ignore[attr-defined]
    path.write_text(json.dumps(doc))
    old = read_twin(path)
    assert old.fit.ridge == 0.0 and all(d.ridge == 0.0 for d in old.draws)
    assert old.fit.step_s([], [(100, 0)]) == pytest.approx(
        old.fit.b0 + 100 * old.fit.b_prefill + old.fit.b_attn * 0.005
    )


def test_a_shared_context_token_costs_less_but_never_less_than_nothing():
    ctx = [800] * 8
    alone = TRUE.step_s(ctx, [])
    shared = TRUE.step_s(ctx, [], 600 * 7)
    assert shared == pytest.approx(alone - TRUE.b_shared * 4.2)
    greedy = StepModel(**{**{k: getattr(TRUE, k) for k in TRUE.__slots__}, "b_shared": 1.0})
    # a saving past b_context is clipped: the shared tokens then cost nothing, the step the rest
    assert greedy.step_s(ctx, [], 600 * 7) == pytest.approx(alone - TRUE.b_context * 4.2)
    assert shared_context([[b"a", b"b"], [b"a", b"b"], [b"a", b"c"], []]) == 3


def test_shared_blocks_kept_as_decodes_come_and_go_count_as_the_whole_step_does():
    """The twin's engine keeps a step's shared blocks as its decodes change (SharedBlocks); every
    step it must read what counting all of them (shared_context) reads."""
    from spoc_tui.twin.model import SharedBlocks

    rng = random.Random(4)
    prompts = {f"r{i}": [bytes([rng.randrange(3)]) + bytes([k]) for k in range(rng.randrange(0, 6))] for i in range(40)}
    for p in prompts.values():  # prompts sharing leading blocks: each block's hash names its prefix
        for k in range(1, len(p)):
            p[k] = p[k - 1] + p[k][-1:]
    kept = SharedBlocks()
    held: dict[str, int] = {}
    for _ in range(400):
        rid = rng.choice(list(prompts))
        if rid in held and rng.random() < 0.4:
            del held[rid]  # finished
        else:
            held[rid] = rng.randrange(len(prompts[rid]) + 1)  # joined, or its count of blocks moved
        want = shared_context([prompts[r][:n] for r, n in held.items()])
        assert kept.step({r: (prompts[r], n) for r, n in held.items()}) == want


def test_the_engine_reads_a_shared_prompt_prefix_once():
    """Four requests whose prompts share 64 tokens (4 blocks of 16) decoding together: 12 blocks
    read again, and each step is that much faster than for distinct prompts."""
    from spoc_tui.sim.engine import SimRequest

    def steps(prefix: bool) -> tuple[int, float]:
        eng = TwinEngine(twin(), jitter=False, clock=lambda: 0.0)
        for i in range(4):
            head = list(range(64)) if prefix else [1000 * (i + 1) + k for k in range(64)]
            eng.add(SimRequest(f"r{i}", head + [5000 + 100 * i + k for k in range(36)], 50, 50, 0.0))
        while True:
            eng.step()
            decodes, prefills = eng._pending
            eng.complete(decodes, prefills, 0.0)
            if len(decodes) == 4 and not prefills:
                return eng._shared(decodes), eng.cost(decodes, [])

    again, fast = steps(True)
    none, slow = steps(False)
    assert again == 12 * 16 and none == 0
    assert slow - fast == pytest.approx(TRUE.b_shared * again / 1e3)


def test_check_names_a_gpu_that_ran_slower_than_at_calibration():
    """`spoc twin check` of a ramp whose GPU ran throttled: the twin's prediction of the same
    steps, and the GPU named with its clocks and the throttle reason (a thermal problem shows as
    drift, and says so)."""
    from dataclasses import replace

    from spoc_tui.core.ramp.knee import Knee
    from spoc_tui.core.ramp.steps import GpuWindow
    from spoc_tui.core.results import RampDoc, RampHeader
    from spoc_tui.twin.check import check

    tw = replace(twin(0.05), gpu_clocks={"0": 1980.0, "1": 1980.0})
    p = Prediction(
        twin=tw,
        workload=load_workload("chatbot"),
        plan=parse_user_plan("2,8"),
        limits=tuple(parse_sla("ttft_p99<=2s")),
        step_s=30,
        warmup_s=5,
        max_step_s=30,
        draws=0,
    )
    measured = predict(p).steps

    def with_gpus(hot: bool) -> tuple:
        gpus = (
            GpuWindow("0", sm_clock_mhz=1965.0),
            GpuWindow("1", sm_clock_mhz=1410.0 if hot else 1975.0, throttle_reasons=("hw_thermal",) if hot else ()),
        )
        return tuple(replace(s, server=replace(s.server, gpus=gpus)) for s in measured)

    header = RampHeader(
        model="m", url="u", sla=("ttft_p99<=2s",), profile=load_workload("chatbot").as_dict(), step_seconds=30,
        warmup_seconds=5,
    )  # fmt: skip
    for hot in (False, True):
        ramp = RampDoc(3, "complete", header, with_gpus(hot), Knee(None, None, None), path="r")
        res = check(tw, ramp, draws=0)
        assert [c.gpu for c in res.clocks] == ["0", "1"]
        assert res.holds  # the same steps the twin made: no error
        named = [c for c in res.clocks if c.slower]
        if hot:
            assert [c.gpu for c in named] == ["1"] and named[0].throttled == ("hw_thermal",)
            assert "GPU 1 ran at 1,410 MHz over the ramp against 1,980 at calibration (-29 %" in res.why
            assert res.as_dict()["gpu_clocks"][1]["change_pct"] == -28.8
        else:
            assert not named and "GPU" not in res.why


def _edited(tmp_path, edit):
    path = tmp_path / "twin.json"
    write_twin(twin(0.1), path)
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    return path


def _set(*keys, value):
    def edit(doc):
        d = doc
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_set("fit", "b0", value=-1), "b0 is -1: it must lie in [0, 3600]"),
        (_set("fit", "b_decode", value=-1e9), "b_decode is -1000000000.0"),
        (_set("fit", "b0", value=float("nan")), "b0 is 'nan', not a finite number"),
        (_set("fit", "b_context", value=float("inf")), "b_context is 'inf', not a finite number"),
        (_set("fit", "a0", value="0.1"), "a0 is '0.1', not a finite number"),
        (lambda d: d["fit"].update(dict.fromkeys(d["fit"], 0.0)), "the fit: a step would take no time"),
        (lambda d: d["draws"][2].__setitem__(0, -1e300), "b0 is -1e+300"),
        (lambda d: d["draws"].__setitem__(3, [0.0] * 10), "draw 4: a step would take no time"),
        (lambda d: d["draws"][0].__setitem__(9, float("nan")), "ridge is 'nan'"),
        (_set("server", "num_gpu_blocks", value=0), "num_gpu_blocks is 0: it must lie in [1, 1,000,000,000]"),
        (_set("server", "num_gpu_blocks", value=-5), "num_gpu_blocks is -5"),
        (_set("server", "max_model_len", value=0), "max_model_len is 0"),
        (_set("server", "block_size", value=1.5), "block_size is '1.5', not a whole number"),
        (_set("server", "gpu_memory_utilization", value=7), "gpu_memory_utilization is 7"),
        (_set("gpu_clocks", value={"0": "fast"}), "gpu_clocks['0'] is 'fast', not a finite number"),
        (_set("step_cv", value=float("nan")), "step_cv is 'nan'"),
        (_set("probes", value="many"), "probes is 'many'"),
    ],
)
def test_a_hand_edited_twin_is_refused_with_the_field_named(tmp_path, edit, message):
    """Issue 56 item 3: negative, NaN, infinite or all-zero coefficients and zero KV blocks hung
    a prediction or the twin's simulator; a non-number in gpu_clocks gave a traceback."""
    with pytest.raises(TwinError) as e:
        read_twin(_edited(tmp_path, edit))
    assert message in str(e.value) and str(e.value).startswith(str(tmp_path / "twin.json"))


def test_a_nested_json_bomb_is_refused_not_a_traceback(tmp_path):
    path = tmp_path / "twin.json"
    path.write_text("[" * 100_000)
    with pytest.raises(TwinError, match="not JSON"):
        read_twin(path)


@settings(deadline=1000, max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    key=st.sampled_from(
        ["b0", "b_prefill", "b_attn", "b_decode", "b_context", "b_mixed", "a0", "a_prompt", "b_shared", "ridge"]
    ),
    value=st.one_of(st.floats(), st.integers(-(10**30), 10**30), st.text(max_size=4), st.none(), st.booleans()),
    where=st.sampled_from(["fit", "sd", "draw"]),
)
def test_any_coefficient_reads_within_bounds_or_is_refused(tmp_path, key, value, where):
    """Property: any value in any coefficient of the fit, the spread or a draw either reads as a
    finite, non-negative, bounded number or is refused, each example within the deadline."""

    def edit(doc):
        if where == "draw":
            doc["draws"][0][PARAMS.index(key)] = value
        else:
            doc[where][key] = value

    try:
        t = read_twin(_edited(tmp_path, edit))
    except TwinError:
        return
    for m in (t.fit, t.sd, *t.draws):
        assert all(math.isfinite(x) and 0 <= x <= 1e6 for x in m.params())


def test_a_twin_that_learned_its_answers_lengths_predicts_with_them_and_says_so(tmp_path):
    """Issue 52 item 2: with a profile that lets the server stop at EOS, a twin that knows how
    long the answers are draws each from them (capped at what is asked), so E2E comes out shorter
    than with every answer as long as asked; the prediction says which it used; the lengths
    survive the twin file; a ramp whose profile ignored EOS cannot teach them."""
    import json

    from spoc_tui.core.ramp.knee import FixedUsers
    from spoc_tui.core.ramp.sla import parse_sla
    from spoc_tui.core.results import RampHeader
    from spoc_tui.twin.check import answers_of
    from spoc_tui.twin.engine import TwinEngine
    from spoc_tui.twin.model import TwinError, read_twin, with_answers, write_twin
    from spoc_tui.twin.predict import Prediction, predict
    from spoc_tui.workload import load_workload

    plain = twin(0.05)
    taught = with_answers(plain, [40, 60, 80, 100, 120] * 10, "answers of a test")
    assert taught.answer_lengths[0] == 40 and len(taught.answer_lengths) == 50
    write_twin(taught, tmp_path / "twin.json")
    back = read_twin(tmp_path / "twin.json")
    assert back.answer_lengths == taught.answer_lengths and back.answers_from == "answers of a test"
    assert "median 80 tokens" in back.answer_text() and "as long as asked" in plain.answer_text()
    eng = TwinEngine(taught, seed=1)
    assert {eng.sample_output_len(1000) for _ in range(200)} == {40, 60, 80, 100, 120}
    assert eng.sample_output_len(50) <= 50 and TwinEngine(plain, seed=1).sample_output_len(300) == 300

    chat = load_workload("chatbot")
    assert not chat.ignore_eos
    out = {}
    for name, t in (("plain", plain), ("taught", taught)):
        p = Prediction(twin=t, workload=chat, plan=FixedUsers([8]), limits=tuple(parse_sla("ttft_p99<=2s")),
                       step_s=60.0, warmup_s=5.0, draws=0, seed=3)  # fmt: skip
        res = predict(p)
        out[name] = (res.steps[0].latency.e2e.p50, res.notes)
    assert out["taught"][0] < 0.8 * out["plain"][0], out

    # each draw of the prediction answers from a resample of the lengths (a few dozen answers
    # say their median only roughly), so E2E's interval carries that; the fit's run the lengths
    from collections import Counter

    from spoc_tui.twin.predict import _virtual

    p = Prediction(twin=taught, workload=chat, plan=FixedUsers([8]), limits=(), draws=2, seed=3)
    assert _virtual(p, taught.fit, 3)[0].answer_lengths == taught.answer_lengths
    drawn = [_virtual(p, taught.fit, seed, resample_answers=True)[0].answer_lengths for seed in (1, 2)]
    assert drawn[0] != drawn[1] and all(len(d) == 50 and set(d) <= set(taught.answer_lengths) for d in drawn)
    assert all(max(Counter(d).values()) > 10 for d in drawn)  # drawn with replacement
    assert any("answers stop at EOS, their lengths from answers of a test" in n for n in out["taught"][1])
    assert any("every answer as long as asked" in n for n in out["plain"][1])

    # a ramp teaches them from its finished requests, unless its profile ignored EOS
    ramp = tmp_path / "ramp"
    ramp.mkdir()
    rows = [{"ok": True, "output_tokens": n} for n in (30, 50, 70)] + [{"ok": False, "output_tokens": 0}]
    (ramp / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n[1, 2]\n7\nnot json\n")
    assert sorted(answers_of(ramp, RampHeader(profile={"name": "chatbot"}))) == [(30, None), (50, None), (70, None)]
    with pytest.raises(TwinError, match="ignore_eos"):
        answers_of(ramp, RampHeader(profile={"name": "flat", "ignore_eos": True}))
    (ramp / "requests.jsonl").write_text("")
    with pytest.raises(TwinError, match="no finished request"):
        answers_of(ramp, RampHeader(profile={"name": "chatbot"}))


def test_answers_cut_at_max_tokens_are_learned_as_lower_bounds(tmp_path):
    """Issue 52 item 2: half the chatbot profile's answers are cut at its max_tokens (it asks a
    median of 180 tokens of a model whose own median is about 180). Learned as they were read, the
    answers come out short, and a prediction capping them again at its own max_tokens cut them
    twice (E2E about 20 % short); learned with the cut ones as lower bounds (Kaplan-Meier), the
    model's own lengths come back, and a ramp's requests say which were cut."""
    import json
    import random
    import statistics

    from spoc_tui.core.ramp.steps.sample import RequestSample
    from spoc_tui.core.results import RampHeader
    from spoc_tui.twin.answers import learned_lengths
    from spoc_tui.twin.check import answers_of

    rng = random.Random(5)
    model = [int(rng.lognormvariate(5.2, 0.7)) + 1 for _ in range(3000)]  # the model's own: median 181
    asked = [int(rng.lognormvariate(5.193, 0.6)) + 1 for _ in model]
    seen = [(min(n, m), n > m) for n, m in zip(model, asked, strict=True)]
    assert 0.4 < sum(c for _, c in seen) / len(seen) < 0.6
    naive = statistics.median(n for n, _ in seen)
    got = learned_lengths(seen, 256)
    assert len(got.lengths) == 256 and list(got.lengths) == sorted(got.lengths) and got.cut == sum(c for _, c in seen)
    true_median = statistics.median(model)
    assert abs(statistics.median(got.lengths) / true_median - 1) < 0.06, (statistics.median(got.lengths), true_median)
    assert naive < 0.8 * true_median  # what learning them as read gave
    # the upper quantiles too, as far as answers were seen whole
    q80 = sorted(model)[int(0.8 * len(model))]
    assert abs(got.lengths[int(0.8 * 256)] / q80 - 1) < 0.1
    assert "cut at max_tokens (lower bounds: Kaplan-Meier)" in got.text("the ramp r")

    # nothing cut: the sample is the lengths' own quantiles; the tail past the longest whole answer
    # is said, and kept at that length (a lower bound)
    plain = learned_lengths([(n, False) for n in (10, 20, 30, 40)], 4)
    assert plain.lengths == (10, 20, 30, 40) and plain.beyond == 0 and plain.cut == 0
    tail = learned_lengths([(10, False), (20, False), (50, True), (50, True)], 4)
    assert tail.lengths == (10, 20, 50, 50) and tail.beyond == 0.5
    assert "the longest 50 % only known to be over 50 tokens" in tail.text("x")
    unknown = learned_lengths([(10, None), (20, None)], 8)
    assert unknown.lengths == (10, 20) and "2 not saying whether they were cut" in unknown.text("x")
    with pytest.raises(ValueError):
        learned_lengths([], 8)

    # a ramp's requests say which answers the server cut (finish_reason "length")
    ramp = tmp_path / "ramp"
    ramp.mkdir()
    rows = [RequestSample(start=0.0, step=1, users=1, ok=True, output_tokens=n, cut=c).as_dict() for n, c in seen[:50]]
    (ramp / "requests.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert answers_of(ramp, RampHeader(profile={"name": "chatbot"})) == seen[:50]
    assert RequestSample.from_dict(rows[0]).cut == seen[0][1]


def test_a_resample_that_fits_a_step_to_no_time_is_left_out_and_a_timeless_fit_is_refused(monkeypatch):
    """A clean-clone run's real-engine tier calibrated on a host whose decode gap went from 0.65 to
    3.17 ms during the probes: one bootstrap resample fit every cost to 0, the twin was written
    with that draw, and its own reader refused it ("draw 7: a step would take no time"). Such a
    resample is no model of a step: it is left out and counted in the notes; a fit that is itself
    timeless is refused with what to do."""
    from spoc_tui.twin import fit as fitmod
    from spoc_tui.twin.model import TwinError, takes_time

    best, calls = fitmod._best_ridge, [0]

    def every_third_timeless(xs, y, coefs):
        calls[0] += 1
        coef, r = best(xs, y, coefs)
        return (coef * 0.0, r) if calls[0] > 1 and calls[0] % 3 == 0 else (coef, r)

    monkeypatch.setattr(fitmod, "_best_ridge", every_third_timeless)
    fit, _sd, draws, _res, notes = fit_step_model(synthetic(TRUE, 0.02))
    assert takes_time(fit) and draws and all(takes_time(d) for d in draws)
    assert any("fit a step to no time and were left out" in n for n in notes), notes
    monkeypatch.setattr(fitmod, "_best_ridge", lambda xs, y, coefs: (best(xs, y, coefs)[0] * 0.0, 0.0))
    with pytest.raises(TwinError, match="fit to no time at all"):
        fit_step_model(synthetic(TRUE, 0.02))


def test_resamples_that_lack_a_kind_hold_its_cost_at_zero_and_every_draw_is_finite():
    """A calibration on the live simulator (25 s of probes) had one mixed step: the resamples
    without it started from the whole fit's columns, b_mixed among them, and fit it at 1e-20 over
    a column scaled by 1e-300: the twin was written with its spread None and refused by its own
    reader. A column a resample does not exercise is held at 0 there, as the search from nothing
    holds it."""
    import math
    from dataclasses import astuple

    obs = synthetic(TRUE, 0.02)
    one_mixed = [o for o in obs if o.kind != "mixed" or o.probe == 19]
    fit, sd, draws, _res, _notes = fit_step_model(one_mixed)
    assert fit.b_mixed > 0
    assert all(math.isfinite(float(v)) for m in (fit, sd, *draws) for v in astuple(m)), sd
    assert any(d.b_mixed == 0.0 for d in draws)  # the resamples without the mixed step
