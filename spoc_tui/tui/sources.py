"""What the monitor reads from, built from the settings (or injected by tests)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from spoc_tui.collectors.nvml import NvmlCollector, NvmlUnavailable, TraceReplay
from spoc_tui.collectors.poller import DcgmPoller, VllmPoller
from spoc_tui.collectors.promql import PromQLCollector
from spoc_tui.config import Settings
from spoc_tui.core.errors import InputError
from spoc_tui.core.hardware.gpu import GpuSample, parse_tp_groups

logger = logging.getLogger(__name__)


class GpuReader(Protocol):
    """An NVML collector or a trace replay: a blocking read of every GPU (called from a thread)."""

    def read(self) -> list[GpuSample]: ...


@dataclass
class MonitorSources:
    """Everything the monitor reads from; built from settings or injected by tests."""

    vllm: VllmPoller | None = None
    dcgm: DcgmPoller | None = None
    gpu_readers: list[GpuReader] = field(default_factory=list)
    promql: PromQLCollector | None = None
    tp_groups: list[list[int]] | None = None
    find_groups: Callable[[], list[list[int]]] | None = None
    """Finds TP groups from local processes, where NVML can see them."""
    gpu_note: str | None = None

    async def aclose(self) -> None:
        for p in (self.vllm, self.dcgm):
            if p is not None:
                await p.aclose()
        for r in self.gpu_readers:
            stop = getattr(r, "stop", None)
            if stop:
                stop()


def build_sources(settings: Settings) -> MonitorSources:
    src = MonitorSources()
    if settings.prometheus_url:
        src.promql = PromQLCollector(settings.prometheus_url)
    if settings.vllm_urls and not settings.prometheus_url:
        src.vllm = VllmPoller(settings.vllm_urls, settings.window, settings.api_key)
    if settings.dcgm_urls:
        src.dcgm = DcgmPoller(settings.dcgm_urls, window_s=settings.window)
    if settings.nvml_trace:
        src.gpu_readers.append(TraceReplay(settings.nvml_trace, window_s=settings.window))
    elif settings.nvml is not False:
        try:
            col = NvmlCollector(window_s=settings.window)
            col.start()
            src.gpu_readers.append(col)
            src.find_groups = col.find_tp_groups
        except NvmlUnavailable as e:
            logger.info("NVML unavailable: %s", e)
            if settings.nvml:
                src.gpu_note = f"NVML unavailable: {e}"
    if settings.tp_groups:
        src.tp_groups = parse_tp_groups(settings.tp_groups)
    if not (src.dcgm or src.gpu_readers) and not src.gpu_note:
        src.gpu_note = "No GPU source: pass --dcgm URL, or run on the GPU host (NVML)."
    return src


class NothingToMonitor(InputError):
    """No server and no GPU source: the message says what to pass."""


def check_sources(src: MonitorSources) -> None:
    """Raises: NothingToMonitor."""
    if src.vllm is None and src.promql is None and src.dcgm is None and not src.gpu_readers:
        raise NothingToMonitor(
            "nothing to monitor: pass --url http://HOST:8000 (vLLM), --dcgm URL, --prometheus URL, "
            "or run on a GPU host; `spoc demo` shows the monitor on the simulator"
            + (f" ({src.gpu_note})" if src.gpu_note and src.gpu_note.startswith("NVML unavailable") else "")
        )
