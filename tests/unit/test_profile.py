"""Profile traces: the class table, the streaming reader (partial and foreign files), the
host (self-time) and device (idle-between-kernels) breakdowns, steps by kind, nsys summaries,
and the CLI's errors."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from spoc_tui.core.hardware import kernels
from spoc_tui.core.hardware.kernels import classify
from spoc_tui.profile import trace as trace_mod
from spoc_tui.profile.analyze import analyse
from spoc_tui.profile.nsys import parse_kernel_summary
from spoc_tui.profile.report import decode_roofline, render_text
from spoc_tui.profile.trace import TraceError, iter_events, read_trace

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "profiles"


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        # the vLLM CPU build (seen in a real trace of the tier's tiny Llama)
        ("_C::onednn_mm", kernels.GEMM),
        ("_C::cpu_attention_with_kv_cache", kernels.ATTENTION),
        ("_C::cpu_attn_reshape_and_cache", kernels.KV_WRITE),
        ("_C::compute_slot_mapping_kernel_impl", kernels.KV_WRITE),
        ("vllm::unified_kv_cache_update", kernels.KV_WRITE),
        ("_C::fused_gumbel_argmax", kernels.SAMPLING),
        # CUDA kernel names as GPU traces and nsys print them
        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", kernels.COMM),
        ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(...)", kernels.COMM),
        ("void flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 128>>(...)", kernels.ATTENTION),
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>)", kernels.ATTENTION),
        ("void vllm::reshape_and_cache_flash_kernel<__nv_bfloat16, __nv_bfloat16, 0>(...)", kernels.KV_WRITE),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", kernels.GEMM),
        ("nvjet_tst_128x64_64x8_1x1_v_bz_coopA_TNT", kernels.GEMM),
        ("cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", kernels.GEMM),
        ("void vllm::rms_norm_kernel<c10::BFloat16>(...)", kernels.ELEMENTWISE),
        ("void vllm::act_and_mul_kernel<c10::BFloat16, &vllm::silu_kernel<c10::BFloat16>, true>", kernels.ELEMENTWISE),
        ("triton_poi_fused_add_mul_0", kernels.ELEMENTWISE),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", kernels.ELEMENTWISE),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", kernels.SAMPLING),
        ("void vllm::top_k_top_p_sampling_kernel", kernels.SAMPLING),
        ("Memcpy HtoD (Pageable -> Device)", kernels.MEMCPY),
        ("aten::copy_", kernels.MEMCPY),
        ("some_new_kernel", kernels.OTHER),
    ],
)
def test_class_table(name, cls):
    assert classify(name) == cls


def _write(path: Path, events: list[dict], gz: bool = True, **top) -> Path:
    doc = {"schemaVersion": 1, "deviceProperties": top.pop("devices", []), "traceEvents": events, **top}
    text = json.dumps(doc)
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path


def X(cat, name, ts, dur, tid=1, pid=7, **args):
    return dict(ph="X", cat=cat, name=name, ts=ts, dur=dur, pid=pid, tid=tid, args=args)


HOST = [
    X("user_annotation", "execute_context_1(200)_generation_0(0)", 0, 1000),
    X("cpu_op", "aten::linear", 10, 500),
    X("cpu_op", "_C::onednn_mm", 20, 480),
    X("cpu_op", "_C::cpu_attention_with_kv_cache", 600, 300),
    X("user_annotation", "execute_context_0(0)_generation_2(2)", 2000, 500),
    X("cpu_op", "_C::onednn_mm", 2010, 200),
    X("cpu_op", "aten::argmax", 2300, 100),
    X("cpu_op", "tokenizer_thread_work", 0, 9999, tid=2),  # another thread: not the engine's
    {"ph": "i", "name": "instant", "ts": 5, "pid": 7, "tid": 1},
]


def test_host_trace_counts_self_time_on_the_engine_thread(tmp_path):
    b = analyse(read_trace(_write(tmp_path / "t.pt.trace.json.gz", HOST)))
    assert b.timeline == "host"
    s = b.seconds
    # aten::linear holds onednn_mm: 20 µs of its own, not 500
    assert s[kernels.GEMM] == pytest.approx((20 + 480 + 200) * 1e-6)
    assert s[kernels.ATTENTION] == pytest.approx(300e-6)
    assert s[kernels.SAMPLING] == pytest.approx(100e-6)
    assert s[kernels.IDLE] == pytest.approx((2390 - 1100) * 1e-6)  # 10..2400 less the ops' cover
    assert sum(b.shares.values()) == pytest.approx(1.0)
    kinds = {p.kind: p for p in b.phases}
    assert kinds["prefill"].steps == 1 and kinds["prefill"].tokens_per_step == 200
    assert kinds["prefill"].shares[kernels.GEMM] == pytest.approx(0.5)
    assert kinds["decode"].mean_step_s == pytest.approx(500e-6)
    assert b.decode_step_s == pytest.approx(500e-6)
    assert b.top[0].name == "_C::onednn_mm" and b.top[0].count == 2


def test_events_of_another_shape_are_passed_over_or_one_lane(tmp_path):
    odd = [
        *HOST,
        X({"a": 1}, "aten::mm", 30, 5),  # a category that is not a name: not an event of ours
        X("cpu_op", "aten::mm", 3000, 5, tid={"a": 1}),  # a thread that is not a number: its own lane
    ]
    b = analyse(read_trace(_write(tmp_path / "t.pt.trace.json.gz", odd)))
    assert b.timeline == "host" and b.top[0].name == "_C::onednn_mm"


def test_device_trace_idle_between_kernels_and_device_steps(tmp_path):
    events = [
        X("gpu_user_annotation", "execute_context_0(0)_generation_8(8)", 100, 300, pid=0, tid=7),
        X("kernel", "nvjet_tst_128x64", 100, 100, pid=0, tid=7, device=0),
        X("kernel", "void flash::flash_fwd_splitkv_kernel<>", 200, 50, pid=0, tid=7, device=0),
        X("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 220, 60, pid=0, tid=8, device=0),  # overlaps
        X("kernel", "void vllm::rms_norm_kernel<>", 350, 50, pid=0, tid=7, device=0),
        X("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 500, 20, pid=0, tid=7, device=0),
        X("kernel", "nvjet_tst_128x64", 100, 300, pid=1, tid=7, device=1),
        X("cpu_op", "aten::mm", 0, 10),  # host side of a GPU trace: not counted
    ]
    devices = [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}, {"id": 1, "name": "NVIDIA H100 80GB HBM3"}]
    b = analyse(read_trace(_write(tmp_path / "g.json", events, gz=False, devices=devices)))
    assert b.timeline == "device" and b.lanes == ["NVIDIA H100 80GB HBM3"] * 2
    s = b.seconds
    assert s[kernels.GEMM] == pytest.approx(400e-6)
    assert s[kernels.COMM] == pytest.approx(60e-6)
    assert s[kernels.MEMCPY] == pytest.approx(20e-6)
    # device 0: 100..520 with kernels covering 100..280, 350..400, 500..520 -> 170 µs idle; device 1: none
    assert s[kernels.IDLE] == pytest.approx(170e-6)
    (decode,) = b.phases
    assert decode.kind == "decode" and decode.tokens_per_step == 8
    assert decode.seconds[kernels.GEMM] == pytest.approx(400e-6)  # both devices' GEMMs start inside the step


def test_device_trace_without_device_steps_says_why_steps_are_missing(tmp_path):
    events = [
        X("user_annotation", "execute_context_0(0)_generation_1(1)", 0, 300),
        X("kernel", "nvjet_tst", 100, 100, pid=0, tid=7, device=0),
    ]
    b = analyse(read_trace(_write(tmp_path / "g.json.gz", events)))
    assert b.phases == [] and "device timeline" in b.notes[0]


def test_detailed_step_annotation_is_read(tmp_path):
    name = "execute_210_context_1(sq200sk200sqsq40000sqsk40000)_generation_10(sq10sk900sqsq10sqsk900)"
    b = analyse(read_trace(_write(tmp_path / "d.json.gz", [X("user_annotation", name, 0, 100), *HOST[1:3]])))
    assert b.phases[0].kind == "mixed" and b.phases[0].tokens_per_step == 210


def test_reading_in_tiny_chunks_gives_the_same_events(tmp_path, monkeypatch):
    p = _write(tmp_path / "t.json", HOST, gz=False, extra={"nested": [1, 2.5, "x" * 40]}, num=123456789)
    whole = list(iter_events(p))
    monkeypatch.setattr(trace_mod, "CHUNK", 7)
    assert list(iter_events(p)) == whole
    assert analyse(read_trace(p)).seconds == analyse(read_trace(_write(tmp_path / "u.json", HOST, gz=False))).seconds


@pytest.mark.parametrize("cut", [0.3, 0.9, 0.999])
def test_partial_trace_is_a_clear_error(tmp_path, cut):
    full = json.dumps({"traceEvents": HOST * 50}).encode()
    p = tmp_path / "cut.pt.trace.json.gz"
    with gzip.open(p, "wb") as f:
        f.write(full[: int(len(full) * cut)])
    with pytest.raises(TraceError, match="ends early"):
        read_trace(p)


def test_truncated_gzip_stream_is_a_clear_error(tmp_path):
    p = _write(tmp_path / "t.json.gz", HOST * 200)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError):
        read_trace(p)


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"not json at all", "not a Chrome/PyTorch trace"),
        (b'{"a": 1}', "no traceEvents"),
        (b"{}", "empty"),
        (b'{"traceEvents": [1, 2 3]}', "malformed"),
        (b"\xff\xfe\x00garbage", "unreadable|not a Chrome"),
    ],
)
def test_foreign_files_are_clear_errors(tmp_path, content, match):
    p = tmp_path / "x.json"
    p.write_bytes(content)
    with pytest.raises(TraceError, match=match):
        read_trace(p)


def test_trace_with_nothing_to_analyse(tmp_path):
    p = _write(tmp_path / "e.json", [X("user_annotation", "other", 0, 1)])
    with pytest.raises(TraceError, match="no kernels"):
        analyse(read_trace(p))


def test_real_vllm_cpu_trace_fixture():
    """A trimmed trace the real-engine tier's vLLM 0.32 CPU server wrote under 4 users (13 steps)."""
    b = analyse(read_trace(FIX / "vllm_0.32_cpu_tiny_llama.pt.trace.json.gz"))
    assert b.timeline == "host"
    assert b.seconds[kernels.GEMM] > 0 and b.seconds[kernels.ATTENTION] > 0 and b.seconds[kernels.KV_WRITE] > 0
    assert sum(b.shares.values()) == pytest.approx(1.0)
    kinds = {p.kind: p for p in b.phases}
    assert kinds["decode"].steps == 11 and kinds["mixed"].steps == 2
    # prefill work is GEMM-heavy, decode steps are not
    assert kinds["mixed"].shares[kernels.GEMM] > 2 * kinds["decode"].shares[kernels.GEMM]
    assert kinds["mixed"].tokens_per_step > 50 * kinds["decode"].tokens_per_step
    assert {k.name for k in b.top[:3]} >= {"_C::onednn_mm", "_C::compute_slot_mapping_kernel_impl"}


