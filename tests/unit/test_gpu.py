import csv
import json
import statistics
from pathlib import Path

import pytest

from spoc_tui.collectors.nvml import NvmlCollector, NvmlUnavailable, TraceReplay
from spoc_tui.core.hardware.gpu import (
    GpuSample,
    analyse_groups,
    dcgm_gpus,
    decode_reasons,
    groups_from_processes,
    parse_tp_groups,
    throttle_names,
)
from spoc_tui.core.metrics.promparse import parse_text

FIX = Path(__file__).parents[1] / "fixtures"


def test_reason_decoding_idle_is_not_throttling():
    assert decode_reasons(0x1) == ["idle"]
    assert throttle_names(0x1) == []
    assert throttle_names(0x4) == ["sw_power_cap"]
    assert throttle_names(0x20 | 0x40) == ["sw_thermal", "hw_thermal"]


@pytest.mark.parametrize(
    "name",
    [
        "dcgm_sample_01.txt",
        "dcgm_sample_02.txt",
        "dcgm_sample_03.txt",
        "dcgm_sample_05.txt",
        "dcgm_sample_07.txt",
        "dcgm_sample_09.txt",
    ],
)
def test_dcgm_samples_parse(name):
    gpus = dcgm_gpus(parse_text((FIX / "dcgm" / name).read_text()), name)
    assert len({g.key for g in gpus}) == len(gpus)  # deduplicated by UUID


def test_dcgm_sentinel_is_missing_and_pods_deduplicated():
    gpus = dcgm_gpus(parse_text((FIX / "dcgm/dcgm_sample_01.txt").read_text()), "x")
    assert len(gpus) == 1
    assert gpus[0].mem_temp_c is None
    assert gpus[0].sm_clock_mhz == 139


def test_hostname_both_spellings():
    text = (
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",Hostname="old"} 40\n'
        'DCGM_FI_DEV_GPU_TEMP{gpu="1",UUID="GPU-b",hostname="new"} 41\n'
    )
    gpus = dcgm_gpus(parse_text(text), "x")
    assert {g.hostname for g in gpus} == {"old", "new"}


def test_new_dcgm46_field_names():
    text = 'DCGM_FI_DEV_GPU_TEMP_CELSIUS{gpu="0",UUID="GPU-a"} 50\nDCGM_FI_DEV_SM_CLOCK_HERTZ{gpu="0",UUID="GPU-a"} 1410000000\n'
    (g,) = dcgm_gpus(parse_text(text), "x")
    assert g.temp_c == 50 and g.sm_clock_mhz == pytest.approx(1410)


def test_nvml_trace_power_capped_burn():
    rep = TraceReplay(FIX / "h100_nvml_trace.jsonl")
    samples = [rep.read()[0] for _ in range(len(rep.rows))]
    idle, burn = samples[5], samples[300]
    assert idle.throttle_reasons == [] and idle.clock_event_reasons == ["idle"]
    assert burn.throttle_reasons == ["sw_power_cap"]
    assert burn.throttle_kind() == "power"
    assert burn.slowdown_temp_c == 89
    assert burn.power_w == pytest.approx(burn.power_limit_w, rel=0.02)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('{"meta": [1]}', "line 1: meta is not an object"),
        ('{"meta": []}', "line 1: meta is not an object"),
        ('{"t": "x", "temp_c": 40}', "line 1: t is not a number of seconds"),
        ('{"t": [], "temp_c": 40}', "line 1: t is not a number of seconds"),
        ("[1, 2]", "line 1: not a JSON object"),
        ("{not json", "line 1: not JSON"),
    ],
)
def test_an_nvml_trace_of_another_shape_is_named_when_read(tmp_path, line, says):
    from spoc_tui.collectors.nvml import NvmlError

    p = tmp_path / "trace.jsonl"
    p.write_text(line + '\n{"t": 1.0, "temp_c": 40}\n')
    with pytest.raises(NvmlError, match=says):
        TraceReplay(p)


