"""Trace replay's pure parts: prompts from hash ids, the speed plans, the window, the wire, the
fidelity record and its round trip through ramp.json."""

import json
import math

import pytest

from spoc_tui.core.ramp.inference import KneeEstimate
from spoc_tui.core.ramp.knee import FixedSpeeds, Knee, SpeedSearch, find_knee, parse_speed_plan
from spoc_tui.core.ramp.sla import UsersError, level_text, levels_text, parse_sla
from spoc_tui.core.ramp.steps import RequestSample, StepSummary, TraceFidelity, summarize_step
from spoc_tui.core.results import RampHeader, decode_ramp, encode_ramp
from spoc_tui.core.traces.read import TraceError, TraceSource, parse_window, trace_source
from spoc_tui.load import wire
from spoc_tui.workload import TextMaker, TracePrompts
from tests.unit.test_steps_knee import byte_level_bpe


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tok = byte_level_bpe(folder, "the service returns an error when the queue grows past its limit", 400)
    return tok, TextMaker(str(folder))


def test_prompts_are_exact_and_share_text_where_hash_ids_match(bpe):
    tok, maker = bpe
    p = TracePrompts(maker, "salt")
    a = p.prompt(0, 1000, (1, 2, 3), 512)
    b = p.prompt(1, 1200, (1, 2, 9), 512)
    c = p.prompt(2, 300, (), 0)
    ia, ib = tok.encode(a).ids, tok.encode(b).ids
    assert (len(ia), len(ib), len(tok.encode(c).ids)) == (1000, 1200, 300)
    shared = next(k for k in range(len(ia)) if ia[k] != ib[k])
    # block 1 whole, block 2 as far as a's partial one goes (its words are b's block 2's first ones,
    # but perhaps its last, cut to fit)
    assert 990 <= shared <= 1000, shared
    assert a[: len(a) // 3] == b[: len(a) // 3]
    # unrelated rows share nothing; another salt (the next step) shares nothing with this one
    assert tok.encode(c).ids[:20] != ia[:20]
    q = TracePrompts(maker, "other").prompt(0, 1000, (1, 2, 3), 512)
    assert q[:200] != a[:200]
    # a scope (WEKA's conversation) keeps equal ids apart
    assert p.prompt(3, 600, (1, 2), 512, scope="conv-a")[:100] != a[:100]


def test_prompts_stay_exact_for_every_block_size_and_length(bpe):
    tok, maker = bpe
    p = TracePrompts(maker, "s")
    for block in (16, 64, 512):
        for n in (1, 15, 16, 17, 700):
            ids = tuple(range(math.ceil(n / block)))
            assert len(tok.encode(p.prompt(n, n, ids, block)).ids) == n


def test_speed_plans_parse_and_say_what_they_do():
    assert parse_speed_plan("0.5,1,2").speeds == [0.5, 1.0, 2.0]
    assert parse_speed_plan("auto") == SpeedSearch()
    assert parse_speed_plan("auto:8") == SpeedSearch(max_speed=8.0)
    for bad, msg in (("2,1", "increasing"), ("0", "above 0"), ("x", "speed multiples"), ("auto:0.5", "MAX")):
        with pytest.raises(UsersError, match=msg):
            parse_speed_plan(bad)
    assert level_text(2.5, "x") == "x2.5" and levels_text([0.5, 1], "x") == "x0.5, x1"
    assert FixedSpeeds([1.0, 2.0]).next([]) == 1.0


def _step(i: int, speed: float, ttft: float, n: int = 400) -> StepSummary:
    samples = [
        RequestSample(
            start=100.0 + k * 0.01,
            end=100.5 + k * 0.01,
            step=i,
            users=1,
            ok=True,
            ttft=ttft * (0.8 + 0.4 * k / n),
            e2e=1.0,
        )
        for k in range(n)
    ]
    s = summarize_step(i, 1, samples, 10.0, parse_sla("ttft_p50<=1s"), open_loop=True)
    from dataclasses import replace

    return replace(s, speed=speed)


def test_the_speed_search_doubles_then_narrows():
    plan = SpeedSearch(max_speed=16)
    assert plan.next([]) == 1.0
    s1 = _step(1, 1.0, 0.2)
    bound = Knee(None, None, None, unit="x", inferred=KneeEstimate(1.0, (1.0, None), None, "bound", "x"))
    assert plan.next([s1], bound) == 2.0
    smooth = Knee(None, None, None, unit="x", inferred=KneeEstimate(2.6, (2.0, 3.2), "ttft_p50", "smooth", "x"))
    steps = [s1, _step(2, 2.0, 0.5), _step(3, 4.0, 2.0)]
    assert plan.next(steps, smooth) == 2.6  # the estimate, to two digits
    done = Knee(None, None, None, unit="x", inferred=KneeEstimate(2.6, (2.55, 2.68), "ttft_p50", "smooth", "x"))
    assert plan.next(steps, done) is None  # within 5 % either side
    below = Knee(None, None, None, unit="x", inferred=KneeEstimate(None, (None, 1.0), "ttft_p50", "bound", "x"))
    assert plan.next([_step(1, 1.0, 3.0)], below) == 0.5
    assert find_knee(steps).unit == "x"


def test_the_speed_search_goes_on_inside_a_cliff_whose_midpoint_was_tried():
    """A cliff from x1 to x4 with x2 tried inside it (too few requests there to decide: the told
    bursts case of benchmarks/headroom.py): its midpoint is x2 again, and the search stopped
    with x2 (95 %: 1-4) of a knee at x2.99. It halves the widest part the tried speeds leave."""
    plan = SpeedSearch(max_speed=10)
    steps = [_step(1, 1.0, 0.2), _step(2, 2.0, 0.2), _step(3, 4.0, 2.9)]
    cliff = Knee(None, None, None, unit="x", inferred=KneeEstimate(2.0, (1.0, 4.0), "ttft_p99", "cliff", "x"))
    assert plan.next(steps, cliff) == 1.4  # x1-x2 and x2-x4 are as wide: the lower first
    steps.append(_step(4, 1.4, 0.2))
    assert plan.next(steps, cliff) == 2.8
    steps.append(_step(5, 2.8, 0.9))
    assert plan.next(steps, cliff) in (1.2, 1.7, 2.4, 3.3)  # on, into what is left
    tight = Knee(None, None, None, unit="x", inferred=KneeEstimate(2.9, (2.8, 2.95), "ttft_p99", "cliff", "x"))
    assert plan.next(steps, tight) is None  # within 5 % either side: done


def test_window_and_source_are_checked(tmp_path):
    assert parse_window("10m:5m") == (600.0, 300.0) and parse_window("30:") == (30.0, None)
    for bad in ("5", "a:b", "0:0"):
        with pytest.raises(TraceError, match="--trace-window"):
            parse_window(bad)
    with pytest.raises(TraceError, match="no such file"):
        trace_source(str(tmp_path / "nope.jsonl"))
    f = tmp_path / "t.jsonl"
    f.write_text(
        "".join(json.dumps({"timestamp": 1000 * i, "input_length": 10, "output_length": 2}) + "\n" for i in range(10))
    )
    src = trace_source(str(f), window="2:5", max_rows=3)
    assert src.fmt == "mooncake"
    assert [(r.index, r.t) for r in src.rows()] == [(2, 0.0), (3, 1.0), (4, 2.0)]
    assert TraceSource.from_dict(json.loads(json.dumps(src.as_dict()))) == src
    with pytest.raises(TraceError, match="--trace-max-rows"):
        trace_source(str(f), max_rows=0)


def test_wire_carries_a_replay_step_and_its_end():
    cmd = wire.SetUsers(2, 3, 0.0, speed=1.5, t0=1234.5)
    assert wire.decode_command(wire.encode(cmd)) == cmd
    done = wire.TraceDone(3, 10, 9, {"longer than max-model-len": 1}, 512, 2048, "worker 1")
    assert wire.decode_event(wire.encode(done)) == done
    with pytest.raises(wire.WireError, match="speed"):
        wire.decode_command('{"cmd": "users", "n": 1, "step": 1, "speed": -1, "t0": 0}')


def test_a_replay_step_round_trips_through_ramp_json():
    fid = TraceFidelity(
        rows=41, sent=40, skipped={"longer than max-model-len": 1}, lag_ms=(0.7, 3.4, 3.6), held_back=2,
        rate=5.1, trace_rate=5.1, prefix_share=0.26, server_hit_rate=0.25, cached_share=0.25,
        length_error=(0.0, 1.0, 1.0),
    )  # fmt: skip
    from dataclasses import replace

    step = replace(_step(1, 2.0, 0.3), trace=fid)
    assert step.level == 2.0 and step.unit == "x" and step.level_text == "x2"
    back = StepSummary.from_dict(json.loads(json.dumps(step.as_dict())))
    assert back.trace == fid and back.speed == 2.0
    text = encode_ramp(RampHeader(url="u"), [step], find_knee([step]), "complete", 0.0)
    d = json.loads(text)
    assert d["knee"]["unit"] == "x" and "max_speed_within_sla" in d["knee"]
    run = decode_ramp(d)
    assert run.steps[0].trace == fid and run.knee.unit == "x"
    assert "sent 40/41" in fid.text and "lag p99 3 ms" in fid.text and "2 held by their parent" in fid.text
    # a step written before replays existed has neither
    old = step.as_dict()
    del old["speed"], old["trace"]
    assert StepSummary.from_dict(old).trace is None
