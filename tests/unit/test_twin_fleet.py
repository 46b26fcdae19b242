"""A trace on a fleet of twins in virtual time: fixed replica counts, autoscaling, the parsers."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.traces.read import TraceRow
from spoc_tui.twin.fleet import (
    FleetSim,
    PolicyError,
    cheapest,
    judge_run,
    parse_autoscale,
    parse_replicas,
)
from tests.unit.test_twin_fit import twin


def rows(n: int = 300, rate: float = 6.0, seed: int = 1) -> list[TraceRow]:
    """Poisson arrivals; every third row shares its first two 16-token blocks with row 0; a few
    follow-ups wait for their parent."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        shared = (1, 2) if i % 3 == 0 else ()
        out.append(
            TraceRow(
                index=i,
                t=t,
                input_tokens=rng.randrange(100, 600),
                output_tokens=rng.randrange(20, 120),
                hash_ids=shared + tuple(1000 * i + k for k in range(3)),
                block_tokens=16,
                id=f"c{i}",
                parent=f"c{i - 1}" if i % 10 == 9 else None,
                think_s=0.5 if i % 10 == 9 else None,
            )
        )
    return out


def test_more_replicas_serve_the_same_trace_faster():
    limits = parse_sla("ttft_p99<=1s")
    trace = rows()
    one = judge_run(FleetSim(twin(0.05), trace, replicas=1).run("1"), limits)
    four = judge_run(FleetSim(twin(0.05), trace, replicas=4).run("4"), limits)
    assert one.step.requests == four.step.requests == len(trace)
    assert four.step.latency.ttft.p99 < one.step.latency.ttft.p99
    assert four.run.replica_hours > one.run.replica_hours
    # the shared leading blocks were served from the prefix cache
    assert sum(s.cached_tokens or 0 for s in one.run.samples) > 0
    # a follow-up started after its parent ended, plus its think time
    by = {s.trace_index: s for s in one.run.samples}
    for i in range(9, len(trace), 10):
        assert by[i].start >= by[i - 1].end + 0.5 - 1e-9


def test_the_cheapest_configuration_that_meets_the_sla_is_named():
    limits = parse_sla("ttft_p99<=300ms")
    results = [judge_run(FleetSim(twin(0.05), rows(), replicas=n).run(str(n)), limits) for n in (1, 2, 4, 8)]
    best = cheapest(results)
    meeting = [r for r in results if r.step.decision == "meets"]
    if meeting:
        assert best is not None and best.run.replica_hours == min(r.run.replica_hours for r in meeting)
    else:
        assert best is None


def test_autoscaling_adds_replicas_under_a_burst_and_drains_them_after():
    # quiet, a burst at 20/s for a minute, quiet again
    trace = rows(60, 0.5) + [
        TraceRow(index=1000 + i, t=130 + i / 20, input_tokens=400, output_tokens=80) for i in range(1200)
    ]
    trace += [TraceRow(index=5000 + i, t=200 + 4 * i, input_tokens=100, output_tokens=20) for i in range(60)]
    trace.sort(key=lambda r: r.t)
    policy = parse_autoscale("num_requests_waiting>=2,cooldown=20s,startup=10s,interval=5s,min=1,max=6")
    run = FleetSim(twin(0.05), trace, autoscale=policy).run("auto")
    assert run.peak_replicas > 1
    assert run.timeline[-1][1] < run.peak_replicas  # drained after the burst
    fixed = FleetSim(twin(0.05), trace, replicas=run.peak_replicas).run("fixed")
    assert run.replica_hours < fixed.replica_hours


def test_parsers_refuse_what_they_cannot_read():
    assert parse_replicas("1-3,8") == [1, 2, 3, 8]
    a = parse_autoscale("num_requests_waiting>=4,cooldown=2m,max=5")
    assert a.waiting == 4 and a.cooldown_s == 120 and a.max_replicas == 5
    for bad in ("0", "3-1", "x", "1-100"):
        with pytest.raises(PolicyError):
            parse_replicas(bad)
    for bad in ("waiting>=4", "num_requests_waiting>=4,cooldown=soon", "num_requests_waiting>=4,min=3,max=2",
                "num_requests_waiting>=4,color=red"):  # fmt: skip
        with pytest.raises(PolicyError):
            parse_autoscale(bad)


