"""NVML readings through nvidia-ml-py (``import pynvml``), plus replay of recorded traces.

NVML calls block, so the app calls :meth:`NvmlCollector.read` from a thread worker. Each
field that fails reads None (a card that lacks memory temperature still shows the rest).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from spoc_tui.core.errors import EXIT_USAGE, SpocError
from spoc_tui.core.files import FileReadError, JsonLineError, json_lines, read_text_bounded
from spoc_tui.core.hardware.gpu import GpuSample, ThrottleWindow, groups_from_processes, nvml_gpu
from spoc_tui.core.jsonsafe import finite_number

_POLICIES = {
    "POWER": 0,
    "THERMAL": 1,
    "SYNC_BOOST": 2,
    "BOARD_LIMIT": 3,
    "LOW_UTILIZATION": 4,
    "RELIABILITY": 5,
}
_FI_DEV_MEMORY_TEMP = 82
_THRESHOLD_SHUTDOWN = 0
_THRESHOLD_SLOWDOWN = 1


class NvmlError(SpocError):
    """An NVML trace that cannot be played (exit code 2: bad input)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=EXIT_USAGE)


class NvmlUnavailable(SpocError):
    """NVML cannot be used here (no library, no driver, no GPU); the message says which."""


def load_pynvml() -> ModuleType:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # the deprecated pynvml shim
            import pynvml
    except ImportError:
        raise NvmlUnavailable("nvidia-ml-py is not installed") from None
    return pynvml  # type: ignore[no-any-return]  # nvidia-ml-py ships no type information


