"""Energy per token and cost per million tokens over the window, from the GPUs' energy
counters (DCGM, NVML) or, without them, their power readings."""

import pytest

from spoc_tui.core.hardware.gpu import GpuSample, dcgm_gpus, nvml_gpu
from spoc_tui.core.metrics.promparse import parse_text
from spoc_tui.core.monitor.energy import EnergyMeter
from tests.unit.test_roofline import FIX


def gpu(i, energy_j=None, power_w=None):
    return GpuSample("s", str(i), f"GPU-{i}", energy_j=energy_j, power_w=power_w)


def test_counters_give_the_windows_mean_power_and_tokens_per_joule():
    m = EnergyMeter(window_s=10)
    for t in range(21):  # two GPUs at 400 W and 600 W, readings every second
        m.add(float(t), [gpu(0, 400.0 * t, 9999.0), gpu(1, 600.0 * t, 1.0)])
    watts, n, basis = m.watts()
    assert watts == pytest.approx(1000.0) and n == 2 and basis == "energy counters"
    e = m.efficiency(2000.0, price_per_gpu_hour=3.6)
    assert e.tokens_per_joule == pytest.approx(2.0)
    # 2 GPUs x $3.6/h = $0.002/s; 2000 tok/s -> $1 per million tokens
    assert e.cost_per_m_tokens == pytest.approx(1.0)
    assert "2 out tok/J" in e.text(3.6) and "$1.00 per M out tokens" in e.text(3.6)


def test_without_counters_power_readings_are_averaged_and_said_so():
    m = EnergyMeter(window_s=10)
    for t, p in enumerate([300.0, 500.0, 400.0]):
        m.add(float(t), [gpu(0, None, p)])
    watts, _, basis = m.watts()
    assert watts == pytest.approx(400.0) and basis == "power readings"
    assert m.efficiency(0.0).tokens_per_joule is None


def test_one_reading_is_not_a_window():
    m = EnergyMeter(10)
    m.add(0.0, [gpu(0, 5.0, 100.0)])
    assert m.efficiency(100.0) is None


def test_dcgm_and_nvml_energy_counters_in_joules():
    # real exporters without the counter: unknown, never 0
    for f in sorted((FIX.parent / "dcgm").glob("*.txt")):
        for g in dcgm_gpus(parse_text(f.read_text()), "dcgm"):
            assert g.energy_j is None or g.energy_j > 0
    from spoc_tui.core.hardware.presets import GPUS
    from spoc_tui.sim.exposition import dcgm_metrics
    from spoc_tui.sim.gpu import SimGpu

    sim = SimGpu(0, GPUS["h100-80gb"])
    sim.step(10.0, 1.0, 1.0)
    (g,) = dcgm_gpus(parse_text(dcgm_metrics([sim])), "dcgm")
    assert g.energy_j == pytest.approx(sim.energy_mj / 1000, rel=1e-6)
    g = nvml_gpu({"energy_mj": 123456789, "power_mw": 300000}, {"gpu": 0, "name": "NVIDIA H100 80GB HBM3"})
    assert g.energy_j == pytest.approx(123456.789)