def _mooncake(path, n: int = 200, rate: float = 5.0, seed: int = 3):
    """A Mooncake trace: every other row shares its first 512-token block with the others."""
    import json

    rng = random.Random(seed)
    t, lines = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        n_in = rng.randrange(300, 1500)
        blocks = -(-n_in // 512)
        ids = ([1] + [100 * i + k for k in range(blocks - 1)]) if i % 2 else [100 * i + k for k in range(blocks)]
        lines.append(json.dumps({"timestamp": round(t * 1000), "input_length": n_in,
                                 "output_length": rng.randrange(20, 200), "hash_ids": ids}))  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def _trace_prediction(path, plan: str, draws: int = 3, **kw):
    from spoc_tui.core.ramp.knee import parse_speed_plan
    from spoc_tui.core.traces.read import trace_source
    from spoc_tui.twin.predict import Prediction, read_rows
    from spoc_tui.workload import load_workload

    tw = twin(0.05)
    return Prediction(
        twin=tw,
        workload=load_workload("chatbot"),
        plan=parse_speed_plan(plan),
        limits=tuple(parse_sla("ttft_p99<=1s")),
        draws=draws,
        trace=read_rows(trace_source(str(path)), tw.server.max_model_len),
        **kw,
    )


def test_a_trace_replay_is_predicted_at_speed_multiples(tmp_path):
    from spoc_tui.twin.predict import predict, predict_at

    p = _trace_prediction(_mooncake(tmp_path / "t.jsonl"), "0.25,1")
    assert p.trace is not None and p.trace.read == 200 and p.trace.prefix_share and p.trace.prefix_share > 0
    res = predict(p)
    slow, fast = res.runs
    assert [r.step.speed for r in res.runs] == [0.25, 1.0] and res.knee.unit == "x"
    for r in res.runs:  # every row sent once, on the trace's clock divided by the speed
        assert r.step.requests == 200 and r.step.trace is not None and r.step.trace.sent == 200
        assert r.step.trace.rate == pytest.approx(r.step.trace.trace_rate, rel=0.01)
        assert r.seconds >= p.trace.span_s / r.step.speed
    assert fast.step.output_tokens_per_s > 2.5 * slow.step.output_tokens_per_s
    assert fast.step.latency.ttft.p50 >= slow.step.latency.ttft.p50
    # the shared leading blocks were served from the twin's prefix cache
    assert slow.step.trace.server_hit_rate and slow.step.trace.server_hit_rate > 0
    for r, iv in zip(res.runs, res.intervals, strict=True):
        lo, hi = iv["itl_p50"]
        assert lo <= r.step.latency.itl.p50 <= hi
    at = predict_at(p, [(1.0, fast.seconds)])
    assert at.figures[0]["output_tokens_per_s"] == pytest.approx(fast.step.output_tokens_per_s, rel=0.25)


def test_the_speed_search_on_the_twin_answers_and_keeps_to_its_budget(tmp_path):
    from spoc_tui.twin.model import TwinError
    from spoc_tui.twin.predict import predict

    path = _mooncake(tmp_path / "t.jsonl", n=400, rate=4.0)
    res = predict(_trace_prediction(path, "auto", draws=2))
    speeds = [r.step.speed for r in res.runs]
    assert speeds[:2] == [1.0, 2.0] and len(set(speeds)) >= 3
    inf = res.knee.inferred
    assert inf is not None and inf.estimate is not None and inf.ci95[0] is not None and inf.ci95[1] is not None
    assert inf.ci95[0] <= inf.estimate <= inf.ci95[1] and res.knee.unit == "x"
    # the load the replays took, as spoc ramp counts it, stays within the budget
    assert sum(r.seconds for r in res.runs) <= 600
    # a replay longer than the whole budget is refused before anything runs
    with pytest.raises(TwinError, match="more than the budget"):
        predict(_trace_prediction(path, "auto", budget_s=30.0))


def test_a_trace_with_nothing_to_send_is_refused(tmp_path):
    from spoc_tui.core.traces.read import trace_source
    from spoc_tui.twin.model import TwinError
    from spoc_tui.twin.predict import read_rows

    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 900000, "output_length": 10, "hash_ids": []}\n')
    with pytest.raises(TwinError, match="no row to send.*max-model-len"):
        read_rows(trace_source(str(path)), 2048)
    path.write_text('{"timestamp": 0, "input_length": 100}\n')
    with pytest.raises(TwinError, match="line 1"):
        read_rows(trace_source(str(path)), 2048)


