"""Live roofline figures: vLLM's FLOP/byte estimates over the window, shares of the GPU's peak,
the one-word reading, on real captures and on the simulator's own model."""

from pathlib import Path

import pytest

from spoc_tui.core.hardware.presets import GPUS, gpu_for_model_name
from spoc_tui.core.hardware.roofline import MFU_FLAG, OVERHEAD_BELOW, of_view, reading, si, summary
from spoc_tui.core.metrics.promparse import parse_text as parse
from spoc_tui.core.metrics.vllm import Scrape, replicas_view, server_view
from spoc_tui.sim.exposition import vllm_metrics
from tests.unit.test_sim_engine import drive, make, req

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
H100 = GPUS["h100-80gb"]


def test_real_cpu_server_that_stepped_without_mfu_metrics_reads_na_with_the_flag():
    """vLLM 0.32 exports the counters but leaves them at 0 without --enable-mfu-metrics: the
    engine stepped between the idle and the load capture, so this is not 'idle'."""
    idle = parse((FIX / "vllm_0.32_cpu_full_idle.txt").read_text())
    load = parse((FIX / "vllm_0.32_cpu_full_load.txt").read_text())
    v = server_view("x", Scrape(load, 100.0, idle, 90.0)).total
    assert v.steps_rate is not None and v.steps_rate > 0
    assert v.flops_per_gpu_rate == 0.0
    assert v.tokens_per_step is not None and v.tokens_per_step > 1
    r = reading(
        v.flops_per_gpu_rate,
        v.read_bytes_per_gpu_rate,
        v.write_bytes_per_gpu_rate,
        v.steps_rate,
        v.tokens_per_step,
        H100,
    )
    assert r.reading == "n/a" and MFU_FLAG in r.why
    assert r.flops_s is None and r.bytes_s is None  # no "0 FLOP/s" shown as a figure


def test_old_server_without_the_metrics_reads_na():
    exp = parse((FIX / "vllm_sample_01.txt").read_text())
    v = server_view("x", Scrape(exp, 10.0, exp, 0.0)).total
    assert v.flops_per_gpu_rate is None
    r = reading(None, None, None, v.steps_rate, v.tokens_per_step, H100)
    assert r.reading in ("n/a", "idle")


def _sim_view(engine_setup):
    e, t = make(model="llama-3.1-8b", gpu="h100-80gb")
    before = parse(vllm_metrics(e))
    t0 = t[0]
    engine_setup(e)
    drive(e, t)
    after = parse(vllm_metrics(e))
    return e, server_view("sim", Scrape(after, t[0], before, t0)).total


def test_simulator_exports_its_cost_model_consistently():
    e, v = _sim_view(lambda e: [e.add(req(f"r{i}", 64, 200)) for i in range(4)])
    st = e.stats
    assert v.steps_rate is not None and v.tokens_per_step is not None
    assert v.tokens_per_step == pytest.approx(st.iteration_tokens.sum / st.iteration_tokens.n)
    assert v.flops_per_gpu_rate == pytest.approx(st.flops_per_gpu / (e.clock() - 0.0))
    # decode of 4 streams on an 8B: weights dominate the bytes, far below the ridge point
    r = reading(
        v.flops_per_gpu_rate,
        v.read_bytes_per_gpu_rate,
        v.write_bytes_per_gpu_rate,
        v.steps_rate,
        v.tokens_per_step,
        H100,
    )
    assert r.reading == "memory-bound", r
    assert r.intensity is not None and r.ridge is not None and r.intensity < r.ridge / 10
    # the achieved bandwidth is what the cost model allowed: below peak, above half of it
    assert r.bw_share is not None and 0.5 < r.bw_share <= 1.0


def test_prefill_heavy_batches_read_compute_bound():
    _, v = _sim_view(lambda e: [e.add(req(f"p{i}", 2000, 1)) for i in range(64)])
    r = reading(
        v.flops_per_gpu_rate,
        v.read_bytes_per_gpu_rate,
        v.write_bytes_per_gpu_rate,
        v.steps_rate,
        v.tokens_per_step,
        H100,
    )
    assert r.reading == "compute-bound", r
    assert r.tokens_per_step is not None and r.tokens_per_step > 1000


