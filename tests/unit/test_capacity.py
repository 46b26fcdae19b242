import json
import subprocess
import sys

import pytest

from spoc_tui.core.hardware.capacity import CapacityError, kv_bytes_per_token, plan, weights_bytes
from spoc_tui.core.hardware.presets import GPUS, MODELS, PresetError, model_from_config, model_preset


def test_llama8b_kv_bytes_use_kv_heads():
    m = MODELS["llama-3.1-8b"]
    assert kv_bytes_per_token(m) == 2 * 32 * 8 * 128 * 2  # 128 KiB, not 512 KiB
    assert m.total_params == pytest.approx(8.03e9, rel=0.01)


def test_fp8_kv_doubles_tokens():
    a = plan(MODELS["llama-3.1-8b"], GPUS["h100-80gb"])
    b = plan(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], kv_cache_dtype="fp8")
    assert b.kv_cache_tokens == pytest.approx(2 * a.kv_cache_tokens, rel=0.001)


def test_moe_all_experts_resident_and_sliding_window():
    m = MODELS["gpt-oss-120b"]
    assert m.total_params == pytest.approx(116.8e9, rel=0.01)
    assert m.active_params < 0.06 * m.total_params
    p = plan(m, GPUS["h100-80gb"], max_model_len=8192)
    assert p.weights_bytes == pytest.approx(65.2e9, rel=0.01)
    assert any("sliding window" in n for n in p.notes)
    # only the 18 full-attention layers hold KV for every token
    assert p.kv_bytes_per_token == 2 * 18 * 8 * 64 * 2


def test_does_not_fit_says_by_how_much():
    with pytest.raises(CapacityError, match=r"GiB short per GPU"):
        plan(MODELS["llama-3.1-70b"], GPUS["h100-80gb"], tp=1)
    with pytest.raises(CapacityError, match="does not divide"):
        plan(MODELS["llama-3.1-70b"], GPUS["h100-80gb"], tp=3)
    with pytest.raises(CapacityError, match="sequence needs"):
        plan(MODELS["llama-3.1-8b"], GPUS["h100-80gb"], kv_cache_bytes_override=1e6, max_model_len=8192)


def test_config_json_missing_fields_are_named(tmp_path):
    with pytest.raises(PresetError, match="num_hidden_layers, hidden_size"):
        model_from_config({"num_attention_heads": 8, "vocab_size": 100})
    bad = tmp_path / "config.json"
    bad.write_text("{nope")
    with pytest.raises(PresetError, match="cannot read JSON"):
        model_preset(str(bad))
    shape = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}
    for key, value in [
        ("intermediate_size", "x"),
        ("num_key_value_heads", 2.5),
        ("head_dim", True),
        ("vocab_size", 2**40),
    ]:
        with pytest.raises(PresetError, match=f"config.json: {key} is {value!r}, not a whole number"):
            model_from_config({**shape, key: value})
    assert model_from_config({**shape, "head_dim": None, "num_key_value_heads": 0}).head_dim == 16  # absent: derived


def test_config_json_gqa_and_weights():
    cfg = {
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "intermediate_size": 512,
        "torch_dtype": "bfloat16",
    }
    m = model_from_config(cfg)
    assert m.head_dim == 32 and kv_bytes_per_token(m) == 2 * 4 * 2 * 32 * 2
    assert weights_bytes(m) == m.total_params * 2


@pytest.mark.parametrize(
    "argv,msg",
    [
        (["--model", "llama-3.1-8b", "--gpu", "v100"], "unknown GPU 'v100'; known:"),
        (["--model", "llama-3.1-8b"], "give --gpu"),
        (["--model", "llama-3.1-8b", "--gpu", "h100", "--tp", "0"], "--tp must be at least 1"),
        (["--model", "llama-3.1-8b", "--gpu", "h100", "--kv-cache-dtype", "fp7"], "unknown dtype 'fp7'"),
        (["--model", "llama-3.1-70b", "--gpu", "h100"], "short per GPU"),
    ],
)
def test_capacity_cli_bad_input(argv, msg):
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "capacity", *argv], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and msg in r.stderr and "Traceback" not in r.stderr


def test_capacity_cli_json_keys():
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "capacity", "--model", "qwen2.5-7b", "--gpu", "a100-80gb", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    d = json.loads(r.stdout)
    for k in (
        "weights_bytes",
        "weights_bytes_per_gpu",
        "kv_bytes_per_token",
        "kv_bytes_per_request",
        "kv_cache_bytes",
        "kv_cache_tokens",
        "max_concurrent_sequences",
        "notes",
    ):
        assert k in d


def test_queue_view_from_a_ramp_result(tmp_path):
    ramp = {
        "steps": [
            {
                "users": 2,
                "requests": 20,
                "request_rate": 2.0,
                "latency": {"ttft": {"p50": 0.02}, "e2e": {"p50": 0.6, "mean": 0.7}},
                "server": {"waiting_max": 0},
            },
            {
                "users": 32,
                "requests": 40,
                "request_rate": 4.0,
                "latency": {"ttft": {"p50": 1.9}, "e2e": {"p50": 2.6, "mean": 2.7}},
                "server": {"waiting_max": 22},
            },
        ]
    }
    (tmp_path / "ramp.json").write_text(json.dumps(ramp))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "spoc_tui.cli",
            "capacity",
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "a100-40gb",
            "--max-num-seqs",
            "8",
            "--avg-context",
            "2000",
            "--ramp",
            str(tmp_path),
            "--queue",
            "4,16",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    q = json.loads(r.stdout)["queueing"]
    assert q["seats"] == 8 and q["service_s"] == pytest.approx(0.7) and q["think_s"] == pytest.approx(0.3)
    rows = {row["users"]: row for row in q["rows"]}
    assert set(rows) == {2, 4, 16, 32}
    assert rows[32]["expected_wait_s"] is None and rows[32]["measured_queue_max"] == 22  # saturated, and measured so
    assert rows[2]["measured_ttft_p50_s"] == 0.02 and rows[4]["measured_ttft_p50_s"] is None


def test_queue_view_needs_times():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "spoc_tui.cli",
            "capacity",
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100",
            "--queue",
            "1,2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--service-time" in r.stderr


def test_bad_ramp_file_is_named(tmp_path):
    (tmp_path / "ramp.json").write_text("[1, 2]")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "spoc_tui.cli",
            "capacity",
            "--model",
            "llama-3.1-8b",
            "--gpu",
            "h100",
            "--ramp",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "not a JSON object" in r.stderr


@pytest.mark.parametrize(
    "args",
    [["--gpu-memory-gib", "nan"], ["--gpu-memory-gib", "inf"], ["--kv-cache-gib", "nan"], ["--kv-cache-gib", "-inf"]],
)
def test_non_finite_numbers_are_refused_in_one_line(args):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "spoc_tui.cli", "capacity", *args], capture_output=True, text=True)
    assert r.returncode == 2 and "is not a finite number" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_service_refuses_non_finite_memory_too():
    from spoc_tui.capacity.args import CapacityArgs
    from spoc_tui.capacity.service import check_args

    with pytest.raises(CapacityError, match="--kv-cache-gib must be a positive number"):
        check_args(CapacityArgs("llama-3.1-8b", kv_cache_gib=float("nan")))