def _mixed_rows(n: int = 80, seed: int = 9) -> list[TraceRow]:
    """Rows naming a few shared hash ids in front of their own, 16- or 512-token blocks, scoped."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        bt = rng.choice((16, 16, 512))
        ids = tuple(rng.choice((1, 2, 3, 4)) for _ in range(rng.randint(0, 3))) + tuple(
            100 + 10 * i + k for k in range(rng.randint(0, 4))
        )
        n_in = rng.randint(1, (len(ids) + 1) * bt)
        out.append(TraceRow(i, float(i), n_in, 5, ids, bt, scope=rng.choice((None, None, "c1", "c2")), line=i + 1))
    return out


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two prompts share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_the_fleets_prompts_share_exactly_the_blocks_their_rows_name_alike():
    """block_layout names every block of every row at once: two rows' prompts share a leading
    run of tokens exactly as far as the old block-by-block naming made them (the same hash id,
    scope and length: the same tokens), whatever the block's length, scope or place."""

    from spoc_tui.twin.fleet import FleetSim

    def by_block(rows):  # the naming as it was: a dict of (scope, id, length) -> tokens, in order
        named, nxt, out = {}, 1 << 24, {}
        for row in rows:
            ids, left = [], row.input_tokens
            for h in row.hash_ids:
                n = min(row.block_tokens, left)
                if n <= 0:
                    break
                if (row.scope, h, n) not in named:
                    named[(row.scope, h, n)] = list(range(nxt, nxt + n))
                    nxt += n
                ids += named[(row.scope, h, n)]
                left -= n
            out[row.index] = ids + list(range(nxt, nxt + max(0, left)))
            nxt += max(0, left)
        return out

    rows = _mixed_rows()
    sim = FleetSim(twin(), rows, replicas=1)
    new = {row.index: sim._prompts.prompt(row) for row in rows}
    old = by_block(rows)
    assert all(len(new[r.index]) == r.input_tokens for r in rows)
    for a in rows:
        for b in rows:
            assert _common(new[a.index], new[b.index]) == _common(old[a.index], old[b.index]), (a, b)


def test_a_row_longer_than_the_whole_kv_cache_is_skipped_not_waited_on():
    """Issue 74's critical finding: a twin whose KV cache holds fewer tokens than a row (a server
    reporting a few blocks) waited for it for ever, its polls piling up. Such a row is skipped and
    counted; the replay ends."""
    from dataclasses import replace

    from spoc_tui.twin.fleet import FleetSim

    small = replace(twin(), server=replace(twin().server, num_gpu_blocks=3))
    rows = tuple(TraceRow(i, i * 0.5, 30 if i % 2 else 300, 8, line=i + 1) for i in range(20))
    sim = FleetSim(small, rows, replicas=1, poll_s=1.0)
    run = sim.run()
    assert sim.too_big == sim.skipped == 10 and len(run.samples) == 10
    assert all(s.ok for s in run.samples) and len(sim.polls) < 30


