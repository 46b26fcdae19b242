import pytest

from spoc_tui.core.hardware.capacity import (
    DEFAULT_RESERVE_BYTES,
    decode_roofline_tokens_per_s,
    kv_bytes_per_token,
    weights_bytes,
)
from spoc_tui.core.hardware.presets import GPUS, MODELS
from spoc_tui.sim.engine import EngineConfig, SimEngine, SimRequest
from spoc_tui.sim.gpu import SimGpu
from spoc_tui.sim.run import SimConfigError, SimOptions, build


def make(max_num_seqs=256, tp=1, model="llama-3.1-8b", gpu="h100-80gb", gpus=None, **kw):
    t = [0.0]
    cfg = EngineConfig(
        model=MODELS[model], gpu=GPUS[gpu], served_model_name="m", tp=tp, max_num_seqs=max_num_seqs, **kw
    )
    return SimEngine(cfg, gpus, clock=lambda: t[0]), t


def drive(engine, t, limit=200000):
    for _ in range(limit):
        if engine.idle():
            return
        d = engine.step()
        dec, pre = engine._pending
        t[0] += d
        engine.complete(dec, pre, t[0])
    raise AssertionError("engine did not drain")


def req(rid, prompt_len, out, t=0.0, prompt=None):
    return SimRequest(
        rid, prompt or list(range(1000 + hash(rid) % 1000, 1000 + hash(rid) % 1000 + prompt_len)), out, out, t
    )


def test_kv_capacity_matches_formula():
    for model in ("llama-3.1-8b", "qwen2.5-7b", "llama-3.1-70b"):
        tp = 4 if model == "llama-3.1-70b" else 1
        e, _ = make(model=model, tp=tp)
        m, g = MODELS[model], GPUS["h100-80gb"]
        expected = (g.memory_bytes * 0.9 - weights_bytes(m) / tp - DEFAULT_RESERVE_BYTES) * tp / kv_bytes_per_token(m)
        assert e.plan.kv_cache_tokens == pytest.approx(expected, abs=16)


def test_single_stream_decode_matches_memory_roofline():
    e, t = make()
    r = req("a", 100, 300)
    times = []
    r.on_token = lambda n, now: times.append(now)
    e.add(r)
    drive(e, t)
    decode_speed = (len(times) - 1) / (times[-1] - times[0])
    roofline = decode_roofline_tokens_per_s(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], context=250)
    assert decode_speed == pytest.approx(roofline, rel=0.10)


def test_throughput_rises_with_batch_then_flattens():
    speeds = {}
    for b in (1, 8, 64, 256):
        e, t = make()
        for i in range(b):
            e.add(req(f"r{i}", 200, 200))
        drive(e, t)
        speeds[b] = e.stats.generation_tokens / t[0]
    assert speeds[1] < speeds[8] < speeds[64] < speeds[256]
    assert speeds[8] / speeds[1] > 4  # nearly linear while memory-bound
    assert speeds[256] / speeds[64] < speeds[64] / speeds[8]  # flattening


def test_ttft_grows_with_queueing_past_saturation():
    def mean_ttft(n):
        e, t = make(max_num_seqs=32)
        for i in range(n):
            e.add(req(f"q{i}", 500, 100))
        drive(e, t)
        return e.stats.ttft.sum / e.stats.ttft.n

    assert mean_ttft(256) > 4 * mean_ttft(16)


def test_preemption_when_blocks_run_out():
    e, t = make(max_num_seqs=64, gpu_memory_utilization=0.9)
    e.num_blocks = 200  # a tiny cache: 3200 tokens
    for i in range(20):
        e.add(req(f"p{i}", 100, 300))
    drive(e, t)
    assert e.stats.preemptions > 0
    assert e.stats.success["length"] == 20


def test_prefix_cache_hits_for_multi_turn():
    e, t = make()
    prompt = list(range(5000, 5640))
    e.add(req("turn1", 640, 20, prompt=prompt))
    drive(e, t)
    e.add(req("turn2", 700, 20, t[0], prompt=prompt + list(range(9000, 9060))))
    drive(e, t)
    assert e.stats.prefix_hits >= 600


