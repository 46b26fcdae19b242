"""The decode run (sim/decoderun.py): many decode steps worked out at once must be the step path,
step for step: the same samples (every token's time), the same counters, the same engine state,
for the simulator's engine and the twin's, in a virtual server (its users and open loop) and on a
fleet's event loop, with preemptions, prefix caching, max-model-len cuts and seats full."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from spoc_tui.core.hardware.capacity import iteration_time
from spoc_tui.core.hardware.presets import GPUS, MODELS
from spoc_tui.core.traces.read import TraceRow
from spoc_tui.sim import decoderun
from spoc_tui.sim.engine import EngineConfig, PrefixCache, SimEngine
from spoc_tui.sim.virtual import VirtualServer
from spoc_tui.twin.fleet import FleetSim
from spoc_tui.twin.model import ServerConfig, StepModel, Twin
from spoc_tui.workload import load_workload


@pytest.fixture
def step_path(monkeypatch):
    """Runs the code under test with the decode run and the lazy decodes off: every step on the
    step path, every request walked."""

    def off() -> None:
        monkeypatch.setattr(SimEngine, "decode_run", lambda self, *a, **k: decoderun.NOTHING)
        monkeypatch.setattr(SimEngine, "LAZY", False)

    return off


def _engine_state(eng: SimEngine) -> tuple:
    st = eng.stats
    hists = tuple((h.counts, h.n) for h in (st.itl, st.ttft, st.tpot, st.e2e, st.queue, st.iteration_tokens))
    sums = (st.itl.sum, st.iteration_tokens.sum)
    return (
        (st.iterations, st.generation_tokens, st.prompt_tokens, st.preemptions, st.prefix_hits, st.prefix_queries),
        dict(st.success),
        hists,
        (st.flops_per_gpu, st.read_bytes_per_gpu, st.write_bytes_per_gpu),
        (eng.used_blocks, len(eng.cache), eng.running_peak, eng.busy_s),
        sums,
    )


def _virtual(cfg: EngineConfig, profile: str, users: int, rate: float, seconds: float, seed: int) -> VirtualServer:
    vs = VirtualServer(cfg, load_workload(profile), users=users, seed=seed)
    if rate:
        vs.set_rate(rate)
    for k in range(1, 11):
        vs.advance(seconds * k / 10)
    return vs


CASES = [
    ("chatbot users", dict(), "chatbot", 24, 0.0, 90.0),
    ("chatbot at 30/s", dict(max_num_seqs=256), "chatbot", 0, 30.0, 40.0),
    ("coding, seats full", dict(max_num_seqs=8), "coding", 0, 3.0, 60.0),
    ("preempting", dict(gpu_memory_utilization=0.215, max_model_len=4096), "chatbot", 64, 0.0, 60.0),
    ("short context", dict(max_model_len=1024), "chatbot", 16, 0.0, 60.0),
    ("no prefix caching", dict(enable_prefix_caching=False, block_size=32), "chatbot", 16, 0.0, 60.0),
]


@pytest.mark.parametrize(("name", "flags", "profile", "users", "rate", "seconds"), CASES, ids=[c[0] for c in CASES])
def test_a_virtual_server_runs_the_same_steps_either_way(step_path, name, flags, profile, users, rate, seconds):
    cfg = EngineConfig(model=MODELS["llama-3.1-8b"], gpu=GPUS["h100-80gb"], served_model_name="m", **flags)
    fast = _virtual(cfg, profile, users, rate, seconds, seed=5)
    step_path()
    slow = _virtual(cfg, profile, users, rate, seconds, seed=5)
    assert fast.samples == slow.samples and len(fast.samples) > 20
    assert fast.now == slow.now
    a, b = _engine_state(fast.engine), _engine_state(slow.engine)
    assert a[:5] == b[:5]
    assert a[5] == pytest.approx(b[5], rel=1e-12)  # a histogram's sum: per step, not per token
    if name == "preempting":
        assert slow.engine.stats.preemptions > 0


def test_the_decode_run_does_most_steps_where_nothing_happens(monkeypatch):
    """It is used: on the demo's kind of traffic most steps are worked out in runs."""
    counted = {"runs": 0, "steps": 0}
    real = decoderun.decode_run

    def counting(self, *a, **k):
        run = real(self, *a, **k)
        counted["runs"] += run.steps > 0
        counted["steps"] += run.steps
        return run

    monkeypatch.setattr(SimEngine, "decode_run", counting)
    cfg = EngineConfig(model=MODELS["llama-3.1-8b"], gpu=GPUS["h100-80gb"], served_model_name="m")
    vs = _virtual(cfg, "chatbot", 24, 0.0, 60.0, seed=1)
    assert counted["steps"] > 0.8 * vs.engine.stats.iterations
    assert counted["steps"] > 5 * counted["runs"]