NSYS_CSV = """Generating SQLite file report.sqlite from report.nsys-rep
Processing [report.sqlite] with [/opt/nvidia/nsight-systems/reports/cuda_gpu_kern_sum.py]...
"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
"61.2","6,120,000","400","15300.0","15200.0","14000","19000","500.0","nvjet_tst_128x64_64x8_1x1_v_bz_coopA_TNT"
"20.0","2000000","100","20000.0","20000.0","19000","21000","100.0","void flash::flash_fwd_splitkv_kernel<>"
"10.0","1000000","100","10000.0","10000.0","9000","11000","100.0","void vllm::reshape_and_cache_flash_kernel<>"
"8.8","880000","200","4400.0","4400.0","4000","5000","100.0","void vllm::rms_norm_kernel<c10::BFloat16>"
"""


def test_nsys_kernel_summary_into_the_same_classes():
    b = parse_kernel_summary(NSYS_CSV, "report.csv")
    assert b.seconds[kernels.GEMM] == pytest.approx(6.12e-3)
    assert b.counts[kernels.GEMM] == 400
    assert b.seconds[kernels.KV_WRITE] == pytest.approx(1e-3)
    assert b.seconds[kernels.IDLE] == 0.0
    assert sum(b.shares.values()) == pytest.approx(1.0)
    assert "idle" not in render_text(b).split("total")[0].split("class")[1]


