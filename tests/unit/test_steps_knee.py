import math
import random
from dataclasses import replace

import pytest

from spoc_tui.core.ramp.inference import infer_knee
from spoc_tui.core.ramp.knee import (
    MAX_SEARCH_STEPS,
    BisectSearch,
    FixedUsers,
    Knee,
    KneeSearch,
    find_knee,
    measure_on,
    parse_user_plan,
    settle_due,
)
from spoc_tui.core.ramp.sla import SlaError, UsersError, parse_rates, parse_sla, parse_users
from spoc_tui.core.ramp.steps import (
    RequestSample,
    ServerWindow,
    badly_broken,
    point_value,
    queue_unbounded,
    summarize_step,
)
from spoc_tui.workload import TextMaker, Workload, WorkloadError, builtin_names, load_workload, plan_conversation


def test_parse_sla():
    lims = parse_sla("ttft_p99<=2s, itl_p99<=100ms,e2e_mean<30s,error_rate<=1%")
    assert [str(x) for x in lims] == ["ttft_p99<=2s", "itl_p99<=100ms", "e2e_mean<=30s", "error_rate<=1%"]
    assert lims[1].value == pytest.approx(0.1)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "ttft<=2s",
        "ttft_p99>=2s",
        "latency_p99<=1s",
        "ttft_p99<=fast",
        "itl_p99<=100",  # no unit: 100 ms or 100 s? say which
        "ttft_p99<=2s,ttft_p99<=3s",
        "error_rate<=150%",
        "ttft_p99<=0ms",
        ",",  # clauses of nothing: an SLA every step would meet
        " , ,",
    ],
)
def test_bad_sla_names_the_clause(bad):
    with pytest.raises(SlaError):
        parse_sla(bad)


def test_parse_users():
    assert parse_users("1,2,4,8") == [1, 2, 4, 8]
    assert parse_users("geom:1:64") == [1, 2, 4, 8, 16, 32, 64]
    assert parse_users("geom:2:20:3") == [2, 6, 18, 20]
    for bad in ("", "4,2", "0,1", "a", "geom:5:1", "100000000000", "1,100001", "geom:1:1000000000:1.0001"):
        with pytest.raises(ValueError):
            parse_users(bad)
    assert parse_users("100000") == [100_000]


def _s(ttft, e2e, out, ok=True, itl=(0.01,), error=None, end=1.0):
    return RequestSample(
        start=0.0, step=1, users=1, ok=ok, ttft=ttft, e2e=e2e, itl=tuple(itl), output_tokens=out, error=error, end=end
    )


def test_tpot_is_vllm_bench_definition():
    s = _s(0.5, 2.5, 11)
    assert s.tpot == pytest.approx(0.2)
    assert _s(0.5, 2.5, 1).tpot is None


def test_step_summary_goodput_and_percentiles():
    lims = parse_sla("ttft_p99<=1s,tpot_p99<=50ms")
    samples = [_s(0.1, 1.1, 21, end=float(i)) for i in range(8)] + [
        _s(2.0, 3.0, 21, end=8.5),
        _s(None, 0.2, None, ok=False, error="http_5xx", end=9.5),
    ]
    st = summarize_step(1, 4, samples, 10.0, lims)
    assert st.requests == 10 and st.errors == 1 and st.errors_by_kind == {"http_5xx": 1}
    assert st.goodput == pytest.approx(0.8)  # 8 good requests in 10 s
    assert st.request_rate == pytest.approx(1.0)
    assert st.output_tokens_per_s == pytest.approx(9 * 21 / 10)
    assert st.latency.ttft.p50 == pytest.approx(0.1)
    # 9 finished requests cannot bound a p99 from above, nor put it surely over 1 s: undecided
    assert st.verdict.decision == "inconclusive" and st.verdict.ok is False
    assert "9 requests cannot bound a p99 from above (it takes 368: " in st.verdict.reason
    # ITL's gaps are many but move together within a request: the message counts what counts
    rng = random.Random(2)
    gappy = [_s(0.1, 2.0, 300, itl=[rng.uniform(0.005, 0.05) for _ in range(299)], end=float(i)) for i in range(5)]
    itl = summarize_step(1, 1, gappy, 10.0, parse_sla("itl_p99<=50ms"))
    assert itl.decision == "inconclusive"
    assert "itl_p99: 1495 gaps from 5 requests cannot bound a p99 from above" in itl.verdict.reason
    # every figure says how many samples it rests on and its interval
    assert st.latency.ttft.n == 9 and st.latency.ttft.interval("p50") == (
        pytest.approx(0.1),
        pytest.approx(0.1),
    )
    assert st.latency.ttft.interval("p99")[1] is None
    lo, hi = st.ci95.error_rate
    assert lo == pytest.approx(0.0025, abs=1e-4) and hi == pytest.approx(0.445, abs=1e-3)  # Clopper-Pearson, 1 of 10
    assert st.ci95.request_rate[0] <= 1.0 <= st.ci95.request_rate[1]
    # all requests finishing in one moment: nothing tells how a rate varies over time
    one_moment = summarize_step(1, 4, [_s(0.1, 1.1, 21) for _ in range(8)], 10.0, lims)
    assert one_moment.ci95.request_rate == (None, None)


def _step(users, ttft, n, lims, spread=0.0):
    """A step of n requests whose TTFTs run evenly from ttft to ttft + spread."""
    samples = [_s(ttft + spread * i / max(1, n - 1), ttft + 1, 10, end=10.0 * i / n) for i in range(n)]
    return summarize_step(users, users, samples, 10, lims)


def test_decisions_need_the_interval_on_one_side_of_the_limit():
    lims = parse_sla("ttft_p99<=1s")
    assert _step(1, 0.1, 400, lims).decision == "meets"  # 400 samples bound a p99 from above
    assert _step(1, 0.1, 300, lims).decision == "inconclusive"  # 300 cannot, however low they are
    assert _step(1, 1.5, 20, lims).decision == "breaks"  # 20 samples all over the limit: surely over
    straddle = _step(1, 0.5, 1000, lims, spread=1.0)  # p99 near 1.49 s: the whole interval lies above 1 s
    assert straddle.decision == "breaks"
    near = _step(1, 0.0, 1000, lims, spread=1.005)  # the p99 sits right at the limit
    assert near.decision == "inconclusive" and "straddles the limit" in near.verdict.reason