def test_thermal_throttle_lowers_group_throughput():
    def throughput(hot):
        gpus = [SimGpu(i, GPUS["h100-80gb"]) for i in range(4)]
        for g in gpus:
            g.sm_clock_mhz, g.reasons = GPUS["h100-80gb"].sm_clock_max_mhz, 0
        if hot:
            gpus[3].sm_clock_mhz, gpus[3].reasons = 0.6 * GPUS["h100-80gb"].sm_clock_max_mhz, 0x20
        e, t = make(tp=4, model="llama-3.1-70b", gpus=gpus)
        for i in range(64):
            e.add(req(f"h{i}", 300, 100))
        drive(e, t)
        return e.stats.generation_tokens / t[0]

    assert throughput(True) < 0.9 * throughput(False)


def test_gpu_model_power_cap_and_thermal_reasons():
    g = SimGpu(0, GPUS["h100-80gb"])
    for _ in range(100):
        g.step(1.0, 1.0, 1.0)
    assert g.reasons & 0x4 and g.power_w <= 700
    hot = SimGpu(1, GPUS["h100-80gb"], thermal_resistance=0.115)
    for _ in range(300):
        hot.step(1.0, 1.0, 0.75)
    assert hot.reasons & 0x20
    assert hot.sm_clock_mhz < 0.8 * 1980
    idle = SimGpu(2, GPUS["h100-80gb"])
    idle.step(1.0, 0.0, 0.0)
    assert idle.reasons == 0x1


@pytest.mark.parametrize(
    "opts,msg",
    [
        (SimOptions(gpu="v100"), "unknown GPU 'v100'; known: a100-40gb, a100-80gb, h100-80gb"),
        (SimOptions(model="llama-9"), "unknown model"),
        (SimOptions(model="llama-3.1-70b", gpu="l40s"), "GiB short per GPU"),
        (SimOptions(tp=3), "TP 3 does not divide"),
        (
            SimOptions(enable_chunked_prefill=False, max_num_batched_tokens=1024, max_model_len=4096),
            "smaller than max_model_len",
        ),
        (SimOptions(scenario="thermal", tp=1), "needs a TP group"),
        (SimOptions(scenario="nope"), "unknown scenario"),
    ],
)
def test_impossible_configurations_are_refused(opts, msg):
    with pytest.raises(SimConfigError, match=msg.replace("(", r"\(")):
        build(opts)


def test_thermal_scenario_hot_gpu_throttles_and_slows_the_group():
    """The scenario as `spoc sim --scenario thermal` builds it, run in virtual time."""

    def run(scenario):
        engine, _ = build(SimOptions(scenario=scenario, tp=4, model="llama-3.1-70b"))
        t = [0.0]
        engine.clock = lambda: t[0]
        n = 0
        for _ in range(400):
            while len(engine.running) + len(engine.waiting) < 64:
                engine.add(req(f"{scenario}{n}", 300, 200, t[0]))
                n += 1
            d = engine.step()
            dec, pre = engine._pending
            t[0] += d
            engine.complete(dec, pre, t[0])
            engine.step_gpus(max(d, 0.5), 1.0, 0.8)  # coarse thermal steps: minutes of load
        return engine, engine.stats.generation_tokens / t[0]

    hot_engine, hot = run("thermal")
    _, steady = run("steady")
    gpus = hot_engine.gpus
    assert gpus[-1].reasons & 0x20 and gpus[-1].temp_c >= 86
    assert all(not g.reasons & 0x20 for g in gpus[:-1])
    assert gpus[-1].sm_clock_mhz < 0.85 * gpus[0].sm_clock_mhz
    assert hot < 0.95 * steady  # decode is memory-bound: it slows less than the SM clock drops


def _users_first_starts(vs, since):
    """Each user's first request sent at or after ``since`` (simulated seconds)."""
    firsts: dict[str, float] = {}
    for s in vs.samples:
        if s.start >= since:
            user = s.conversation.split("-")[0]
            firsts[user] = min(firsts.get(user, s.start), s.start)
    return firsts