def test_nsys_garbage_is_a_clear_error():
    with pytest.raises(TraceError, match="Time"):
        parse_kernel_summary("hello\nworld\n", "x.csv")
    with pytest.raises(TraceError, match="not a number"):
        parse_kernel_summary('"Time (%)","Total Time (ns)","Instances","Name"\n"1","x","1","k"\n', "x.csv")


def test_decode_roofline_and_report(tmp_path):
    from spoc_tui.core.hardware.presets import GPUS, MODELS

    s, basis = decode_roofline(MODELS["llama-3.1-8b"], GPUS["h100-80gb"])
    assert s == pytest.approx(16.06e9 / 3.35e12, rel=0.01)
    assert "H100" in basis
    b = analyse(read_trace(_write(tmp_path / "t.json.gz", HOST)))
    b.roofline_step_s, b.roofline_basis = s, basis
    text = render_text(b)
    assert "decode step: measured 0.50 ms" in text and "x the decode roofline" in text
    d = b.as_dict()
    assert d["decode_vs_roofline"] == pytest.approx(500e-6 / s)
    assert sum(d["shares"].values()) == pytest.approx(1.0)


def spoc(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "spoc_tui.cli", "profile", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        ((), "give --url"),
        (("--from-trace", "/nonexistent.json"), "no such file"),
        (("--url", "http://127.0.0.1:1"), "--trace-dir is needed"),
        (("--url", "http://127.0.0.1:1", "--trace-dir", "/tmp", "--seconds", "0"), "--seconds"),
        (("--from-trace", "x", "--nsys", "y"), "not both"),
        (("--from-trace", "x", "--model", "llama-3.1-8b"), "both --model and --gpu"),
        (("--url", "not a url", "--trace-dir", "/tmp"), "URL"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(args, msg):
    r = spoc(*args)
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_partial_trace_and_json(tmp_path):
    p = tmp_path / "cut.json"
    p.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1, "du')
    r = spoc("--from-trace", str(p))
    assert r.returncode == 2 and "ends early" in r.stderr and "Traceback" not in r.stderr
    good = _write(tmp_path / "t.json.gz", HOST)
    r = spoc("--from-trace", str(good), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["timeline"] == "host"


def test_cli_nsys_report_without_nsys_on_path(tmp_path, monkeypatch):
    rep = tmp_path / "r.nsys-rep"
    rep.write_bytes(b"\0")
    monkeypatch.setenv("PATH", str(tmp_path))
    r = subprocess.run(
        [sys.executable, "-m", "spoc_tui.cli", "profile", "--nsys", str(rep)], capture_output=True, text=True
    )
    assert r.returncode == 2 and "nsys is not on PATH" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