def test_knee_and_early_stop():
    lims = parse_sla("ttft_p99<=1s")
    steps = [_step(1, 0.1, 400, lims), _step(2, 0.2, 400, lims), _step(4, 1.5, 400, lims), _step(8, 5, 400, lims)]
    knee = find_knee(steps)
    assert (knee.meets_level, knee.breaks_level, knee.broken_limit) == (2, 4, "ttft_p99")
    assert not badly_broken(steps[2], 3.0)
    assert "ttft_p99 at least 5.0x its limit" in (badly_broken(steps[3], 3.0) or "")
    assert find_knee(steps[:2]).breaks_level is None
    assert find_knee([_step(1, 3, 50, lims)]).meets_level is None


def test_an_open_loop_knee_is_in_requests_per_second():
    lims = parse_sla("ttft_p99<=1s")
    steps = [_step(1, 0.1, 400, lims), _step(1, 0.2, 400, lims), _step(1, 1.5, 400, lims)]
    steps = [replace(s, rate=rate) for s, rate in zip(steps, (0.5, 2.0, 8.0), strict=True)]
    knee = find_knee(steps)
    assert (knee.meets_level, knee.breaks_level, knee.unit) == (2.0, 8.0, "req/s")
    d = knee.as_dict()
    assert d["max_rate_within_sla"] == 2.0 and d["first_failing_rate"] == 8.0 and "meets_level" not in d
    assert steps[0].as_dict()["rate"] == 0.5 and steps[0].level_text == "0.5 req/s"


@pytest.mark.parametrize("text", ["", "0", "-1", "2,1", "nan", "inf", "1,x", "20000"])
def test_bad_rates(text):
    with pytest.raises(UsersError):
        parse_rates(text)
    assert parse_rates("0.5, 1,2") == [0.5, 1.0, 2.0]


def test_an_empty_step_of_a_stalled_load_generator_says_so_not_too_short():
    """A step where nothing finished because the load generator stalled (its event loop frozen
    seconds: a starved host, a stopped worker) is not too short: its reason is the client's, with
    its remedy, where it said "raise --step-seconds"."""
    from spoc_tui.core.ramp.steps.client import client_health

    lims = parse_sla("ttft_p99<=1s")
    stalled = client_health([("worker 1", 0.0, 0.0, [2.0]), ("worker 1", 6.0, 0.1, [6000.0])], lims)
    st = summarize_step(1, 4, [], 5, lims, client=stalled)
    assert st.verdict.decision == "inconclusive" and "too short" not in st.verdict.reason
    assert "client saturated" in st.verdict.reason and "event-loop lag" in st.verdict.reason
    assert "--workers" in st.verdict.reason
    # stopped through the whole window: no report in it at all, its lag shows only after it
    main = [("main", float(t), 0.01 * t, [1.0]) for t in range(1, 7)]
    quiet = client_health(main, lims, window=(1.0, 5.0), processes=("main", "worker 1"))
    assert quiet.saturated and "worker 1 sent no report for 4 s of the step" in quiet.reason, quiet
    st = summarize_step(1, 4, [], 4, lims, client=quiet)
    assert "stalled" in st.verdict.reason and "too short" not in st.verdict.reason
    both = main + [("worker 1", float(t) + 0.5, 0.01 * t, [1.0]) for t in range(6)]
    assert not client_health(both, lims, window=(1.0, 5.0), processes=("main", "worker 1"), expected=2).saturated
    # a worker stopped before its first report: its name is not known yet, its count is
    unheard = client_health(main, lims, window=(1.0, 5.0), processes=("main",), expected=2)
    assert unheard.saturated and "1 of 2 load-generator processes sent no report yet" in unheard.reason


def test_a_pass_above_a_break_is_named_as_a_contradiction():
    lims = parse_sla("ttft_p99<=1s")
    steps = [_step(1, 0.1, 400, lims), _step(4, 1.5, 400, lims), _step(8, 0.1, 400, lims), _step(16, 0.1, 30, lims)]
    knee = find_knee(steps)
    assert knee.meets_level == 1 and knee.breaks_level == 4
    assert knee.contradicted == (8,) and knee.inconclusive == (16,)


def test_empty_step_is_inconclusive_never_a_breach():
    """The 12-second chatbot step (think time 3-15 s): nothing finished, so nothing is known."""
    st = summarize_step(1, 1, [], 10, parse_sla("ttft_p99<=1s"))
    assert st.verdict.decision == "inconclusive" and "too short for this profile" in st.verdict.reason
    assert st.verdict.broken_limit is None and badly_broken(st, 3) is None
    assert find_knee([st]).as_dict()["inconclusive"] == [1]


def test_bisection_doubles_then_bisects():
    """The search before inference (the benchmark's baseline)."""
    lims = parse_sla("ttft_p99<=1s")
    true_knee = 37
    search = BisectSearch(max_users=1024)
    steps: list = []
    while (u := search.next(steps)) is not None:
        steps.append(_step(u, 0.1 if u <= true_knee else 3.0, 400, lims))
        assert len(steps) < 30
    knee = find_knee(steps)
    assert [s.users for s in steps][:7] == [1, 2, 4, 8, 16, 32, 64]
    assert knee.meets_level <= true_knee < knee.breaks_level
    assert knee.breaks_level - knee.meets_level <= max(1, int(knee.meets_level * 0.05))


def _search(plan, ttft_at, lims, n=120, seed=0):
    """Run a search on synthetic steps: level u's n requests have log-normal TTFTs of median
    ``ttft_at(u)`` (sigma 0.3); the knee is inferred after every step, as the ramp does."""
    rng = random.Random(seed)
    steps, windows, knee = [], [], None
    while (u := plan.next(steps, knee)) is not None:
        samples = [_s(rng.lognormvariate(math.log(ttft_at(u)), 0.3), 2.0, 10, end=10.0 * i / n) for i in range(n)]
        steps.append(summarize_step(len(steps) + 1, u, samples, 10, lims))
        windows.append((u, samples))
        knee = find_knee(steps, infer_knee(windows, lims, seed=seed))
        assert len(steps) <= MAX_SEARCH_STEPS
    return steps, knee


def test_knee_search_infers_the_knee_and_stops_when_its_interval_is_narrow():
    lims = parse_sla("ttft_p90<=1s")
    # TTFT's median grows 6 % a user; its p90 (x e^(1.2816*0.3) = 1.47) crosses 1 s at about 32.0 users
    median = lambda u: 0.1 * math.exp(0.06 * u)  # noqa: E731
    truth = (math.log(1 / 1.469) - math.log(0.1)) / 0.06
    steps, knee = _search(KneeSearch(max_users=256), median, lims)
    levels = [s.users for s in steps]
    assert levels[:7] == [1, 2, 4, 8, 16, 32, 64]  # doubling while no level broke
    inf = knee.inferred
    assert inf.boundary == "smooth" and inf.binding_limit == "ttft_p90"
    lo, hi = inf.ci95
    assert lo <= truth <= hi and (hi - lo <= 0.1 * inf.estimate or math.ceil(hi) - math.floor(lo) <= 1)
    assert len(steps) < 15  # it probed near the estimate, not every count


