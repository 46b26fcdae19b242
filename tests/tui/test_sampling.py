"""The monitor's sampler (tui/sampling.py): what it reads each tick."""

from __future__ import annotations

import asyncio

from spoc_tui.config import Settings
from spoc_tui.tui.app import SpocApp
from spoc_tui.tui.messages import GpusSampled
from spoc_tui.tui.sources import MonitorSources


async def test_with_no_gpu_source_the_note_is_shown_once_not_ticked_every_second():
    """Issue 75: with no NVML and no --dcgm (a fleet through Prometheus), the sampler ticked a GPU
    source it did not have each second for the panel's note, and each tick redrew the GPU,
    roofline, verdict and event panels: a sixth of the monitor's CPU over 16 replicas."""
    note = "No GPU source: pass --dcgm URL, or run on the GPU host (NVML)."
    app = SpocApp(Settings(nvml=False, interval=0.02), MonitorSources(gpu_note=note), start_workers=False)
    seen: list[GpusSampled] = []
    async with app.run_test(size=(120, 40)) as pilot:
        post = app.post_message

        def counted(message):  # type: ignore[no-untyped-def]
            if isinstance(message, GpusSampled):
                seen.append(message)
            return post(message)

        app.post_message = counted  # type: ignore[method-assign]
        assert not app.sampler.reads_gpus()
        worker = app.sampler.poll()
        await asyncio.wait_for(worker.wait(), 5)  # nothing to read each tick: the loop ends after the note
        await pilot.pause()
        assert len(seen) == 1 and seen[0].note == note and not seen[0].tick.gpus
        assert note in str(app.monitor.gpu_note.render())