def test_engines_average_per_gpu_figures_instead_of_adding_them():
    """Two data-parallel engines doing the same work: the server's per-GPU FLOP/s equals one
    engine's, not twice it."""
    e, t = make()
    before = vllm_metrics(e, "0")
    b1 = vllm_metrics(e, "1")
    for i in range(4):
        e.add(req(f"r{i}", 64, 100))
    drive(e, t)
    after0, after1 = vllm_metrics(e, "0"), vllm_metrics(e, "1")
    then = parse(before + _families_stripped(b1))
    now = parse(after0 + _families_stripped(after1))
    view = server_view("x", Scrape(now, t[0], then, 0.0))
    one = view.engines[0]
    assert len(view.engines) == 2
    assert view.total.flops_per_gpu_rate == pytest.approx(one.flops_per_gpu_rate)
    assert view.total.steps_rate == pytest.approx(one.steps_rate)
    merged = replicas_view([Scrape(parse(after0), t[0], parse(before), 0.0)] * 2)
    assert merged.flops_per_gpu_rate == pytest.approx(one.flops_per_gpu_rate)


def _families_stripped(text: str) -> str:
    """Series lines only (a second engine's HELP/TYPE would repeat the family)."""
    return "".join(
        line + "\n" for line in text.splitlines() if not line.startswith("#") and "spoc_sim_info" not in line
    )


@pytest.mark.parametrize(
    ("flops", "bytes_", "word"),
    [
        (0.5 * H100.bf16_flops, 0.1 * H100.mem_bw_bytes_s, "compute-bound"),
        (0.05 * H100.bf16_flops, 0.7 * H100.mem_bw_bytes_s, "memory-bound"),
        (0.05 * H100.bf16_flops, (OVERHEAD_BELOW - 0.01) * H100.mem_bw_bytes_s, "overhead-bound"),
    ],
)
def test_reading_rule(flops, bytes_, word):
    r = reading(flops, bytes_, 0.0, 50.0, 8.0, H100)
    assert r.reading == word
    assert "%" in summary(r)


def test_idle_and_unknown_gpu():
    assert reading(0.0, 0.0, 0.0, 0.0, None, H100).reading == "idle"
    r = reading(1e12, 1e11, 0.0, 10.0, 4.0, None)
    assert r.reading == "n/a" and "unknown" in r.why
    assert r.flops_share is None and "%" not in summary(r)
    assert "1 TFLOP/s" in summary(r)


@pytest.mark.parametrize(
    ("name", "preset"),
    [
        ("NVIDIA H100 80GB HBM3", "h100-80gb"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
        ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA H100 PCIe", None),
        ("NVIDIA H100 NVL", None),
        ("Tesla T4", None),
        ("", None),
    ],
)
def test_gpu_names_map_to_presets_only_when_peaks_match(name, preset):
    g = gpu_for_model_name(name)
    assert (g.name if g else None) == preset


def test_si():
    assert si(3.12e14, "FLOP/s") == "312 TFLOP/s"
    assert si(2.1e12, "B/s") == "2.1 TB/s"
    assert si(None, "B/s") == "n/a"


def test_why_there_is_no_peak_is_passed_through():
    from spoc_tui.core.metrics.vllm import EngineView

    v = EngineView("", None, None, {}, None, None, None, None, None, None, None, None, {}, None, {}, "10s")
    v = EngineView(
        **{**{f: getattr(v, f) for f in v.__dataclass_fields__}, "flops_per_gpu_rate": 1e12, "steps_rate": 5.0}
    )
    assert of_view(v, None, "mixed GPUs").why == "mixed GPUs: absolute figures only"


def test_roofline_of_the_simulator_under_load_against_its_exporters_gpus():
    """What the monitor reads of ``spoc sim --tp 2 --load-users 8``, on the virtual clock: two
    scrapes of its /metrics 2 s apart and its dcgm-exporter's GPUs name the H100, and the
    window's reading has shares of its peak (the HTTP of the same scrapes is the live tests')."""
    from spoc_tui.core.hardware.gpu import dcgm_gpus
    from spoc_tui.core.hardware.roofline import gpu_of
    from spoc_tui.sim.exposition import dcgm_metrics
    from spoc_tui.sim.options import SimOptions
    from spoc_tui.sim.run import build
    from spoc_tui.sim.virtual import VirtualServer
    from spoc_tui.workload import load_workload

    engine, users = build(SimOptions(tp=2, load_users=8, dcgm_port=None))
    server = VirtualServer(engine, load_workload("chatbot"), users, seed=0, paced=True)
    server.advance(20.0)
    before = parse(vllm_metrics(server.engine))
    server.advance(22.0)
    after = parse(vllm_metrics(server.engine))
    gpus = dcgm_gpus(parse(dcgm_metrics(server.engine.gpus)), "d")
    assert len(gpus) == 2
    gpu = gpu_of([g.model for g in gpus])
    assert gpu is not None and gpu.name == "h100-80gb"
    r = of_view(server_view("x", Scrape(after, 22.0, before, 20.0)).total, gpu)
    assert r.reading in ("memory-bound", "compute-bound", "overhead-bound"), r
    assert r.flops_share is not None and 0 < r.flops_share < 1 and r.bw_share is not None and 0 < r.bw_share < 1
