"""Search spaces, conditions, objectives and constraints of tuning studies."""

import math

import pytest

from spoc_tui.core.ramp.knee import Knee
from spoc_tui.core.ramp.sla import parse_sla
from spoc_tui.core.ramp.steps import summarize_step
from spoc_tui.core.tuning.space import (
    SpaceError,
    command_line,
    constraint_values,
    load_space,
    objective_value,
    parse_objectives,
    parse_space,
    parse_template,
    reference_point,
    template_flags,
)

SPACE = """
[fixed]
max-model-len = 4096

[flags.max-num-seqs]
pow2 = [10, 300]
default = 256

[flags.max-num-batched-tokens]
choices = [1024, 4096, 8192]
default = 8192

[flags.enable-chunked-prefill]
choices = [true, false]
default = true

[flags.gpu-memory-utilization]
range = [0.80, 0.95]
step = 0.05
default = 0.9

[[conditions]]
when = { enable-chunked-prefill = false }
require = "max-num-batched-tokens >= max-model-len"
"""


def test_values_sizes_and_defaults():
    s = parse_space(SPACE, "s.toml")
    assert s.param("max-num-seqs").values == (16, 32, 64, 128, 256)
    assert s.param("gpu-memory-utilization").values == (0.8, 0.85, 0.9, 0.95)
    assert s.size == 5 * 3 * 2 * 4 == len(list(s.all_configs()))
    assert s.defaults() == {
        "max-num-seqs": 256,
        "max-num-batched-tokens": 8192,
        "enable-chunked-prefill": True,
        "gpu-memory-utilization": 0.9,
    }
    assert s.argv(s.defaults()) == [
        "--max-model-len",
        "4096",
        "--max-num-seqs",
        "256",
        "--max-num-batched-tokens",
        "8192",
        "--enable-chunked-prefill",
        "--gpu-memory-utilization",
        "0.9",
    ]


def test_condition_uses_fixed_values():
    s = parse_space(SPACE, "s.toml")
    ok = {
        "max-num-seqs": 16,
        "max-num-batched-tokens": 1024,
        "enable-chunked-prefill": True,
        "gpu-memory-utilization": 0.9,
    }
    assert s.violated(ok) is None
    bad = dict(ok, **{"enable-chunked-prefill": False})
    c = s.violated(bad)
    assert c is not None and "max-num-batched-tokens >= max-model-len" in str(c)
    assert s.violated(dict(bad, **{"max-num-batched-tokens": 4096})) is None
    # 5 seqs x (1024 refused when off) x 4 utilisations
    assert sum(1 for c in s.all_configs() if s.violated(c)) == 5 * 1 * 4


def test_parse_flags_round_trip_and_errors():
    s = parse_space(SPACE, "s.toml")
    cfg = s.parse_flags(
        "--max-num-seqs 64 --no-enable-chunked-prefill --gpu-memory-utilization=0.85 --max-num-batched-tokens 4096"
    )
    assert cfg == {
        "max-num-seqs": 64,
        "enable-chunked-prefill": False,
        "gpu-memory-utilization": 0.85,
        "max-num-batched-tokens": 4096,
    }
    assert s.parse_flags(" ".join(s.argv(cfg)[2:])) == cfg
    with pytest.raises(SpaceError, match="not one of the space's values: 16, 32"):
        s.parse_flags("--max-num-seqs 48")
    with pytest.raises(SpaceError, match="not a flag of the search space"):
        s.parse_flags("--block-size 32")
    assert s.key({"gpu-memory-utilization": 0.9}) == s.key({"gpu-memory-utilization": 0.90000})


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("[flags.x]\nchoices = []", "non-empty"),
        ("[flags.x]\nrange = [1, 4]", "positive step"),
        ("[flags.x]\npow2 = [5, 7]", "no power of two"),
        ("[flags.x]\nchoices = [1, 2]\npow2 = [1, 4]", "exactly one of"),
        ("[flags.x]\nchoices = [1, 2]\ndefault = 3", "default 3 is not one of"),
        ("[flags.Max_Seqs]\nchoices = [1]", "vllm spells"),
        ("[flagz.x]\nchoices = [1]", "unknown section"),
        ("flags = 3", r"no \[flags\.NAME\]"),
        ("[flags.x]\nchoices = [1]\n[[conditions]]\nrequire = 'x >= y'", "names y"),
        ("[flags.x]\nchoices = [1]\n[[conditions]]\nrequire = 'x ~ 3'", "cannot read require"),
        ("[flags.x\n", "not valid TOML"),
        ("[flags.x]\nrange = [0, 100000]\nstep = 1", "too many"),
        # numbers that are not finite, and a default of another shape: named, not a ValueError
        ("[flags.x]\nrange = [nan, 1]\nstep = 0.1", r"range must be \[low, high\] numbers"),
        ("[flags.x]\nrange = [0, 1e308]\nstep = 0.05", "too many"),
        ("[flags.x]\nrange = [0, 1]\nstep = inf", "positive step"),
        ("[flags.x]\nchoices = [1, nan]", "choice nan is not a number"),
        ("[flags.x]\nchoices = [1, 2]\ndefault = {a = 1}", "default {'a': 1} is not a number, string or boolean"),
    ],
)
def test_bad_spaces_name_the_problem(text, msg):
    with pytest.raises(SpaceError, match=msg):
        parse_space(text, "bad.toml")