def test_violation_counters_give_percent_of_window():
    rep = TraceReplay(FIX / "h100_nvml_bursts.jsonl", window_s=1.0)
    out = []
    for row in rep.rows:
        (s,) = rep.read()
        out.append((row["phase"], s.throttled_pct))
    burn = [p["power"] for ph, p in out[5:] if ph == "burn" and p and "power" in p]
    idle = [p["power"] for ph, p in out[5:] if ph == "idle" and p and "power" in p]
    assert max(burn) > 80
    assert sorted(idle)[len(idle) // 2] < 5


def test_throttle_share_follows_the_stated_window_not_the_last_read():
    """Bursts of ~8 s power capping every ~13 s: over a 30 s window the share stays near the
    duty cycle instead of flipping between 100 % and 0 at each phase change (issue #20)."""
    rows = TraceReplay(FIX / "h100_nvml_bursts.jsonl").rows
    rep = TraceReplay(FIX / "h100_nvml_bursts.jsonl", window_s=30.0)
    shares = []
    for row in rows:
        (s,) = rep.read()
        if row["t"] >= 35:  # a full window behind it
            shares.append((row["t"], s.throttled_pct["power"]))
    assert shares
    for t, pct in shares:
        # the truth: capped nanoseconds over the newest reading at least 30 s old
        base = max((r for r in rows if t - r["t"] >= 30), key=lambda r: r["t"])
        now = next(r for r in rows if r["t"] == t)
        want = (now["violations"]["POWER"]["violation_ns"] - base["violations"]["POWER"]["violation_ns"]) / (
            (t - base["t"]) * 1e9
        )
        assert pct == pytest.approx(100 * want, abs=0.01)
        assert 40 < pct < 75  # the duty cycle, in every sample, burn or idle


def _energy_not_supported(self, h):
    raise _FakeNvmlFromTrace.NVMLError("Not Supported")  # the trace did not record it


class _FakeNvmlFromTrace:
    """pynvml's API answered from the recorded H100 trace (what the real library returned)."""

    class NVMLError(Exception):
        pass

    def __init__(self, path, fail_init=None):
        lines = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
        self.meta = lines[0]["meta"][0]
        self.rows = lines[1:]
        self.i = 0
        self.fail_init = fail_init

    def _row(self):
        return self.rows[self.i % len(self.rows)]

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError(self.fail_init)

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self.meta["name"]

    def nvmlDeviceGetUUID(self, h):
        return self.meta["uuid"]

    def nvmlDeviceGetTemperatureThreshold(self, h, t):
        return {0: self.meta["shutdown_c"], 1: self.meta["slowdown_c"]}[t]

    def nvmlDeviceGetMaxClockInfo(self, h, c):
        return self._row()["sm_max_mhz"]

    def nvmlDeviceGetTemperature(self, h, s):
        return self._row()["temp_c"]

    def nvmlDeviceGetClockInfo(self, h, c):
        return self._row()["sm_mhz"]

    def nvmlDeviceGetPowerUsage(self, h):
        return self._row()["power_mw"]

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._row()["power_limit_mw"]

    def nvmlDeviceGetUtilizationRates(self, h):
        return type("U", (), {"gpu": self._row()["util_gpu"], "memory": self._row()["util_mem"]})()

    def nvmlDeviceGetMemoryInfo(self, h):
        r = self._row()
        return type("M", (), {"used": r["fb_used"], "total": r["fb_total"]})()

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        r = self._row()
        self.i += 1  # last call of a read: advance to the next recorded sample
        return r["reasons"]

    def nvmlDeviceGetViolationStatus(self, h, p):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetPciInfo(self, h):
        raise self.NVMLError("Not Supported")

    nvmlDeviceGetTotalEnergyConsumption = _energy_not_supported


def test_nvml_collector_on_recorded_trace():
    fake = _FakeNvmlFromTrace(FIX / "h100_nvml_trace.jsonl")
    col = NvmlCollector(nvml=fake)
    col.start()
    fake.i = 300
    (s,) = col.read()
    assert s.model == "NVIDIA H100 80GB HBM3"
    assert s.throttle_reasons == ["sw_power_cap"]
    assert s.sm_clock_max_mhz == 1980
    assert s.pci_bus_id is None  # a failing call reads None, the rest still works
    assert s.energy_j is None
    del _FakeNvmlFromTrace.nvmlDeviceGetTotalEnergyConsumption  # an nvidia-ml-py without it
    try:
        (s,) = col.read()
        assert s.energy_j is None and s.power_w is not None
    finally:
        _FakeNvmlFromTrace.nvmlDeviceGetTotalEnergyConsumption = _energy_not_supported
    col.stop()


def test_nvml_unavailable_is_reported_not_raised_raw():
    with pytest.raises(NvmlUnavailable, match="NVML"):
        NvmlCollector(nvml=_FakeNvmlFromTrace(FIX / "h100_nvml_trace.jsonl", fail_init="Driver Not Loaded")).start()


def test_tp_group_parsing():
    assert parse_tp_groups("0-3,4-7") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert parse_tp_groups("0+2,1+3") == [[0, 2], [1, 3]]
    for bad in ("0-", "a", "3-1", "0-1,1-2", ""):
        with pytest.raises(ValueError):
            parse_tp_groups(bad)


def _g(i, clock, temp, mask, slowdown=89.0):
    return GpuSample(
        "s",
        str(i),
        f"GPU-{i}",
        sm_clock_mhz=clock,
        temp_c=temp,
        reasons_mask=mask,
        slowdown_temp_c=slowdown,
        power_w=500,
        power_limit_w=700,
    )


def test_hot_gpu_drags_group_with_thermal_reason():
    gpus = [_g(0, 1980, 60, 0), _g(1, 1980, 61, 0), _g(2, 1975, 60, 0), _g(3, 1400, 90, 0x20)]
    (rep,) = analyse_groups([[0, 1, 2, 3]], gpus)
    assert [m.gpu.gpu for m in rep.draggers] == ["3"]
    assert rep.draggers[0].reason == "thermal"
    assert "GPU 3 drags TP group 0-3: thermal" in rep.alert()
    assert rep.slowdown_pct > 25


def test_idle_gpu_is_not_a_dragger():
    gpus = [_g(0, 1980, 60, 0), _g(1, 345, 40, 0x1), _g(2, 1980, 60, 0)]
    (rep,) = analyse_groups([[0, 1, 2]], gpus)
    assert rep.draggers == []


def test_groups_from_worker_processes():
    assert groups_from_processes({0: [10], 1: [11], 2: [20], 3: [21]}, {10: 1, 11: 1, 20: 2, 21: 2}) == [[0, 1], [2, 3]]


def test_h200_recording_read_by_our_collector_agrees_with_nvidia_smi():
    """A real H200 under a PyTorch bf16 matmul burn, recorded by scripts/record_nvml.py through
    NvmlCollector.read_raw at 10 Hz beside nvidia-smi at 1 Hz (tests/fixtures/h200)."""
    rep = TraceReplay(FIX / "h200/nvml_trace.jsonl", window_s=5.0)
    phases = [r["phase"] for r in rep.rows]
    samples = [rep.read()[0] for _ in rep.rows]
    assert samples[0].model == "NVIDIA H200" and samples[0].slowdown_temp_c == 89
    # each burst from its 7th second (the child first loads PyTorch and CUDA: the card reads idle)
    since = [0]
    for a, b in zip(phases, phases[1:]):
        since.append(since[-1] + 1 if a == b else 0)
    burn = [s for s, ph, n in zip(samples, phases, since) if ph == "burn" and n >= 70]
    idle = [s for s, ph in zip(samples, phases) if ph != "burn"][20:]
    assert all(s.throttle_kind() == "power" for s in burn if s.reasons_mask == 0x4)
    assert sum(s.reasons_mask == 0x4 for s in burn) > 0.9 * len(burn)
    assert sum(s.throttle_reasons == [] for s in idle) > 0.9 * len(idle)
    assert max(s.throttled_pct["power"] for s in burn if s.throttled_pct) > 80  # violation counters
    smi = list(csv.DictReader((FIX / "h200/nvidia_smi.csv").open()))
    summary = json.loads((FIX / "h200/summary.json").read_text())
    assert summary["burn"]["nvidia_smi"]["samples"] >= 30 and len(smi) >= 60
    ours_sm = statistics.median(s.sm_clock_mhz for s in burn if s.sm_clock_mhz)
    ours_w = statistics.median(s.power_w for s in burn if s.power_w)
    assert ours_sm == pytest.approx(summary["burn"]["nvidia_smi"]["sm_mhz"], rel=0.03)
    assert ours_w == pytest.approx(summary["burn"]["nvidia_smi"]["power_w"], rel=0.02)
    assert ours_w == pytest.approx(700, rel=0.03)  # at its 700 W cap