@pytest.mark.parametrize("think", [0.0, 3.0])
def test_virtual_lockstep_restarts_every_user_together_at_each_change(tmp_path, think):
    """As `spoc ramp --arrivals lockstep`: a change of users stops the thinking, lets the requests
    in flight end, then sends every user's next turn at one instant, the earlier users' too (before,
    only the users added started together). Staggered users keep their phase."""
    from spoc_tui.sim.virtual import VirtualServer
    from spoc_tui.workload import load_workload

    path = tmp_path / "flat.toml"
    path.write_text(f'name = "flat"\nuser_tokens = 500\noutput_tokens = 50\nignore_eos = true\nthink_s = {think}\n')
    for lockstep in (True, False):
        engine, _ = make(max_num_seqs=64)
        vs = VirtualServer(engine, load_workload(str(path)), 4, seed=3, lockstep=lockstep, paced=True)
        vs.advance(7.3)  # mid-request or mid-thought
        change = vs.now
        vs.set_users(12)
        vs.advance(change + 20)
        firsts = _users_first_starts(vs, change)
        assert len(firsts) == 12
        spread = max(firsts.values()) - min(firsts.values())
        if lockstep:
            assert spread == 0.0, firsts
            # the cohort waited for the requests in flight and no longer: one request's length at most
            assert min(firsts.values()) - change < 1.0
            assert all(s.ok for s in vs.samples)  # none cut
        else:
            assert spread > 0.5, firsts


def test_a_steps_window_counts_only_the_requests_its_level_sent(tmp_path):
    """After a step down, requests the last level sent still end inside the next step's window;
    they measured the last level's load, and a window from the step's start leaves them out."""
    from spoc_tui.sim.virtual import VirtualServer
    from spoc_tui.workload import load_workload

    path = tmp_path / "long.toml"
    path.write_text('name = "long"\nuser_tokens = 3000\noutput_tokens = 400\nignore_eos = true\nthink_s = 0\n')
    engine, _ = make(max_num_seqs=4)
    vs = VirtualServer(engine, load_workload(str(path)), 32, seed=1)
    vs.advance(30.0)
    change = vs.now
    vs.set_users(2)
    vs.advance(change + 5.0)
    everything = vs.window(change, vs.now)
    mine = vs.window(change, vs.now, change)
    assert any(s.start < change for s in everything)  # the queue of 32 users still drains
    assert all(s.start >= change for s in mine) and len(mine) < len(everything)


def test_a_step_down_drains_the_last_levels_requests_first(tmp_path):
    """After a step down the ramp waits for the requests the last level sent (VirtualServer.drain,
    as spoc ramp reads its load generator's stale count): queued behind them, the new level's
    requests measured the last level's load (coding, 15 users after 64: a TTFT p99 of 5.1 s
    against 0.2 s)."""
    from spoc_tui.sim.virtual import VirtualServer
    from spoc_tui.workload import load_workload

    path = tmp_path / "long.toml"
    path.write_text('name = "long"\nuser_tokens = 3000\noutput_tokens = 400\nignore_eos = true\nthink_s = 0\n')
    engine, _ = make(max_num_seqs=4)
    vs = VirtualServer(engine, load_workload(str(path)), 32, seed=1)
    vs.advance(30.0)
    assert vs.stale() == 0  # nothing was sent before the level was set
    change = vs.now
    vs.set_users(2)
    backlog = vs.stale()
    assert backlog > 4  # 32 users' requests, queued behind 4 seats
    took = vs.drain(600.0)
    assert vs.stale() == 0 and took > 0 and vs.now == pytest.approx(change + took)
    # every request the last level sent has ended by then; none of the new level's was cut
    assert all(s.end is not None and s.end <= vs.now for s in vs.samples if s.start < change)
    assert all(s.ok for s in vs.samples)
    # a drain is bounded: at most the seconds it is given
    vs.set_users(32)
    vs.advance(vs.now + 30.0)
    vs.set_users(2)
    assert vs.stale() > 0 and vs.drain(1.0) < 1.5  # one engine step past it at most


