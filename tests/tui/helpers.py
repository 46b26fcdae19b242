"""Monitor states built from real captures, posted the way the workers post them."""

from dataclasses import replace
from pathlib import Path
from typing import Any

from spoc_tui.collectors.nvml import TraceReplay
from spoc_tui.config import Settings
from spoc_tui.core.hardware.gpu import GpuSample, analyse_groups
from spoc_tui.core.metrics.promparse import parse_text
from spoc_tui.core.metrics.vllm import Scrape, server_view
from spoc_tui.core.monitor.snapshots import GpuTick, SourceStatus, VllmTick
from spoc_tui.tui.app import MonitorSources, SpocApp
from spoc_tui.tui.messages import GpusSampled

FIX = Path(__file__).parents[1] / "fixtures"
URL = "http://192.0.2.5:8000"
DCGM = "http://192.0.2.5:9400/metrics"


def settings() -> Settings:
    return Settings(vllm_urls=[URL], dcgm_urls=[DCGM], nvml=False, tp_groups="0-3", window=60)


def make_app(s: Settings | None = None, ascii_mode: bool = False) -> SpocApp:
    return SpocApp(s or settings(), MonitorSources(), start_workers=False, ascii_mode=ascii_mode)


def server_tick(up: bool = True, at: float | None = None) -> VllmTick:
    """The 0.32 capture as one server's tick; ``up=False``: the server unreachable, its status
    taken at ``at`` (wall time; now when not given), so its retry counts down from there."""
    now = parse_text((FIX / "vllm/vllm_0.32_cpu_full_load.txt").read_text())
    then = parse_text((FIX / "vllm/vllm_0.32_cpu_full_idle.txt").read_text())
    view = server_view(URL, Scrape(now, 160.0, then, 100.0))
    status = SourceStatus(
        URL, up, None if up else f"{URL}: cannot connect (All connection attempts failed)", None, None if up else 4.0
    )
    if at is not None:
        status = replace(status, at=at)
    return VllmTick((view,), None, frozenset() if up else frozenset({URL}), (), (status,))


def gpu_tick() -> GpusSampled:
    rep = TraceReplay(FIX / "h100_nvml_trace.jsonl")
    base = [rep.read()[0] for _ in range(320)][-1]  # under the power-capped burn
    gpus = []
    for i in range(4):
        clock, temp, mask = (base.sm_clock_mhz, base.temp_c, base.reasons_mask)
        if i == 3:
            clock, temp, mask = 980.0, 90.0, 0x20
        gpus.append(
            GpuSample(
                DCGM,
                str(i),
                f"GPU-{i:04d}",
                base.model,
                "node-a",
                None,
                temp,
                (temp or 0) + 4,
                clock,
                1980.0,
                base.power_w,
                base.power_limit_w,
                99.0,
                61440.0,
                81559.0,
                mask,
                89.0,
                95.0,
            )
        )
    groups = tuple(analyse_groups([[0, 1, 2, 3]], gpus))
    return GpusSampled(GpuTick(tuple(gpus), frozenset(), (), (SourceStatus(DCGM, True),)), groups)


def no_gpu() -> GpusSampled:
    return GpusSampled(
        GpuTick((), frozenset(), (), ()), (), "No GPU source: pass --dcgm URL, or run on the GPU host (NVML)."
    )


async def settle(pilot: Any, most: int = 20) -> None:
    """Wait until the screen stops changing (two pauses drawing the same), at most ``most``
    pauses: a wide layout measures its panels again after the first refresh, which two fixed
    pauses could miss on a loaded machine."""
    before = None
    for _ in range(most):
        await pilot.pause()
        now = pilot.app.export_screenshot()
        if now == before:
            return
        before = now


def painted(app: SpocApp) -> str:
    """The screen's text as it is painted (each row of the exported screenshot, spaces as spaces):
    what a terminal shows, not what a widget would render if it were on screen."""
    import html
    import re

    rows: dict[int, list[str]] = {}
    for m in re.finditer(
        r'<text[^>]*clip-path="url\(#terminal-\d+-line-(\d+)\)">([^<]*)</text>', app.export_screenshot()
    ):
        rows.setdefault(int(m[1]), []).append(html.unescape(m[2]).replace("\xa0", " "))
    return "\n".join("".join(parts) for _, parts in sorted(rows.items()))