def test_the_engine_refuses_a_request_its_whole_kv_cache_cannot_hold():
    from dataclasses import replace

    from spoc_tui.sim.engine import SimRequest
    from spoc_tui.twin.engine import TwinEngine

    t = [0.0]
    eng = TwinEngine(replace(twin(), server=replace(twin().server, num_gpu_blocks=3)), clock=lambda: t[0])
    big = SimRequest("big", list(range(100)), 10, 10, 0.0)
    eng.add(big)
    eng.add(SimRequest("small", list(range(20)), 5, 5, 0.0))
    for _ in range(50):
        if eng.idle():
            break
        t[0] += eng.step()
        eng.complete(*eng._pending, t[0])
    assert eng.idle() and big.finish_reason == "abort" and eng.stats.success["stop"] + eng.stats.success["length"] == 1


def test_a_replay_that_can_no_longer_move_ends_and_counts_what_it_left(monkeypatch):
    """Issue 74's guard: whatever keeps a request from ever being scheduled (here an engine that
    schedules nothing), a replay with nothing in flight and nothing to come stops at its next
    poll and counts the requests it left, rather than re-arming its poll for ever."""
    from spoc_tui.twin.engine import TwinEngine
    from spoc_tui.twin.fleet import FleetSim

    def schedules_nothing(self: TwinEngine) -> float:
        self._pending = ([], [])
        return 0.0

    monkeypatch.setattr(TwinEngine, "step", schedules_nothing)
    monkeypatch.setattr(TwinEngine, "decode_run", lambda self, *a, **k: pytest.fail("no run expected"), raising=False)
    rows = tuple(TraceRow(i, i * 0.5, 30, 8, line=i + 1) for i in range(6))
    sim = FleetSim(twin(), rows, replicas=2, poll_s=1.0)
    pushes = 0
    push = sim._push

    def bounded(at: float, kind: str, obj: object) -> None:
        nonlocal pushes
        pushes += 1
        assert pushes < 10_000, "the replay never ends"
        push(at, kind, obj)

    monkeypatch.setattr(sim, "_push", bounded)
    run = sim.run()
    assert sim.stalled == sim.skipped == 6 and run.samples == [] and len(sim.polls) <= 5