def test_knee_search_ends_with_a_bound_at_max_or_at_one_user():
    lims = parse_sla("ttft_p90<=1s")
    steps, knee = _search(KneeSearch(max_users=10), lambda u: 0.05, lims)
    assert [s.users for s in steps] == [1, 2, 4, 8, 10]
    assert knee.inferred.boundary == "bound" and knee.inferred.text.startswith("more than 10 users")
    steps, knee = _search(KneeSearch(max_users=64, start=8), lambda u: 5.0, lims)
    assert [s.users for s in steps] == [8, 4, 2, 1]  # halving while every level broke
    assert knee.inferred.text.startswith("fewer than 1 users")
    assert parse_user_plan("auto:64") == KneeSearch(max_users=64) and parse_user_plan("1,2") == FixedUsers([1, 2])
    for bad in ("auto:x", "auto:0", "auto:-3"):
        with pytest.raises(UsersError):
            parse_user_plan(bad)


def test_knee_search_measures_on_only_near_a_limit():
    lims = parse_sla("ttft_p99<=400ms")
    far = _step(1, 0.06, 40, lims)  # a p99 of 60 ms over 40 requests: unbounded above, far under
    near = _step(1, 0.35, 40, lims)
    assert far.decision == near.decision == "inconclusive"
    assert not KneeSearch().extend(far) and KneeSearch().extend(near)
    assert BisectSearch().extend(far)


def test_a_step_where_nothing_ended_is_measured_on():
    """A long profile's requests under load outlast a step: with no figure to judge, the step is
    measured on (the search used to see no break there and double on to its maximum)."""
    lims = parse_sla("ttft_p90<=3s")
    empty = summarize_step(1, 16, [], 30, lims)
    assert empty.decision == "inconclusive" and "no request finished" in empty.verdict.reason
    assert KneeSearch().extend(empty)


def test_at_one_user_the_search_measures_again_until_its_requests_say_it_breaks():
    """Every level broken down to 1 user, but 1 user's few requests cannot say so surely: the
    search first measures a level that surely breaks (an answer needs one end), then 1 user again
    (the budget ends it), where it used to stop after three tries with no answer."""
    lims = parse_sla("ttft_p50<=500ms")

    def _samples(ttfts: list[float]) -> list[RequestSample]:
        return [_s(t, t + 1, 10, end=10.0 * i / len(ttfts)) for i, t in enumerate(ttfts)]

    # three steps at 1 user, 3 requests each, 2 of them over the limit: the median is over it,
    # but 6 of 9 over is no sure sign that most requests are
    unsure = [_step(1, 0.3, 3, lims, spread=0.6) for _ in range(3)]
    knee = find_knee(unsure, infer_knee([(1, _samples([0.3, 0.6, 0.9])) for _ in range(3)], lims))
    assert knee.inferred.estimate is None and knee.inferred.ci95[1] is None  # not surely broken
    assert KneeSearch().next(unsure, knee) == 2  # no end known: above first
    above = [*unsure, _step(2, 0.9, 20, lims)]
    levels = [*[(1, _samples([0.3, 0.6, 0.9])) for _ in range(3)], (2, _samples([0.9] * 20))]
    knee = find_knee(above, infer_knee(levels, lims))
    assert knee.inferred.estimate is None and knee.inferred.ci95 == (None, 2.0)  # "fewer than 2"
    assert KneeSearch().next(above, knee) == 1  # then 1 user again, until it is sure
    sure = [_step(1, 0.6, 20, lims)]
    knee = find_knee(sure, infer_knee([(1, _samples([0.6] * 20))], lims))
    assert knee.inferred.ci95[1] is not None and knee.inferred.ci95[1] <= 1
    assert KneeSearch().next(sure, knee) is None
    assert KneeSearch().stop_reason(sure, knee) == "even 1 user breaks the SLA"


def test_a_step_is_not_measured_on_once_the_knee_is_as_narrow_as_the_search_asks():
    """Near its limit an inconclusive step is measured on, unless the knee inferred with it so far
    already lies between adjacent counts (beside the peers, 3 of a 9-minute search's minutes went
    to deciding a step at 15 users when the knee already lay between 15 and 16)."""
    lims = parse_sla("ttft_p90<=1s")
    rng = random.Random(1)
    median = lambda u: 0.1 * math.exp(0.06 * u)  # noqa: E731  (its p90 crosses 1 s at 32.0 users)

    def window(u, n=120):
        return [_s(rng.lognormvariate(math.log(median(u)), 0.3), 2.0, 10, end=10.0 * i / n) for i in range(n)]

    search = KneeSearch(max_users=256)
    earlier = [(u, window(u, 800)) for u in (8, 16, 31, 32, 33, 64)]
    steps = [summarize_step(i + 1, u, w, 10, lims) for i, (u, w) in enumerate(earlier)]
    near = _step(32, 0.5, 40, lims, spread=0.6)  # a p90 of 1.04 s over 40 requests: undecided, near the limit
    assert near.decision == "inconclusive" and search.extend(near)
    levels = [*earlier, (32, window(32, 40))]
    assert KneeSearch.answered(find_knee([*steps, near], infer_knee(levels, lims)))  # 31-33 users
    assert not measure_on(search, steps, near, levels, lims)
    # with only the far levels the knee is wide: measure on
    wide = [(u, window(u)) for u in (8, 16)]
    few = [summarize_step(i + 1, u, w, 10, lims) for i, (u, w) in enumerate(wide)]
    assert measure_on(search, few, near, [*wide, (32, window(32, 40))], lims)
    assert measure_on(BisectSearch(), steps, near, [], lims) and measure_on(FixedUsers([1]), steps, near, [], lims)


