import random

import pytest

from spoc_tui.core.loadmath import (
    RequestSample,
    SlaError,
    badly_broken,
    find_knee,
    parse_sla,
    parse_users,
    summarize_step,
)
from spoc_tui.load.profiles import Profile, ProfileError, TextMaker, builtin_names, load_profile, plan_conversation


def test_parse_sla():
    lims = parse_sla("ttft_p99<=2s, itl_p99<=100ms,e2e_mean<30,error_rate<=1%")
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
        "ttft_p99<=2s,ttft_p99<=3s",
        "error_rate<=150%",
        "ttft_p99<=0ms",
    ],
)
def test_bad_sla_names_the_clause(bad):
    with pytest.raises(SlaError):
        parse_sla(bad)


def test_parse_users():
    assert parse_users("1,2,4,8") == [1, 2, 4, 8]
    assert parse_users("geom:1:64") == [1, 2, 4, 8, 16, 32, 64]
    assert parse_users("geom:2:20:3") == [2, 6, 18, 20]
    for bad in ("", "4,2", "0,1", "a", "geom:5:1"):
        with pytest.raises(ValueError):
            parse_users(bad)


def _s(ttft, e2e, out, ok=True, itl=(0.01,), error=None, end=1.0):
    return RequestSample(
        start=0.0, step=1, users=1, ok=ok, ttft=ttft, e2e=e2e, itl=tuple(itl), output_tokens=out, error=error
    )


def test_tpot_is_vllm_bench_definition():
    s = _s(0.5, 2.5, 11)
    assert s.tpot == pytest.approx(0.2)
    assert _s(0.5, 2.5, 1).tpot is None


def test_step_summary_goodput_and_percentiles():
    lims = parse_sla("ttft_p99<=1s,tpot_p99<=50ms")
    samples = [_s(0.1, 1.1, 21) for _ in range(8)] + [_s(2.0, 3.0, 21), _s(None, 0.2, None, ok=False, error="http_5xx")]
    st = summarize_step(1, 4, samples, 10.0, lims)
    assert st.requests == 10 and st.errors == 1 and st.errors_by_kind == {"http_5xx": 1}
    assert st.goodput == pytest.approx(0.8)  # 8 good requests in 10 s
    assert st.request_rate == pytest.approx(1.0)
    assert st.output_tokens_per_s == pytest.approx(9 * 21 / 10)
    assert st.latency["ttft"]["p50"] == pytest.approx(0.1)
    assert st.verdict["ok"] is False and st.verdict["broken_limit"] == "ttft_p99"


def test_knee_and_early_stop():
    lims = parse_sla("ttft_p99<=1s")
    mk = lambda users, ttft: summarize_step(users, users, [_s(ttft, ttft + 1, 10) for _ in range(20)], 10, lims)  # noqa: E731
    steps = [mk(1, 0.1), mk(2, 0.2), mk(4, 1.5), mk(8, 5)]
    knee = find_knee(steps)
    assert knee.as_dict() == {"max_users_within_sla": 2, "first_failing_users": 4, "broken_limit": "ttft_p99"}
    assert not badly_broken(steps[2], 3.0) and badly_broken(steps[3], 3.0)
    assert find_knee(steps[:2]).first_failing_users is None
    assert find_knee([mk(1, 3)]).max_users_within_sla is None


def test_empty_step_is_no_requests():
    st = summarize_step(1, 1, [], 10, parse_sla("ttft_p99<=1s"))
    assert st.verdict["broken_limit"] == "no_requests" and badly_broken(st, 3)


@pytest.mark.parametrize("name", ["coding", "logs", "chatbot", "mix"])
def test_builtin_profiles_load_and_plan(name):
    p = load_profile(name)
    assert p.name == name
    plan = plan_conversation(p, random.Random(1), TextMaker(), 32768, {})
    assert plan.turns and all(t.max_tokens >= 1 for t in plan.turns)
    assert Profile.from_dict(p.as_dict()).as_dict() == p.as_dict()


def test_builtins_listed():
    assert builtin_names() == ["chatbot", "coding", "logs", "mix"]


def test_shared_system_prompt_is_the_same_for_every_conversation():
    p = load_profile("coding")
    cache: dict[str, str] = {}
    a = plan_conversation(p, random.Random(1), TextMaker(), None, cache)
    b = plan_conversation(p, random.Random(2), TextMaker(), None, {})
    assert a.system_text == b.system_text and len(a.system_text.split()) == 6000


def test_logs_first_turn_capped_to_context():
    p = load_profile("logs")
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
    ],
)
def test_profile_typos_are_named(tmp_path, text, msg):
    f = tmp_path / "p.toml"
    f.write_text(text)
    with pytest.raises(ProfileError, match=msg):
        load_profile(str(f))


def test_unknown_profile_lists_builtins():
    with pytest.raises(ProfileError, match="built-in: chatbot, coding, logs, mix"):
        load_profile("codin")


def test_replay_profile(tmp_path):
    (tmp_path / "c.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}]}\n'
        '{"turns": [{"user": "a", "max_tokens": 5}]}\n'
    )
    (tmp_path / "r.toml").write_text('replay = "c.jsonl"\noutput_tokens = 50\n')
    p = load_profile(str(tmp_path / "r.toml"))
    assert len(p.replay) == 2
    plan = plan_conversation(p, random.Random(0), TextMaker(), None, {})
    assert plan.turns[0].user_text in ("hi", "a")
    (tmp_path / "bad.jsonl").write_text("{nope\n")
    (tmp_path / "b.toml").write_text('replay = "bad.jsonl"\n')
    with pytest.raises(ProfileError, match="line 1: not JSON"):
        load_profile(str(tmp_path / "b.toml"))


def test_text_maker_exact_with_a_tokenizer(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["the service returns an error when the queue grows past its limit"] * 50, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    maker = TextMaker(str(tmp_path))
    for n in (1, 17, 300):
        text = maker.text(n, random.Random(n))
        assert len(tok.encode(text).ids) == n


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
    p = load_profile(str(f))
    assert Profile.from_dict(p.as_dict()) == p


def test_ramp_json_writes_nan_as_null(tmp_path):
    import json as _json

    from spoc_tui.load.ramp import ResultWriter

    lims = parse_sla("ttft_p99<=1s")
    step = summarize_step(1, 1, [_s(0.1, 1.0, 5)], 10, lims)
    step.server = {"kv_cache_usage_max": float("nan")}
    w = ResultWriter(tmp_path, {"url": "http://x"})
    w.write([step], find_knee([step]), "complete")
    w.close()
    doc = _json.loads((tmp_path / "ramp.json").read_text())
    assert doc["steps"][0]["server"]["kv_cache_usage_max"] is None