def _twin(cv: float, shared: float) -> Twin:
    model = StepModel(0.004, 0.05, 0.02, 0.0002, 0.03, 0.001, 0.01, 0.002, shared)
    server = ServerConfig("m", 8192, 16, 4000, True, 0.9, 64, 2048, True)
    return Twin(model, StepModel(*(0.05 * x for x in model.vector())), (), cv, server)


def _rows(n: int, seed: int) -> tuple[TraceRow, ...]:
    rng = random.Random(seed)
    rows, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(6.0)
        n_in = rng.randint(50, 1500)
        shared = rng.choice((0, 8, 20))
        ids = (*range(shared), *range(10_000 + 100 * i, 10_000 + 100 * i + max(0, n_in // 16 + 1 - shared)))
        rows.append(TraceRow(i, t, n_in, rng.randint(1, 400), ids, 16, line=i + 1))
    return tuple(rows)


@pytest.mark.parametrize(("cv", "shared", "speed"), [(0.0, 0.0, 1.0), (0.08, 0.01, 2.0), (0.05, 0.0, 6.0)])
def test_a_fleet_replay_on_the_twin_runs_the_same_steps_either_way(step_path, cv, shared, speed):
    """On a fleet's event loop a run stops before its next event (a row, a poll): the step across
    it is left pending, as the step path leaves it. The twin's jitter draws stay in step."""
    rows = _rows(400, seed=3)
    fast = FleetSim(_twin(cv, shared), rows, speed, replicas=1, seed=2, poll_s=1.0)
    fast_run = fast.run()
    step_path()
    slow = FleetSim(_twin(cv, shared), rows, speed, replicas=1, seed=2, poll_s=1.0)
    slow_run = slow.run()
    assert fast_run.samples == slow_run.samples and len(fast_run.samples) == 400
    assert fast.polls == slow.polls
    assert _engine_state(fast.replicas[0].engine)[:5] == _engine_state(slow.replicas[0].engine)[:5]


def test_a_run_steps_cost_what_iteration_time_says_to_the_last_bit():
    rng = np.random.default_rng(1)
    for model, tp, fp8 in (("llama-3.1-8b", 1, False), ("llama-3.1-70b", 4, True), ("gpt-oss-120b", 2, False)):
        if model not in MODELS:
            continue
        cfg = EngineConfig(model=MODELS[model], gpu=GPUS["h100-80gb"], served_model_name="m", tp=tp,
                           quantization="fp8" if fp8 else None)  # fmt: skip
        eng = SimEngine(cfg, clock=lambda: 0.0)
        n = rng.integers(1, 256, 50)
        ctx = n * rng.integers(10, 9000, 50)
        secs, flops, read = eng._decode_costs(n, ctx, None)
        for j in range(50):
            contexts = [int(ctx[j]) // int(n[j])] * int(n[j])
            contexts[0] += int(ctx[j]) - sum(contexts)
            one = iteration_time(cfg.model, cfg.gpu, tp, contexts, [], eng.plan.weights_bytes_per_gpu, eng.kv_per_token,
                                 flops_scale=2.0 if fp8 else 1.0)  # fmt: skip
            assert (secs[j], flops[j], read[j]) == (one.seconds, one.flops, one.bytes_read)


def test_the_twins_decode_steps_cost_what_step_s_says_to_the_last_bit():
    rng = np.random.default_rng(2)
    for moves in (False, True):
        m = replace(_twin(0.0, 0.012).fit, ridge=300.0, ridge_moves=moves)
        n = rng.integers(1, 200, 60)
        ctx = n * rng.integers(10, 5000, 60)
        shared = rng.integers(0, 3, 60) * rng.integers(0, 4000, 60)
        got = m.decode_steps_s(n, ctx, shared)
        for j in range(60):
            contexts = [int(ctx[j]) // int(n[j])] * int(n[j])
            contexts[0] += int(ctx[j]) - sum(contexts)
            assert got[j] == m.step_s(contexts, [], int(shared[j]))


def test_block_keys_name_a_prefix_and_continue_from_known_ones():
    rng = random.Random(4)
    a = [rng.randrange(1 << 24) for _ in range(40 * 16 + 5)]
    b = a[:300] + [7] + a[301:]
    ka, kb = PrefixCache.hashes(a, 16), PrefixCache.hashes(b, 16)
    assert len(ka) == 40 and ka[:18] == kb[:18] and all(x != y for x, y in zip(ka[18:], kb[18:], strict=True))
    assert PrefixCache.hashes(a, 16, limit=10) == ka[:10]
    longer = a + [1] * 64
    assert PrefixCache.continued(ka[:25], longer[25 * 16 :], 16, 99) == PrefixCache.hashes(longer, 16)
    assert len(set(ka)) == 40 and PrefixCache.hashes(a[:15], 16) == []


def test_the_twins_jitter_drawn_ahead_and_rewound_stands_where_one_by_one_leaves_it():
    """A run draws its steps' jitter ahead in bulk and goes back to exactly the steps it ran: the
    factors and the generator's state after are those of as many one-by-one draws, whether a
    normal was held over before, after, or both."""
    from spoc_tui.twin.engine import TwinEngine

    rng = random.Random(11)
    for _ in range(200):
        a, b = TwinEngine(_twin(0.07, 0.0), seed=3), TwinEngine(_twin(0.07, 0.0), seed=3)
        skip = rng.randint(0, 3)
        for eng in (a, b):
            for _ in range(skip):
                eng._jittered(0.01)
        ahead, used = rng.randint(0, 9), rng.randint(0, 9)
        mark = a._jitter_mark()
        drawn = a._jitter_draw(ahead) or []
        more = (a._jitter_draw(used - ahead + rng.randint(0, 3)) or []) if used > ahead else []
        a._jitter_rewind(mark, used)  # a run uses at most what it drew
        one_by_one = [b._jittered(1.0) for _ in range(used)]
        assert (drawn + more)[:used] == one_by_one
        assert [a._jittered(1.0) for _ in range(5)] == [b._jittered(1.0) for _ in range(5)]


def test_a_finished_requests_keys_continue_from_its_prompts():
    rng = random.Random(6)
    for _ in range(100):
        bs = rng.choice((1, 8, 16, 32))
        prompt = [rng.randrange(1 << 24) for _ in range(rng.randint(0, 300))]
        answer = [rng.randrange(1 << 24) for _ in range(rng.randint(0, 200))]
        known = PrefixCache.hashes(prompt, bs)
        limit = rng.randint(0, (len(prompt) + len(answer)) // bs + 2)
        tail = prompt[len(known) * bs :] + answer
        assert PrefixCache.continued(known, tail, bs, limit) == PrefixCache.hashes(prompt + answer, bs, limit)


def test_a_lazy_steps_cost_is_iteration_times_to_the_last_bit():
    """A step's lazy decodes reach the cost model as a count and a total (every step of a lazy run
    is costed so): the same floats as :func:`iteration_time` of each one's context, the FLOPs and
    bytes read too, at any clock, dense or MoE, on one GPU or several."""
    from spoc_tui.sim.lazy import Contexts

    rng = random.Random(8)
    for model, tp in (("llama-3.1-8b", 1), ("llama-3.1-70b", 4), ("gpt-oss-120b", 2)):
        for gpu in ("h100-80gb", "a100-80gb", "l40s"):
            for fp8 in (False, True):
                args = (MODELS[model], GPUS[gpu], tp)
                for _ in range(100):
                    n = rng.randint(1, 512)
                    contexts = [rng.randint(1, 32768) for _ in range(n)]
                    kw = dict(clock_ratio=rng.choice((1.0, 0.7, 0.2, 0.01)), flops_scale=2.0 if fp8 else 1.0)
                    want = iteration_time(*args, contexts, [], 4e10, 131072.0, **kw)
                    assert iteration_time(*args, Contexts(n, sum(contexts)), [], 4e10, 131072.0, **kw) == want


def test_a_twins_lazy_steps_cost_is_step_s_to_the_last_bit():
    """step_s sums a step of decodes alone term by term (a lazy run's every step is one): the same
    float as its general sum over step_features' row."""
    from spoc_tui.sim.engine import SimRequest
    from spoc_tui.twin.engine import TwinEngine
    from spoc_tui.twin.model import step_features

    rng = random.Random(9)
    for moves in (False, True):
        twin = _twin(0.0, 0.0)
        m = replace(twin.fit, ridge=300.0, ridge_moves=moves, b0=rng.choice((0.004, -0.0)))
        eng = TwinEngine(twin, m, seed=1)
        for _ in range(300):
            n = rng.randint(1, 300)
            reqs = [SimRequest(rid=str(i), prompt=[1], max_tokens=1, target_tokens=1, arrival=0.0, computed=rng.randint(1, 9000))
                    for i in range(n)]  # fmt: skip
            contexts = [r.computed for r in reqs]
            row = step_features(contexts, [], m.moved_ridge(sum(contexts) / 1e3))
            want = sum(c * x for c, x in zip(m.vector()[:6], row, strict=True))  # step_s's general sum
            assert eng._cost(reqs, []).seconds == m.step_s(contexts, []) == want