def test_queue_unbounded_only_when_it_keeps_growing():
    assert queue_unbounded([(float(i), 2.0 * i) for i in range(12)])
    assert queue_unbounded([(float(i), 20.0) for i in range(12)]) is None  # steady
    assert queue_unbounded([(float(i), min(i * 3.0, 15.0)) for i in range(20)]) is None  # rose, then settled
    assert queue_unbounded([(float(i), 2.0 * i) for i in range(5)]) is None  # too short to tell
    # empty until two polls caught bursts (users in lockstep): two rises are not a trend (this
    # read "queue unbounded: waiting grew 0 -> 9 in 35 s" before); three rises in a row still are
    assert queue_unbounded([(35 / 9 * i, w) for i, w in enumerate([0.0] * 8 + [5.0, 9.0])]) is None
    assert queue_unbounded([(35 / 9 * i, w) for i, w in enumerate([0.0] * 7 + [4.0, 5.0, 7.0])])
    # bursts read at every phase: as many falls as rises
    assert queue_unbounded([(35 / 9 * i, w) for i, w in enumerate([0.0, 3, 0, 0, 5, 0, 4, 0, 6, 9])]) is None
    # growth in three jumps is still growth
    assert queue_unbounded([(5.0 * i, 0.0) for i in range(5)] + [(25.0, 10.0), (30.0, 20.0), (35.0, 30.0)])


@pytest.mark.parametrize("name", ["coding", "logs", "chatbot", "mix", "agent"])
def test_builtin_profiles_load_and_plan(name):
    p = load_workload(name)
    assert p.name == name
    plan = plan_conversation(p, random.Random(1), TextMaker(), 32768, {})
    assert plan.turns and all(t.max_tokens >= 1 for t in plan.turns)
    assert Workload.from_dict(p.as_dict()).as_dict() == p.as_dict()


def test_builtins_listed():
    assert builtin_names() == ["agent", "chatbot", "coding", "logs", "mix", "tuning"]