def test_builtin_space_has_over_200_configurations_and_learns_max_model_len():
    s = load_space(None)
    assert s.size >= 200
    assert s.notes and len(s.pending) == 1  # max-model-len unknown until a server reports it
    bad = {**s.defaults(), "enable-chunked-prefill": False, "max-num-batched-tokens": 2048}
    assert s.violated(bad) is None
    assert [str(c) for c in s.learn("max-model-len", 4096)]
    assert s.violated(bad) is not None and not s.pending
    s2 = load_space(None, {"max-model-len": 4096})
    assert not s2.notes and s2.violated(bad) is not None


def test_missing_space_file():
    with pytest.raises(SpaceError, match="No such file"):
        load_space("/nonexistent/space.toml")


def test_objectives():
    o = parse_objectives("max:out_tok_s, itl_p99")
    assert [(x.name, x.direction) for x in o] == [("out_tok_s", "max"), ("itl_p99", "min")]
    for bad, msg in [
        ("min:out_tok_s,ttft_p99", "can only be maximised"),
        ("out_tok_s", "two objectives"),
        ("foo,ttft_p99", "unknown objective"),
        ("ttft_p99,ttft_p99", "twice"),
        ("up:ttft_p99,req_s", "max or min"),
    ]:
        with pytest.raises(SpaceError, match=msg):
            parse_objectives(bad)


def _step(idx, users, ttfts, limits):
    from spoc_tui.core.ramp.steps import RequestSample

    samples = [
        RequestSample(
            start=i,
            step=idx,
            users=users,
            ok=True,
            ttft=t,
            e2e=t + 1.0,
            itl=(0.01, 0.02),
            output_tokens=100,
            end=i + t + 1,
        )
        for i, t in enumerate(ttfts)
    ]
    return summarize_step(idx, users, samples, 10.0, limits)


def test_objective_values_and_constraints_at_the_reference_load():
    limits = parse_sla("ttft_p99<=1s,error_rate<=5%")
    steps = [_step(1, 4, [0.1] * 10, limits), _step(2, 16, [0.5] * 9 + [3.0], limits)]
    knee = Knee(4, 16, "ttft_p99")
    objs = parse_objectives("max:out_tok_s,min:ttft_p99")
    assert objective_value(objs[0], steps, knee, None) == pytest.approx(100.0)
    assert objective_value(objs[1], steps, knee, 4) == pytest.approx(0.1)
    assert objective_value(objs[1], steps, knee, 8) is None  # never measured there
    cons = constraint_values(limits, objs, steps, knee, None)
    p99 = steps[1].latency.ttft.p99
    assert cons == {"ttft_p99<=1s": pytest.approx(p99 - 1.0), "error_rate<=5%": pytest.approx(-0.05)}
    assert constraint_values(limits, objs, steps, knee, 4)["ttft_p99<=1s"] < 0
    kobjs = parse_objectives("knee_users,ttft_p99")
    assert objective_value(kobjs[0], steps, knee, None) == 4.0
    assert constraint_values(limits, kobjs, steps, Knee(None, 4, "x"), None) == {"first step meets the SLA": 1.0}


def test_reference_point_uses_the_sla_limit():
    limits = parse_sla("ttft_p99<=2s")
    objs = parse_objectives("out_tok_s,ttft_p99")
    assert reference_point(objs, limits, [(10, 0.5)]) == (0.0, 2.0)
    objs2 = parse_objectives("out_tok_s,itl_p99")
    assert reference_point(objs2, limits, [(10, 0.5), (5, 1.0)]) == (0.0, pytest.approx(1.1))
    assert math.isfinite(reference_point(objs2, limits, [])[1])


def test_templates():
    argv, known = parse_template("vllm serve /models/x --port {port} --max-model-len=2048 --dtype float32 {flags}")
    assert known == {"max-model-len": 2048}
    assert command_line(argv, ["--max-num-seqs", "8"], 9000) == [
        "vllm",
        "serve",
        "/models/x",
        "--port",
        "9000",
        "--max-model-len=2048",
        "--dtype",
        "float32",
        "--max-num-seqs",
        "8",
    ]
    assert command_line(["x", "--port={port}"], ["--a"], 1) == ["x", "--port=1", "--a"]
    assert template_flags(argv) >= {"port", "max-model-len", "dtype"}
    for bad, msg in [
        ("vllm serve m", "must contain {port}"),
        ("vllm serve --port {port} | tee x", "without a shell"),
        ("vllm --port {port} {model}", "unknown placeholder"),
        ("vllm 'x", "cannot read"),
        ("", "empty"),
    ]:
        with pytest.raises(SpaceError, match=msg):
            parse_template(bad)


def test_sampler_encoding_round_trips_every_value():
    s = parse_space(SPACE, "s.toml")
    for p in s.params:
        for v in p.values:
            assert p.decode(p.encode(v)) == v
    assert s.param("max-num-seqs").sampler_name == "log2(max-num-seqs)" and s.param("max-num-seqs").encode(64) == 6
    assert s.param("gpu-memory-utilization").encode(0.95) == 3  # decimal steps by position: 0.95 stays reachable
    cfg = s.defaults()
    assert s.decode(s.encode(cfg)) == cfg
