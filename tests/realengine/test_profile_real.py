"""Where the real vLLM CPU server's time goes: a profile under a short load through
`spoc profile`, and the live roofline figures from its MFU counters, checked against an
independent estimate (2 FLOPs per parameter per token)."""

import json
import subprocess
import sys
import time

import httpx

from spoc_tui.collectors.scrape import metrics_url
from spoc_tui.core.hardware.kernels import ATTENTION, GEMM
from spoc_tui.core.hardware.presets import model_preset
from spoc_tui.core.hardware.roofline import of_view
from spoc_tui.core.metrics.promparse import parse_text
from spoc_tui.core.metrics.vllm import Scrape, server_view
from tests.realengine.conftest import MODEL


def _profile_toml(tmp_path):
    p = tmp_path / "p.toml"
    p.write_text('name = "flat"\nsystem_tokens = 0\nturns = 1\nuser_tokens = 200\noutput_tokens = 32\nthink_s = 0\n')
    return p


def test_profile_under_load_names_gemm_and_attention_and_the_server_serves_on(vllm_server, tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "spoc_tui.cli",
            "profile",
            "--url",
            vllm_server.url,
            "--trace-dir",
            str(vllm_server.trace_dir),
            "--seconds",
            "3",
            "--users",
            "4",
            "--warmup-seconds",
            "2",
            "--profile",
            str(_profile_toml(tmp_path)),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    d = json.loads(r.stdout)
    print(r.stderr[-1500:])
    print({k: round(v, 3) for k, v in d["shares"].items()}, d["phases"])
    assert d["timeline"] == "host"
    assert d["seconds"][GEMM] > 0 and d["seconds"][ATTENTION] > 0
    assert abs(sum(d["shares"].values()) - 1.0) < 1e-9
    assert {p["kind"] for p in d["phases"]} & {"decode", "mixed"}
    names = {k["name"] for k in d["top_kernels"]}
    assert "_C::onednn_mm" in names
    # the server is not left profiling and still answers
    ok = httpx.post(
        vllm_server.url + "/v1/completions",
        json={"model": "tiny", "prompt": "hello", "max_tokens": 4},
        timeout=60,
    )
    assert ok.status_code == 200
    # the same trace read again through --from-trace gives the same figures, as text
    trace = sorted(vllm_server.trace_dir.rglob("*.pt.trace.json*"), key=lambda p: p.stat().st_mtime)[-1]
    r2 = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "profile", "--from-trace", str(trace)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r2.returncode == 0 and "_C::onednn_mm" in r2.stdout and "decode step: measured" in r2.stdout


def test_profile_of_a_server_without_the_profiler_names_the_flag(sim_server, tmp_path):
    url, _ = sim_server
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "profile", "--url", url, "--trace-dir", str(tmp_path), "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert "404" in r.stderr and "--profiler-config" in r.stderr and "Traceback" not in r.stderr


def test_live_roofline_from_the_real_servers_mfu_counters(vllm_server):
    """vLLM's FLOP estimate over a window of decoding, next to 2 x parameters x tokens."""
    murl = metrics_url(vllm_server.url)
    t0 = time.time()
    before = parse_text(httpx.get(murl, timeout=10).text)
    for _ in range(3):
        httpx.post(
            vllm_server.url + "/v1/completions",
            json={"model": "tiny", "prompt": "count with me: one two", "max_tokens": 64, "ignore_eos": True},
            timeout=120,
        ).raise_for_status()
    t1 = time.time()
    after = parse_text(httpx.get(murl, timeout=10).text)
    view = server_view(vllm_server.url, Scrape(after, t1, before, t0)).total
    r = of_view(view, None)
    print(r.as_dict())
    assert view.flops_per_gpu_rate and view.flops_per_gpu_rate > 0
    assert r.reading == "n/a" and "unknown" in r.why  # no GPU: absolute figures only
    tokens = ((view.prompt_tokens_rate or 0) + (view.generation_tokens_rate or 0)) * (t1 - t0)
    params = model_preset(str(MODEL)).active_params
    flops = view.flops_per_gpu_rate * (t1 - t0)
    # the matmuls dominate a tiny model's FLOPs; attention and the LM head add a little
    assert 0.8 < flops / (2 * params * tokens) < 3.0, (flops, params, tokens)
    assert view.tokens_per_step is not None and view.steps_rate is not None and view.steps_rate > 0