def test_prompts_given_as_runs_hash_to_the_keys_of_their_ids_laid_out():
    """A trace replay's prompts are runs of consecutive token ids, never laid out as lists (issue
    73): their blocks' keys, worked out for many prompts at once, are those of the ids laid out to
    the bit (the first so many of them where a limit says), and a prompt reads as the list it
    stands for (its length, an id, any slice)."""
    import random

    from spoc_tui.sim.prefix import PrefixCache
    from spoc_tui.twin.rowprompts import RunPrompt

    rng = random.Random(1)
    for bs in (16, 32):
        prompts = []
        for _ in range(200):
            k = rng.randrange(0, 6)
            starts = [rng.randrange(0, 1 << 30) for _ in range(k)]
            lens = [rng.choice((0, 1, 5, bs - 1, bs, 3 * bs + 2, 700)) for _ in range(k)]
            prompts.append((starts, lens))
        limits = [rng.randrange(0, 60) for _ in prompts]
        limited = PrefixCache.of_runs(prompts, bs, limits)
        for (starts, lens), keys, most, head in zip(prompts, PrefixCache.of_runs(prompts, bs), limits, limited,
                                                    strict=True):  # fmt: skip
            ids = [i for s, n in zip(starts, lens, strict=True) for i in range(s, s + n)]
            assert keys == PrefixCache.hashes(ids, bs), (starts, lens)
            assert head == PrefixCache.hashes(ids, bs, most), (starts, lens, most)
            p = RunPrompt(starts, lens)
            assert len(p) == len(ids) and list(p) == ids
            for a, b in ((0, None), (bs, None), (len(ids) // 2, len(ids) - 1), (-3, None), (5, 2)):
                assert p[a:b] == ids[a:b]
            if ids:
                assert p[0] == ids[0] and p[-1] == ids[-1] and p[len(ids) // 3] == ids[len(ids) // 3]
    assert PrefixCache.of_runs([], 16) == [] and PrefixCache.of_runs([((), ())], 16) == [[]]


def test_where_a_rows_prompt_becomes_its_own_no_other_row_shares_a_token_past_it():
    """RowPrompts.own_from: from there on no other row's prompt holds the row's tokens in their
    place (so no request can ever find a block of it that ends past there); rows that name only
    blocks others name too have none, and rows whose first block is their own start there."""
    from spoc_tui.twin.fleet import FleetSim

    rows = _mixed_rows()
    sim = FleetSim(twin(), rows, replicas=1)
    prompts = {row.index: list(sim._prompts.prompt(row)) for row in rows}
    own = {row.index: sim._prompts.own_from(row) for row in rows}

    for a in rows:
        p = own[a.index]
        if p is None:  # every block of it named by another row too
            continue
        assert 0 <= p < a.input_tokens
        assert all(_common(prompts[a.index], prompts[b.index]) <= p for b in rows if b is not a), a
    assert any(p == 0 for p in own.values()) and any(p is not None and p > 0 for p in own.values())
    assert any(p is None for p in own.values())


@pytest.mark.parametrize("kind", ["chat", "mixed"])
def test_a_replay_holds_its_rows_own_blocks_as_a_count_and_serves_every_request_the_same(monkeypatch, kind):
    """Issue 73: a trace row's blocks from where its prompt becomes its own, and its answer's, are
    never looked up by another request; the engine neither offers them while it runs nor hashes
    them at its end, and the prefix cache holds them as a count in their place. Every request's
    times, its cached tokens, the engine's counters and what the cache holds are as when every
    block was hashed and kept by its key, on a KV cache small enough to evict and preempt."""
    from dataclasses import replace

    from spoc_tui.twin.fastreplay import ENV
    from spoc_tui.twin.fleet import FleetSim
    from spoc_tui.twin.rowprompts import RowPrompts

    monkeypatch.setenv(ENV, "python")  # the Python engine's cache (the compiled one is tested against it)
    small = replace(twin(0.05), server=replace(twin(0.05).server, num_gpu_blocks=400))
    # chat: 16-token blocks, a shared head on every third row, follow-ups after their parent;
    # mixed: 16- and 512-token blocks (a row's own part starts inside an engine block), scoped
    trace = rows(400, rate=12.0) if kind == "chat" else [replace(r, t=r.t / 8) for r in _mixed_rows(400)]

    def replayed() -> tuple[object, ...]:
        sim = FleetSim(small, trace, replicas=1)
        run = sim.run()
        eng = sim.replicas[0].engine
        st = eng.stats
        samples = sorted((s.trace_index, s.start, s.ttft, s.itl, s.e2e, s.cached_tokens) for s in run.samples)
        return samples, st.prefix_hits, st.prefix_queries, st.preemptions, len(eng.cache), eng.used_blocks

    fast = replayed()
    monkeypatch.setattr(RowPrompts, "own_from", lambda self, row: None)
    whole = replayed()
    assert fast == whole
    samples, hits, _queries, preemptions, cached, _used = fast
    assert hits > 0 and cached > 0 and len(samples) >= 0.9 * len(trace)  # a few mixed rows outgrow the cache
    assert preemptions > 0 or kind == "mixed"


def test_rows_that_name_one_chain_are_laid_out_and_keyed_as_any_rows_are():
    """Issue 73: a headroom's replay names one chain of blocks (one system prompt) on every row,
    each row its own count of them; its layout skips sorting every row's ids and its keys are a
    slice of the chain's, worked out once. The same runs, the same place each row becomes its own,
    the same next id and the same keys as the general layout and hashing give; rows that are not
    so (another block size, a part block, other ids, a scope) take the general layout."""
    from dataclasses import replace

    from spoc_tui.sim.prefix import PrefixCache
    from spoc_tui.twin.rowprompts import RowPrompts, _any_layout, _one_chain, block_layout

    rng = random.Random(3)
    for case in range(40):
        bt = rng.choice((16, 32))
        n = rng.randrange(1, 60)
        top = rng.randrange(0, 40)
        chain_rows = []
        for i in range(n):
            shared = rng.randrange(0, top + 1) if case % 4 else top  # case 0, 4, ...: every row as long
            extra = rng.choice((0, 1, 7, bt, 300))
            chain_rows.append(TraceRow(i, float(i), shared * bt + extra, 20, tuple(range(shared)), bt))
        chained = _one_chain(chain_rows, 1 << 24)
        if all(not r.hash_ids or r.input_tokens <= 0 for r in chain_rows):
            continue
        assert chained == _any_layout(chain_rows, 1 << 24), case
        for bs in (16, 32):
            prompts = RowPrompts(chain_rows, 1 << 24, bs)
            for r in chain_rows:
                p, keys, own = prompts.take(r)
                limit = len(p) // bs if own is None else own // bs
                assert keys == PrefixCache.of_runs([(p.starts, p.lens)], bs, [limit])[0], (case, r)
    for bs in (16, 32):  # any rows: a run more than one prompt begins with keyed once, the same keys
        mixed = _mixed_rows(200, seed=bs) + rows(200, seed=bs)
        mixed = [replace(r, index=i) for i, r in enumerate(mixed)]
        prompts = RowPrompts(mixed, 1 << 24, bs)
        for r in mixed:
            p, keys, own = prompts.take(r)
            limit = len(p) // bs if own is None else own // bs
            assert keys == PrefixCache.of_runs([(p.starts, p.lens)], bs, [limit])[0], r
        assert prompts._chains  # some runs began more than one prompt
    base = [TraceRow(i, float(i), 100, 20, (0, 1, 2), 16) for i in range(4)]
    for odd in (
        replace(base[1], block_tokens=32),  # another block size
        replace(base[1], input_tokens=40),  # its last named block in part
        replace(base[1], hash_ids=(0, 2)),  # not the chain's ids
        replace(base[1], scope="c1"),
    ):
        rows_ = [base[0], odd, *base[2:]]
        assert _one_chain(rows_, 1 << 24) is None
        assert block_layout(rows_, 1 << 24) == _any_layout(rows_, 1 << 24)
    empty = [replace(r, input_tokens=0) for r in base]  # blocks named, but no prompt holds one
    assert _one_chain(empty, 1 << 24) == _any_layout(empty, 1 << 24) == ({}, 1 << 24, {})


def test_a_headroom_replay_serves_the_same_whether_its_rows_name_their_own_blocks_or_not(monkeypatch):
    """The twin's replays of a traffic name only the blocks its rows share (issue 73: the rows then
    name one chain, laid out at once); the rest of each prompt is its own either way. Every
    request's times and cached tokens and the engine's counters are those of the rows that name
    their own blocks too, on a KV cache small enough to evict and preempt."""
    from dataclasses import replace

    from spoc_tui.twin.fastreplay import ENV
    from spoc_tui.twin.traffic import synth_rows
    from tests.unit.test_headroom import traffic

    monkeypatch.setenv(ENV, "python")  # the Python engine's cache (the compiled one is tested against it)
    small = replace(twin(0.05), server=replace(twin(0.05).server, num_gpu_blocks=300))

    def replayed(name_own: bool) -> tuple[object, ...]:
        rows = synth_rows(traffic(rate=12.0, share=0.6), 60.0, seed=5, name_own=name_own)
        sim = FleetSim(small, rows, replicas=1)
        run = sim.run()
        st = sim.replicas[0].engine.stats
        samples = sorted((s.trace_index, s.start, s.ttft, s.itl, s.e2e, s.cached_tokens) for s in run.samples)
        return samples, st.prefix_hits, st.prefix_queries, st.preemptions, len(sim.replicas[0].engine.cache)

    named, chained = replayed(True), replayed(False)
    assert named == chained
    assert named[1] > 0 and named[3] > 0  # the cache served prefixes and preempted