def test_the_agent_profile_chains_calls_with_tool_gaps_and_a_growing_context():
    """Issue 53 item 3: sessions of several calls, a tool's time between them drawn from the
    stated distribution, each call's context the whole history (it grows with every call)."""
    p = load_workload("agent")
    rng = random.Random(7)
    calls, gaps = [], []
    for _ in range(200):
        plan = plan_conversation(p, rng, TextMaker(), 32768, {})
        calls.append(len(plan.turns))
        gaps += [p.think_s.sample(rng) for _ in plan.turns[1:]]
    assert 4 <= min(calls) and max(calls) <= 16 and 8 <= sum(calls) / len(calls) <= 12
    assert 1.0 < sorted(gaps)[len(gaps) // 2] < 2.2 and max(gaps) <= 60  # median 1.5 s, capped at a minute
    assert p.system_tokens == 2500


def test_spoc_tune_measures_with_the_chatbots_conversations_and_no_think_time():
    """Issue 16: the default tuning load keeps every user's request in flight (the calibration can
    reach saturation); otherwise it is the chatbot's conversation shape."""
    from spoc_tui.tune.args import TuneArgs

    tuning, chatbot = load_workload(TuneArgs.profile), load_workload("chatbot")
    assert tuning.name == "tuning" and tuning.think_s.sample(random.Random(0)) == 0
    for field in ("system_tokens", "turns", "user_tokens", "output_tokens"):
        assert getattr(tuning, field) == getattr(chatbot, field)


def test_shared_system_prompt_is_the_same_for_every_conversation():
    p = load_workload("coding")
    cache: dict[str, str] = {}
    a = plan_conversation(p, random.Random(1), TextMaker(), None, cache)
    b = plan_conversation(p, random.Random(2), TextMaker(), None, {})
    assert a.system_text == b.system_text and len(a.system_text.split()) == 6000


def test_logs_first_turn_capped_to_context():
    p = load_workload("logs")
    for seed in range(20):
        plan = plan_conversation(p, random.Random(seed), TextMaker(), 4096, {})
        assert len(plan.turns[0].user_text.split()) <= 0.8 * 4096 + 1


@pytest.mark.parametrize(
    "text,msg",
    [
        ("name='x'\nuser_tokn = 3\noutput_tokens=3\nuser_tokens=3", "unknown key 'user_tokn'"),
        ("user_tokens = {dist='gauss', mean=1}\noutput_tokens=3", "unknown dist 'gauss'"),
        ("user_tokens = {dist='uniform', min=1}\noutput_tokens=3", "needs min, max"),
        ("output_tokens = 3", "missing user_tokens"),
        ("user_tokens = 3\noutput_tokens = 3\nsystem_tokens = -1", "system_tokens"),
        ("user_tokens = [\n", "invalid TOML"),
        # a few zeros too many: refused when read, not a user that never finishes its first turn
        ("user_tokens = 3\noutput_tokens = 3\nturns = {dist='constant', value=1e12}", "turns: value must be at most"),
        ("user_tokens = {dist='lognormal', median=100, sigma=1e308}\noutput_tokens=3", "sigma must be at most 4"),
        ("user_tokens = 3\noutput_tokens = inf", "output_tokens: value must be a number"),
        ("user_tokens = 3\noutput_tokens = nan", "output_tokens: value must be a number"),
        ("user_tokens = 3\noutput_tokens = 3\nthink_s = 1e9", "think_s: value must be at most 86,400"),
        ("user_tokens = 3\noutput_tokens = 3\nsystem_tokens = 10000000000", "system_tokens must be a whole number"),
        ("user_tokens = {dist='uniform', min=1, max=9, max_fraction_of_context=2}\noutput_tokens=3", "at most 1"),
    ],
)
def test_profile_typos_are_named(tmp_path, text, msg):
    f = tmp_path / "p.toml"
    f.write_text(text)
    with pytest.raises(WorkloadError, match=msg):
        load_workload(str(f))


def test_a_heavy_tail_draws_no_more_than_its_bound():
    from spoc_tui.workload import MOST, parse_dist

    d = parse_dist("turns", {"dist": "lognormal", "median": 5000, "sigma": 4})
    draws = [d.sample(random.Random(seed)) for seed in range(200)]
    assert max(draws) == MOST["turns"] and min(draws) > 0


def test_unknown_profile_lists_builtins():
    with pytest.raises(WorkloadError, match="built-in: agent, chatbot, coding, logs, mix"):
        load_workload("codin")


def test_replay_profile(tmp_path):
    (tmp_path / "c.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}]}\n'
        '{"turns": [{"user": "a", "max_tokens": 5}]}\n'
    )
    (tmp_path / "r.toml").write_text('replay = "c.jsonl"\noutput_tokens = 50\n')
    p = load_workload(str(tmp_path / "r.toml"))
    assert len(p.replay) == 2
    plan = plan_conversation(p, random.Random(0), TextMaker(), None, {})
    assert plan.turns[0].user_text in ("hi", "a")
    (tmp_path / "bad.jsonl").write_text("{nope\n")
    (tmp_path / "b.toml").write_text('replay = "bad.jsonl"\n')
    with pytest.raises(WorkloadError, match="line 1: not JSON"):
        load_workload(str(tmp_path / "b.toml"))


def byte_level_bpe(folder, text: str, vocab_size: int):
    """A byte-level BPE tokenizer (as the tier's tiny Llama has) trained on ``text``, saved in ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text] * 50, trainer)
    tok.save(str(folder / "tokenizer.json"))
    return tok


def test_text_maker_exact_with_a_tokenizer(tmp_path):
    tok = byte_level_bpe(tmp_path, "the service returns an error when the queue grows past its limit", 400)
    maker = TextMaker(str(tmp_path))
    assert maker.additive  # byte-level BPE splits at spaces: lengths come from per-word counts
    for n in (1, 2, 3, 17, 64, 300, 1000):
        for seed in range(3):
            text = maker.text(n, random.Random(n * 10 + seed))
            assert len(tok.encode(text).ids) == n


def test_a_tokenizer_that_cannot_be_read_is_named(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"x":')
    with pytest.raises(WorkloadError, match=r"tokenizer.json: not a tokenizer.json \(expected"):
        TextMaker(str(tmp_path))  # the library's bare Exception had come out as a traceback
    with pytest.raises(WorkloadError, match="--tokenizer /dev/zero: not a regular file"):
        TextMaker("/dev/zero")  # had been read for ever
    from spoc_tui.load.ramp import RampConfig, RampError

    cfg = RampConfig("http://127.0.0.1:1", load_workload("chatbot"), parse_user_plan("1"), (), tmp_path / "o")
    with pytest.raises(RampError, match="not a tokenizer.json") as e:
        replace(cfg, tokenizer=str(tmp_path)).validate()
    assert e.value.exit_code == 2


def test_text_maker_never_calls_the_tokenizer_per_request_when_counts_add_up(tmp_path, monkeypatch):
    byte_level_bpe(tmp_path, "the cache holds recent blocks of tokens", 300)
    maker = TextMaker(str(tmp_path))
    calls = []
    monkeypatch.setattr(maker, "_count", lambda text: calls.append(text) or 0)
    maker.text(200, random.Random(0))
    assert calls == []


def test_text_maker_exact_when_tokens_cross_spaces(tmp_path):
    """A tokenizer without a whitespace pre-tokenizer can merge across words: per-word sums are not
    exact, the check at build says so and the slower encode-and-cut path keeps lengths exact."""
    from tokenizers import Tokenizer, decoders, models, trainers

    tok = Tokenizer(models.BPE())
    tok.decoder = decoders.BPEDecoder()
    trainer = trainers.BpeTrainer(vocab_size=600)
    tok.train_from_iterator(["the service returns an error when the queue grows"] * 200, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    maker = TextMaker(str(tmp_path))
    assert not maker.additive
    for n in (1, 17, 120):
        assert len(tok.encode(maker.text(n, random.Random(n))).ids) == n


def test_text_maker_learns_word_counts_from_any_counter(tmp_path):
    """What the runner does with a server's /tokenize: counts from a function, lengths then exact,
    and calibration from usage (which would drift them) is off."""
    tok = byte_level_bpe(tmp_path, "the queue grows past its limit when requests wait", 350)
    calls: list[str] = []

    def count(text: str) -> int:
        calls.append(text)
        return len(tok.encode(text).ids)

    maker = TextMaker()
    assert maker.learn(count) and maker.additive
    learned = len(calls)
    assert learned < 200  # a bounded number of calls, once, before any request
    for n in (1, 3, 40, 200, 900):
        assert len(tok.encode(maker.text(n, random.Random(n))).ids) == n
    assert len(calls) == learned  # no counting per request
    maker.calibrate(100, 500)
    assert maker.tokens_per_word == 1.0


def test_text_maker_keeps_calibrating_when_counts_do_not_add_up():
    maker = TextMaker()
    assert not maker.learn(lambda text: len(text) // 3 + 1)  # characters, not words: sums are off
    assert not maker.additive
    maker.calibrate(100, 134)
    assert maker.tokens_per_word != 1.0


def test_text_maker_calibrates_from_usage():
    m = TextMaker()
    for _ in range(30):
        m.calibrate(100, 134)  # the server counts 1.34 tokens per word
    assert m.tokens_per_word == pytest.approx(1.34, rel=0.02)
    assert len(m.text(134, random.Random(0)).split()) == 100


def test_zero_and_uniform_distributions_round_trip(tmp_path):
    f = tmp_path / "z.toml"
    f.write_text(
        'user_tokens = {dist = "uniform", min = 0, max = 5}\noutput_tokens = 1\nthink_s = 0\nturns = {dist = "normal", mean = 3, sd = 0}\n'
    )
    p = load_workload(str(f))
    assert Workload.from_dict(p.as_dict()) == p


def test_ramp_json_writes_nan_as_null(tmp_path):
    import json as _json

    from spoc_tui.core.results import RampHeader
    from spoc_tui.load.ramp import ResultWriter

    lims = parse_sla("ttft_p99<=1s")
    step = summarize_step(
        1, 1, [_s(0.1, 1.0, 5)], 10, lims, server=ServerWindow(seen=True, kv_cache_usage_max=math.nan)
    )
    w = ResultWriter(tmp_path, RampHeader(url="http://x"))
    w.write([step], find_knee([step]), "complete")
    w.close()
    doc = _json.loads((tmp_path / "ramp.json").read_text())
    assert doc["steps"][0]["server"]["kv_cache_usage_max"] is None


def test_a_step_whose_requests_mostly_fail_breaks_even_without_an_error_limit():
    lims = parse_sla("ttft_p90<=1s")
    failing = [_s(None, 0.1, None, ok=False, error="http_4xx") for _ in range(30)] + [_s(0.1, 1.1, 10)]
    st = summarize_step(1, 1, failing, 10, lims)
    assert st.decision == "breaks" and st.verdict.broken_limit == "error_rate"
    assert "at least" in (badly_broken(st, 3.0) or "")


def test_client_health_flags_a_saturated_load_generator():
    from spoc_tui.core.ramp.steps import client_health

    calm = [("main", float(t), 0.2 * t, [0.1] * 20) for t in range(10)]  # 20 % of a core, 0.1 ms lags
    h = client_health(calm)
    assert h.cpu_pct == pytest.approx(20.0) and h.loop_lag_p99_ms == pytest.approx(0.1)
    assert not h.saturated and h.saturated_text is None
    busy = calm + [("worker w1", float(t), 0.97 * t, [0.2] * 19 + [30.0]) for t in range(10)]
    h = client_health(busy)
    assert h.saturated and "CPU 97 % of a core" in h.reason and "lag p99" in h.reason
    assert {p.name for p in h.processes} == {"main", "worker w1"}
    assert client_health([]).as_dict() == {}
    # a lag that cannot move a verdict is not a saturated client: 1.5 ms against a 400 ms limit
    jittery = [("main", float(t), 0.05 * t, [1.5] * 20) for t in range(10)]
    assert client_health(jittery).saturated  # no limit to judge it against: 1 ms
    assert not client_health(jittery, parse_sla("ttft_p99<=400ms")).saturated
    late = client_health(jittery, parse_sla("ttft_p99<=400ms,itl_p99<=50ms"))
    assert late.saturated and "over the 1.0 ms that matters" in late.reason


def test_workers_auto_sizes_by_streams_and_cores():
    from spoc_tui.core.ramp.knee import FixedRates
    from spoc_tui.load.ramp import auto_workers

    assert auto_workers(FixedUsers([1, 8, 32]), 16) == 0  # one process is enough for 32 streams
    assert auto_workers(FixedUsers([64, 512]), 16) == 8
    assert auto_workers(FixedUsers([512]), 2) == 0  # a single spare core: a worker would only add a hop
    assert auto_workers(KneeSearch(max_users=1024), 8) == 7
    assert auto_workers(FixedRates([10.0, 100.0]), 16) == 7  # 100 req/s x 4 s in flight


def test_a_profile_may_ask_for_every_planned_token(tmp_path):
    p = tmp_path / "flat.toml"
    p.write_text('name = "flat"\nuser_tokens = 200\noutput_tokens = 128\nignore_eos = true\n')
    prof = load_workload(str(p))
    assert prof.ignore_eos and Workload.from_dict(prof.as_dict()).ignore_eos
    p.write_text('name = "flat"\nuser_tokens = 200\noutput_tokens = 128\nignore_eos = "yes"\n')
    with pytest.raises(WorkloadError, match="ignore_eos must be true or false"):
        load_workload(str(p))


def test_arrivals_say_how_bunched_the_requests_came():
    from spoc_tui.core.ramp.steps import arrivals

    rng = random.Random(3)
    t, poisson = 0.0, []
    for _ in range(400):
        t += rng.expovariate(10.0)
        poisson.append(t)
    calm = arrivals(poisson)
    assert 0.7 < calm.synchronization < 1.3 and not calm.lockstep and calm.text == ""
    bursts = [k * 1.5 + rng.uniform(0, 0.01) for k in range(30) for _ in range(16)]  # 16 at a time
    bunched = arrivals(bursts)
    assert bunched.synchronization > 8 and bunched.burst == 16 and bunched.lockstep
    assert bunched.text == "arrivals in lockstep: prefill bursts of 16"
    assert arrivals(poisson[:10]).synchronization is None  # too few to say
    # the knee's why names it; without a server-side cause it is the cause
    lims = parse_sla("ttft_p99<=100ms")
    step = replace(_step(16, 0.3, 40, lims), arrivals=bunched)
    assert step.decision == "breaks"
    why = find_knee([step]).why
    assert why.cause == "lockstep" and why.text.startswith("arrivals in lockstep: prefill bursts of 16")


def test_users_start_apart_then_send_as_their_answers_end_unless_lockstep_is_asked():
    from spoc_tui.workload import START_JITTER_S, jitter

    rng = random.Random(0)
    assert 0 < jitter(rng, None) <= START_JITTER_S
    # a later turn is sent as the answer ends (issue 77): the profile's think time paces it
    assert jitter(rng, 2.0) == 0.0 and jitter(rng, 0.01) == 0.0
    assert jitter(rng, None, lockstep=True) == jitter(rng, 2.0, lockstep=True) == 0.0


def test_the_knees_interval_is_drawn_on_the_levels_run():
    from spoc_tui.core.ramp.inference import KneeEstimate
    from spoc_tui.core.ramp.text import interval_strip

    knee = find_knee([])
    assert interval_strip(knee, [1, 2]) == ""  # nothing inferred yet
    wide = replace(knee, inferred=KneeEstimate(64.0, (64.0, 128.0), "ttft_p99", "cliff"))
    strip = interval_strip(wide, [1, 2, 4, 8, 16, 32, 64, 128], width=15)
    assert strip == "1 ············●━━ 128 users"
    narrow = replace(knee, inferred=KneeEstimate(20.0, (18.0, 22.0), "ttft_p99", "smooth"))
    assert interval_strip(narrow, [1, 64], width=15, ascii_only=True) == "1 ..........o.... 64 users"


def test_knee_search_probes_on_past_a_cliff_whose_interval_is_open():
    """CI16: a cliff between 8 and 16 users whose resampling left the top open (a replicate
    never crossed) ended the search with no answer and no reason; it now closes the top first
    (a level above every one measured), then probes inside it."""
    from spoc_tui.core.ramp.inference import KneeEstimate

    lims = parse_sla("ttft_p50<=300ms")
    steps = [_step(u, 0.05 if u <= 8 else 0.5, 40, lims) for u in (1, 2, 4, 8, 16)]
    open_cliff = replace(find_knee(steps), inferred=KneeEstimate(8, (8, None), "ttft_p50", "cliff", "users", 5, 200))
    # 16 surely broke: the top is closed there, and nothing above it is measured (issue 54): the
    # counts still unknown, 9-15, are split in the middle
    assert KneeSearch(max_users=64).next(steps, open_cliff) == 12
    unsure = [*steps[:4], _step(16, 0.5, 3, lims)]  # over the limit, but not surely: the top is closed first
    assert unsure[-1].decision == "inconclusive"
    assert KneeSearch(max_users=64).next(unsure, open_cliff) == 32
    assert KneeSearch(max_users=16).next(unsure, open_cliff) == 16  # at MAX: MAX again
    closed = replace(open_cliff, inferred=KneeEstimate(8, (8, 16), "ttft_p50", "cliff", "users", 5, 200))
    assert KneeSearch(max_users=64).next(steps, closed) == 12


def test_nothing_above_a_surely_broken_level_is_measured_and_the_unknown_is_split():
    """Issue 54: after ITL broke at 128 users a search measured 256 and 160 to bound a TTFT
    crossing that could not bind; after 16 broke, it walked down 15 and 14 (each breaking) and never
    measured between 8 and 14. The knee is the lowest crossing."""
    from spoc_tui.core.ramp.inference import KneeEstimate

    lims = parse_sla("ttft_p50<=300ms")
    steps = [_step(u, 0.05 if u <= 8 else 0.9, 40, lims) for u in (1, 2, 4, 8, 16)]
    assert steps[-1].decision == "breaks" and steps[3].decision == "meets"
    search = KneeSearch(max_users=256)
    low_open = replace(find_knee(steps), inferred=KneeEstimate(13.9, (None, 14), "ttft_p50", "smooth", "users", 5, 200))
    assert search.next(steps, low_open) == 12  # the middle of 9-15, not 15 or 14
    high_open = replace(find_knee(steps), inferred=KneeEstimate(20, (10, None), "ttft_p50", "smooth", "users", 5, 200))
    assert search.next(steps, high_open) == 13  # never above 16: the middle of 11-15
    at12 = [*steps, _step(12, 0.9, 40, lims)]
    assert search.next(at12, low_open) == 10
    adjacent = [*at12, _step(10, 0.9, 40, lims), _step(9, 0.9, 40, lims)]
    assert search.next(adjacent, low_open) is None
    assert "adjacent counts" in search.stop_reason(adjacent, low_open)


def test_a_cliff_whose_middle_was_measured_is_probed_on_and_every_stop_says_why():
    """CI31: a cliff bracket of 12-14 users whose middle (13) had been measured ended the search
    silently, neither narrow nor out of budget; it now measures inside the bracket until each
    count there has its repeats, and the ramp says why any search stopped."""
    from spoc_tui.core.ramp.inference import KneeEstimate
    from spoc_tui.core.ramp.knee import REPEATS_AT_A_LEVEL

    lims = parse_sla("ttft_p50<=300ms")
    steps = [_step(u, 0.05 if u <= 12 else 0.5, 40, lims) for u in (1, 2, 4, 8, 16, 12, 14, 13)]
    cliff = replace(find_knee(steps), inferred=KneeEstimate(12, (12, 14), "ttft_p50", "cliff", "users", 5, 200))
    search = KneeSearch(max_users=64)
    assert search.next(steps, cliff) == 13  # measured once: again
    wider = replace(cliff, inferred=KneeEstimate(12, (11, 15), "ttft_p50", "cliff", "users", 5, 200))
    wide_steps = [s for s in steps if s.users != 14]
    assert search.next(wide_steps, wider) == 14  # an inside count not yet measured comes first
    done = steps + [_step(13, 0.3, 40, lims) for _ in range(REPEATS_AT_A_LEVEL - 1)]
    assert search.next(done, cliff) is None
    assert search.stop_reason(done, cliff).startswith("every user count inside the knee's interval was measured")
    adjacent = replace(cliff, inferred=KneeEstimate(4, (4, 5), "ttft_p50", "cliff", "users", 5, 200))
    assert search.next(steps, adjacent) is None
    assert search.stop_reason(steps, adjacent) == "the knee lies between adjacent user counts"
    tight = replace(cliff, inferred=KneeEstimate(40, (39, 41), "ttft_p50", "smooth", "users", 5, 200))
    assert search.stop_reason(steps, tight).startswith("the knee's interval is within 5 %")
    top = replace(cliff, inferred=KneeEstimate(64, (64, None), "ttft_p50", "bound", "users", 5, 200))
    assert "no level up to 64 users" in search.stop_reason([*steps, _step(64, 0.05, 40, lims)], top)


def test_a_step_near_the_knee_is_measured_on_while_no_level_shows_it_within():
    """A p99 of 60 ms against 400 ms over 60 requests is far under its limit, but shows nothing
    (368 requests bound a p99): while no level has shown the SLA met, the knee's interval has no
    low end, and a step at or just below the estimate is where more requests can show it. (On the
    simulator the search spent its budget on fresh counts of 80 requests each, none measured on.)"""
    lims = parse_sla("ttft_p99<=400ms")
    fast = lambda n: [_s(0.06, 1.0, 10, end=10.0 * i / n) for i in range(n)]  # noqa: E731
    slow = [_s(1.5, 2.5, 10, end=10.0 * i / 60) for i in range(60)]
    earlier = [(8, fast(60)), (16, fast(60)), (64, slow)]
    steps = [summarize_step(i + 1, u, w, 10, lims) for i, (u, w) in enumerate(earlier)]
    search = KneeSearch(max_users=256)
    for users, expected in ((32, True), (8, False)):
        step = _step(users, 0.06, 60, lims)
        assert step.decision == "inconclusive" and not search.extend(step)  # far under its limit
        levels = [*earlier, (users, fast(60))]
        knee = find_knee([*steps, step], infer_knee(levels, lims))
        assert knee.inferred is not None and knee.inferred.ci95[0] is None, knee.inferred
        assert measure_on(search, steps, step, levels, lims) is expected, (users, knee.inferred)
    # with enough requests at 32 users the low end is shown: nothing more to measure there
    levels = [*earlier, (32, fast(400))]
    step = _step(32, 0.06, 400, lims)
    knee = find_knee([*steps, step], infer_knee(levels, lims))
    assert knee.inferred is not None and knee.inferred.ci95[0] is not None and knee.inferred.ci95[0] >= 32
    assert not KneeSearch.closes_low_end(step, knee)


def test_the_knee_sentence_says_even_only_when_nothing_ran_below_the_break():
    from spoc_tui.core.ramp.text import knee_sentence

    alone = Knee(None, 2.0, "ttft_p99")
    assert knee_sentence(alone) == ("knee: even 2 users break the SLA (ttft_p99)", "breaks_at_once")
    # lower levels ran but none was decided (short steps under a p99): not "even 128 users break"
    below = Knee(None, 128.0, "ttft_p99", inconclusive=(1.0, 64.0, 124.0))
    text, tone = knee_sentence(below)
    assert text.startswith("knee: no step surely met the SLA; 128 users break it (ttft_p99)") and tone == "breaks"


def test_knee_search_closes_an_open_high_end_before_narrowing():
    """A p50 of two kinds of request (a cache hit's 14 ms, a long prompt's 1.5 s) barely moves with
    load until the server is full: the steps near the knee cannot tell which side they are on, and
    narrowing there left both ends open at the end of the budget (8 of 20 searches of the
    simulator's logs profile). The search first measures a level that surely breaks, so at
    worst it answers "fewer than N"."""
    lims = parse_sla("ttft_p50<=500ms")
    rng = random.Random(4)

    def fast_share(u: int) -> float:  # 58 % fast at 1 user, 49 % at 6: the p50 crosses near 5
        return 0.05 if u >= 12 else 0.60 - 0.018 * u

    steps, windows, knee = [], [], None
    plan = KneeSearch(max_users=256)
    while len(steps) < 10 and (u := plan.next(steps, knee)) is not None:
        n = 12
        samples = [_s(0.014 if rng.random() < fast_share(u) else 1.5, 3.0, 10, end=10.0 * i / n) for i in range(n)]
        steps.append(summarize_step(len(steps) + 1, u, samples, 10, lims))
        windows.append((u, samples))
        knee = find_knee(steps, infer_knee(windows, lims))
        inf = knee.inferred
        if inf is not None and inf.ci95[1] is None and inf.estimate is not None and inf.boundary != "bound":
            # an open high end: the next level is above every level measured
            nxt = plan.next(steps, knee)
            assert nxt is not None and nxt > max(s.users for s in steps), [s.users for s in steps]
    assert knee.inferred.ci95[1] is not None  # an answer with its high end
    assert max(s.users for s in steps) >= 12  # it went where the limit surely breaks


def test_a_knee_search_step_settles_early_only_when_its_next_level_is_plain():
    """A search's step ends before its window when more requests could not change the next level:
    far under every limit while the search still doubles. A step near a limit, under a level
    that came near one, or far over one, runs its window."""
    lims = parse_sla("ttft_p99<=400ms,error_rate<=5%")
    plan = KneeSearch(max_users=256)

    def settled(steps, users, ttft, n, spread=0.0):
        window = [_s(ttft + spread * i / max(1, n - 1), ttft + 1, 10, end=10.0 * i / n) for i in range(n)]
        return plan.settled(steps, users, window, lims)

    assert "doubles" in (settled([], 1, 0.05, 30) or "")
    assert settled([], 1, 0.05, 19) is None  # too few requests to say anything yet
    assert settled([], 1, 0.25, 30) is None  # over half its limit: it came near
    near = _step(8, 0.3, 200, lims)
    assert settled([near], 16, 0.05, 30) is None  # a level came near: the search no longer doubles
    assert settled([_step(4, 0.05, 30, lims)], 2, 0.05, 30) is None  # below a level it ran
    far = _step(32, 0.9, 30, lims)
    assert far.decision == "breaks" and settled([near], 32, 0.9, 30) is None  # cut short it would read low
    failing = [_s(0.05, 1.05, 10, end=i / 3) for i in range(27)] + [_s(None, None, 0, ok=False, error="500")] * 3
    assert plan.settled([], 1, failing, lims) is None  # 10 % errors against a 5 % limit
    # asked a few seconds apart from a third of the planned window on, never after it
    assert settle_due(10, 30, 0) and not settle_due(9.9, 30, 0)
    assert not settle_due(10, 30, 1) and settle_due(15, 30, 1) and not settle_due(30, 30, 4)


def test_a_point_value_is_the_figure_the_step_summary_judges():
    rng = random.Random(3)
    window = [
        _s(rng.uniform(0.01, 0.5), rng.uniform(1, 3), 20, itl=tuple(rng.uniform(0.005, 0.05) for _ in range(19)))
        for _ in range(60)
    ] + [_s(None, None, 0, ok=False, error="http 500")]
    lims = parse_sla("ttft_p99<=1s,itl_p90<=40ms,tpot_mean<=60ms,e2e_p50<=2s,error_rate<=5%")
    step = summarize_step(1, 4, window, 10, lims)
    for lim in lims:
        assert point_value(window, lim.metric, lim.stat) == pytest.approx(step.value(lim)), lim
    assert point_value([], "ttft", "p99") is None and point_value(window[-1:], "ttft", "p99") is None


def test_listed_plans_run_their_levels_in_order_and_describe_them_as_result_files_keep_them():
    from spoc_tui.core.ramp.knee import FixedRates, FixedSpeeds, FixedUsers, KneeSearch, Listed

    plans = [FixedUsers([1, 2, 100_000]), FixedRates([0.5, 2.0]), FixedSpeeds([0.25, 1.0])]
    assert [p.describe() for p in plans] == ["1,2,100000", "rate:0.5,2", "speed:0.25,1"]
    assert all(isinstance(p, Listed) for p in plans) and not isinstance(KneeSearch(), Listed)
    users = plans[0]
    assert [users.next([None] * k) for k in range(4)] == [1, 2, 100_000, None]
    assert plans[1].levels == [0.5, 2.0] and plans[2].next([]) == 0.25


def test_a_silent_load_generator_is_named_not_taken_for_a_short_step():
    """Issue 74: a load generator stopped with SIGSTOP made every step say "raise --step-seconds".
    Each of its processes reports once a second: one silent past SILENT_S is named."""
    from spoc_tui.core.ramp.steps.client import SILENT_S, silent

    heard = {"main": 100.0, "worker 2": 100.0}
    assert silent(heard, 100.0 + SILENT_S) is None and silent({}, 1e9) is None
    heard["worker 2"] = 90.0
    why = silent(heard, 100.0 + SILENT_S)
    assert why is not None and why.startswith("the load generator (worker 2) has reported nothing for 25 s")
    assert "stopped (SIGSTOP?) or hung" in why
    assert "its main process" in (silent({"main": 0.0}, 60.0) or "")


def test_a_server_that_went_away_within_a_step_is_told_from_one_that_broke_its_sla():
    """A server that dies a few seconds into a step answered its first requests and refused the rest:
    the step reads as one that broke its SLA badly, and the ramp stopped early with exit 0 (a CI run
    of the e2e test, 2026-12-08). Its last requests, from the last answered on, all failed (refused,
    answered 5xx, their stream cut), one refused and at least three: the server went away. A refusal
    the server recovered from, a tail of 5xx or timeouts alone, or two refusals are not."""
    from spoc_tui.core.ramp.steps import went_away

    answered = [_s(0.1, 1.0, 10, end=float(i)) for i in range(5)]

    def failed(kind, at):
        return _s(None, 0.1, None, ok=False, error=kind, end=at)

    cut = [failed("stream", 5.1), failed("connect", 5.2), failed("connect", 6.0), failed("connect", 8.0)]
    assert went_away(answered + cut) == (4, ["connect", "stream"])
    lims = parse_sla("ttft_p99<=1s")
    assert badly_broken(summarize_step(1, 4, answered + cut * 4, 10, lims), 3.0)  # what the ramp read before
    assert went_away(answered) is None
    refused = [failed("connect", 0.5 + i / 4) for i in range(6)]
    assert went_away(refused + answered) is None  # refused at first, then answered: it came back
    assert went_away(answered + [failed("http_5xx", 6.0 + i) for i in range(5)]) is None  # overloaded, not gone
    assert went_away(answered + [failed("connect", 6.0), failed("connect", 7.0)]) is None  # too few to tell
    assert went_away(answered + [failed("connect", 6.0), failed("timeout", 7.0), failed("connect", 8.0)]) is None
    assert went_away([failed("connect", 1.0 + i) for i in range(3)]) == (3, ["connect"])