class NvmlCollector:
    """Reads every GPU through NVML. ``nvml`` may be any object with pynvml's API."""

    def __init__(self, nvml: Any | None = None, source: str = "nvml", window_s: float = 60.0) -> None:
        self.nvml = nvml if nvml is not None else load_pynvml()
        self.source = source
        self._handles: list[Any] = []
        self._meta: list[dict[str, Any]] = []
        self.throttle = ThrottleWindow(window_s)
        self._started = False

    def start(self) -> None:
        """``nvmlInit`` once, and read what does not change (names, UUIDs, thresholds).

        Raises:
            NvmlUnavailable: with NVML's own reason.
        """
        n = self.nvml
        try:
            n.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            raise NvmlUnavailable(f"NVML: {e}") from None
        self._started = True
        try:
            count = n.nvmlDeviceGetCount()
        except Exception as e:
            self.stop()
            raise NvmlUnavailable(f"NVML: {e}") from None
        if count == 0:
            self.stop()
            raise NvmlUnavailable("NVML: no GPU found")
        for i in range(count):
            h = n.nvmlDeviceGetHandleByIndex(i)
            self._handles.append(h)
            self._meta.append(
                {
                    "gpu": i,
                    "name": self._try(n.nvmlDeviceGetName, h),
                    "uuid": self._try(n.nvmlDeviceGetUUID, h),
                    "pci": getattr(self._try(n.nvmlDeviceGetPciInfo, h), "busId", None),
                    "slowdown_c": self._try(n.nvmlDeviceGetTemperatureThreshold, h, _THRESHOLD_SLOWDOWN),
                    "shutdown_c": self._try(n.nvmlDeviceGetTemperatureThreshold, h, _THRESHOLD_SHUTDOWN),
                    "sm_max_mhz": self._try(n.nvmlDeviceGetMaxClockInfo, h, 1),
                    "hostname": os.uname().nodename,
                }
            )

    def stop(self) -> None:
        if self._started:
            self._try(self.nvml.nvmlShutdown)
            self._started = False

    @staticmethod
    def _try(fn: Callable[..., Any] | None, *args: Any) -> Any:
        if fn is None:  # a function this nvidia-ml-py does not have
            return None
        try:
            return fn(*args)
        except Exception:
            return None

    def _reasons(self, h: Any) -> int | None:
        n = self.nvml
        for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
            fn = getattr(n, name, None)
            if fn is None:
                continue
            try:
                return int(fn(h))
            except Exception:
                continue
        return None

    def _mem_temp(self, h: Any) -> int | None:
        fn = getattr(self.nvml, "nvmlDeviceGetFieldValues", None)
        if fn is None:
            return None
        try:
            (fv,) = fn(h, [_FI_DEV_MEMORY_TEMP])
        except Exception:
            return None
        if getattr(fv, "nvmlReturn", 1) != 0:
            return None
        return int(fv.value.ullVal)

    def read_raw(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """One reading per GPU in the trace format: ``[(reading, meta), ...]``."""
        n = self.nvml
        out = []
        for h, meta in zip(self._handles, self._meta):
            util = self._try(n.nvmlDeviceGetUtilizationRates, h)
            mem = self._try(n.nvmlDeviceGetMemoryInfo, h)
            viol = {}
            for name, pid in _POLICIES.items():
                v = self._try(n.nvmlDeviceGetViolationStatus, h, pid)
                if v is not None:
                    viol[name] = {"ref_us": v.referenceTime, "violation_ns": v.violationTime}
            reading = {
                "gpu": meta["gpu"],
                "temp_c": self._try(n.nvmlDeviceGetTemperature, h, 0),
                "mem_temp_c": self._mem_temp(h),
                "sm_mhz": self._try(n.nvmlDeviceGetClockInfo, h, 1),
                "sm_max_mhz": meta["sm_max_mhz"],
                "power_mw": self._try(n.nvmlDeviceGetPowerUsage, h),
                # added in NVML 5xx; an older nvidia-ml-py has no such function: read None
                "energy_mj": self._try(getattr(n, "nvmlDeviceGetTotalEnergyConsumption", None), h),
                "power_limit_mw": self._try(n.nvmlDeviceGetEnforcedPowerLimit, h),
                "util_gpu": getattr(util, "gpu", None),
                "fb_used": getattr(mem, "used", None),
                "fb_total": getattr(mem, "total", None),
                "reasons": self._reasons(h),
                "violations": viol,
            }
            out.append((reading, meta))
        return out

    def read(self) -> list[GpuSample]:
        """Current samples, with "% of window throttled" over the window."""
        now = time.monotonic()
        return [self.throttle.add(now, nvml_gpu(reading, meta, self.source)) for reading, meta in self.read_raw()]

    def compute_pids(self) -> dict[int, list[int]]:
        n = self.nvml
        out: dict[int, list[int]] = {}
        for i, h in enumerate(self._handles):
            procs = self._try(n.nvmlDeviceGetComputeRunningProcesses, h) or []
            out[i] = [p.pid for p in procs]
        return out

    def find_tp_groups(self) -> list[list[int]]:
        """TP groups from the vLLM worker processes on this host (same parent process)."""
        gpu_pids = self.compute_pids()
        parents = {pid: _ppid(pid) for pids in gpu_pids.values() for pid in pids}
        return groups_from_processes(gpu_pids, {k: v for k, v in parents.items() if v is not None})


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm may contain spaces and parentheses: the fields after the last ')' are fixed.
    rest = stat.rsplit(")", 1)[-1].split()
    return int(rest[1]) if len(rest) > 1 else None


class TraceReplay:
    """Plays a recorded NVML trace (shared/data/h100_nvml_*.jsonl) as if it were live.

    Each :meth:`read` returns the next sample of the trace (looping at the end), with
    the trace's own time stamps used for "% of window throttled".
    """

    def __init__(self, path: str | Path, source: str = "nvml-trace", window_s: float = 60.0) -> None:
        self.source = source
        self.throttle = ThrottleWindow(window_s)
        self.meta: dict[str, Any] = {}
        self.rows: list[dict[str, Any]] = []
        try:
            text = read_text_bounded(path)
        except FileReadError as e:
            raise NvmlError(f"--nvml-trace {path}: {e}") from None
        try:
            for i, obj in json_lines(text.splitlines()):
                if not isinstance(obj, dict):
                    raise NvmlError(f"--nvml-trace {path} line {i}: not a JSON object")
                if "meta" in obj:
                    m = obj["meta"]
                    m = m[0] if isinstance(m, list) and m else m
                    if not isinstance(m, dict):
                        raise NvmlError(f"--nvml-trace {path} line {i}: meta is not an object (a GPU's names)")
                    self.meta = m
                else:
                    t = obj.get("t", 0.0)
                    if not finite_number(t):
                        raise NvmlError(f"--nvml-trace {path} line {i}: t is not a number of seconds")
                    self.rows.append(obj)
        except JsonLineError as e:
            raise NvmlError(f"--nvml-trace {path} line {e.lineno}: not JSON (a trace is JSON lines)") from None
        if not self.rows:
            raise NvmlError(f"--nvml-trace {path}: no samples")
        self._i = 0
        self._laps = 0

    def read(self) -> list[GpuSample]:
        row = self.rows[self._i % len(self.rows)]
        if self._i and self._i % len(self.rows) == 0:
            self.throttle = ThrottleWindow(self.throttle.window_s)  # looped: the counters start again
        self._i += 1
        s = nvml_gpu(row, self.meta, self.source)
        return [self.throttle.add(float(row.get("t", 0.0)), s)]