def test_a_virtual_server_sends_what_another_was_sent_again_at_a_speed(tmp_path):
    """``record`` keeps the requests a server was sent; ``resend`` sends them to another as
    ``spoc ramp --trace T --speed s`` replays a trace: the same prompts (a follow-up turn's cached
    history too) and answers, each due at its time over ``s``, a turn held until its
    conversation's previous turn has ended. At x1 on a server built alike every figure comes back;
    at x3 the sends span a third of the time, some turns wait for their previous one, and the
    steps grow busier."""
    from spoc_tui.sim.virtual import VirtualServer
    from spoc_tui.workload import load_workload

    path = tmp_path / "chat.toml"
    path.write_text(
        'name = "chat"\nsystem_tokens = 200\nturns = 2\nuser_tokens = 300\noutput_tokens = 60\nthink_s = 0\n'
    )
    work = load_workload(str(path))
    first = VirtualServer(make(max_num_seqs=16)[0], work, 0, seed=5, record=True)
    first.set_rate(2.0)
    first.advance(60.0)
    first.set_rate(0.0)
    first.advance(120.0)
    sent = first.sent
    assert sent is not None and len(sent) == len(first.samples) > 60
    assert VirtualServer(make()[0], work, 0).sent is None  # not recording: nothing kept

    def again(speed: float) -> VirtualServer:
        vs = VirtualServer(make(max_num_seqs=16)[0], work, 0, seed=5)
        last = vs.resend(sent, speed)
        assert last == pytest.approx((sent[-1].at - sent[0].at) / speed)
        vs.advance(last + 60.0)
        return vs

    same = again(1.0)
    assert len(same.samples) == len(sent) and all(s.ok for s in same.samples)
    by_row = sorted(same.samples, key=lambda s: s.trace_index or 0)
    assert [s.prompt_tokens for s in by_row] == [len(r.prompt) for r in sent]
    assert [s.output_tokens for s in by_row] == [r.target_tokens for r in sent]
    # the follow-up turns find their history in the prefix cache, as they did first
    assert sum(s.cached_tokens or 0 for s in same.samples) == pytest.approx(
        sum(s.cached_tokens or 0 for s in first.samples), rel=0.1
    )
    fast = again(3.0)
    due = {k: (r.at - sent[0].at) / 3.0 for k, r in enumerate(sent)}
    for s in fast.samples:
        k = s.trace_index
        assert k is not None and s.start == pytest.approx(due[k] + (s.held_s or 0.0))
        assert s.scheduled == pytest.approx(due[k])  # planned when due, as spoc ramp's trace rows
    held = [s for s in fast.samples if s.held_s]
    assert held and all(s.conversation for s in held)
    # a held turn went when the turn before it in its conversation ended
    ends = {(s.conversation, s.trace_index): s.end for s in fast.samples}
    for s in held:
        before = max(k for (c, k) in ends if c == s.conversation and k < (s.trace_index or 0))
        assert s.start == pytest.approx(ends[(s.conversation, before)])
    gap = sorted(g for s in fast.samples for g in s.itl)
    slow = sorted(g for s in same.samples for g in s.itl)
    assert gap[len(gap) // 2] > slow[len(slow) // 2]
    # a trace without sessions: every request when due, whatever is in flight
    loose = VirtualServer(make(max_num_seqs=16)[0], work, 0, seed=5)
    loose.advance(loose.resend(sent, 3.0, turns_wait=False) + 60.0)
    assert len(loose.samples) == len(sent) and not any(s.held_s for s in loose.samples)
    assert all(s.start == pytest.approx(due[s.trace_index or 0]) for s in loose.samples)
    with pytest.raises(ValueError, match="speed must be above 0"):
        VirtualServer(make()[0], work, 0).resend(sent, 0.0)
    # as their users would send them: the same instants, each the earliest request free to go
    users = VirtualServer(make(max_num_seqs=16)[0], work, 0, seed=5)
    last = users.resend_as_users(sent, 3.0)
    assert last == pytest.approx((sent[-1].at - sent[0].at) / 3.0)
    users.advance(last + 60.0)
    assert sorted(s.trace_index or 0 for s in users.samples) == list(range(len(sent)))  # each one once
    instants = sorted(due.values())
    on_time = [s for s in users.samples if not s.held_s]
    assert len(on_time) > 0.9 * len(sent)  # where held replay waits, a first turn goes instead
    assert sorted(s.start for s in on_time) == pytest.approx(
        [t for t in instants if any(s.scheduled == pytest.approx(t) for s in on_time)]
    )
    ends = {(s.conversation, s.trace_index): s.end for s in users.samples}
    for s in users.samples:  # no turn went before the answer it quotes had ended, in trace order
        before = [k for (c, k) in ends if c == s.conversation and k < (s.trace_index or 0)]
        if before:
            assert s.start >= (ends[(s.conversation, max(before))] or 0.0) - 1e-9
    # so the follow-ups keep their cached history, where sent when due they lose some of it
    cached = sum(s.cached_tokens or 0 for s in users.samples)
    assert cached == pytest.approx(sum(s.cached_tokens or 0 for s in first.samples), rel=0.1)
    assert cached > sum(s.cached_tokens or 0 for s in loose.samples)
    with pytest.raises(ValueError, match="speed must be above 0"):
        VirtualServer(make()[0], work, 0).resend_as_users(sent, -1.0)


def test_a_users_next_turn_hands_on_its_conversations_keys_the_same_as_hashed_whole(monkeypatch):
    """A user's next prompt begins with its last prompt and answer, whose blocks' prefix-cache
    keys the engine worked out as that turn ended: the next turn hands them on, and the engine
    hashes only the tokens after them (issue 73: hashing each whole conversation again was a
    tenth of the H100's run at 40 requests a second). Every prompt's keys are those of its
    tokens hashed whole, users closed and open alike."""
    from spoc_tui.sim.prefix import PrefixCache
    from spoc_tui.sim.virtual import VirtualServer
    from spoc_tui.workload import load_workload

    real = SimEngine._prompt_keys
    handed = []

    def checked(self, r):
        keys = real(self, r)
        assert keys == PrefixCache.hashes(r.prompt, self.cfg.block_size), r.rid
        handed.append(len(r.keys or ()))
        return keys

    monkeypatch.setattr(SimEngine, "_prompt_keys", checked)
    closed = VirtualServer(make(max_num_seqs=16)[0], load_workload("chatbot"), 12, seed=3)
    closed.advance(120.0)
    opened = VirtualServer(make(max_num_seqs=16)[0], load_workload("chatbot"), 0, seed=4)
    opened.set_rate(3.0)
    opened.advance(120.0)
    assert len(handed) > 200 and sum(1 for n in handed if n) > len(handed) / 3, handed


def test_blocks_no_request_asks_for_are_held_as_a_count_and_evicted_as_their_keys_would_be():
    """PrefixCache.insert's ``unasked``: a run of blocks no request will look up, kept as one count
    in its place. Against the same blocks inserted as keys of their own (never looked up), every
    match, every size and the order of what is held are the same, through evictions that take a
    run whole or in part."""
    import random

    from spoc_tui.sim.prefix import PrefixCache

    for trial in range(200):
        rng = random.Random(trial)
        runs, keyed = PrefixCache(), PrefixCache()
        fresh = 10**6
        for _ in range(200):
            r = rng.random()
            if r < 0.5:
                keys = [rng.randrange(50) for _ in range(rng.randrange(6))]
                n = rng.randrange(5)
                runs.insert(keys, n)
                keyed.insert(keys + list(range(fresh, fresh + n)))
                fresh += n
            elif r < 0.8:
                cap = rng.randrange(0, 60)
                runs.evict_to(cap)
                keyed.evict_to(cap)
            else:
                keys = [rng.randrange(50) for _ in range(rng.randrange(8))]
                assert runs.match(keys) == keyed.match(keys)
            held = [x for k, v in runs._lru.items() for x in ([k] if v is None else ["run"] * v)]
            assert held == [k if k < 10**6 else "run" for k in keyed._lru] and len(runs) == len(keyed) == len(held)
