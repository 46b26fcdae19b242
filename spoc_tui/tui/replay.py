"""``spoc replay FILE``: a recorded monitor session played back on the same screen, with pause,
seek and speed, so an incident can be looked at afterwards.

The monitor's clock follows the recording, so its charts, events and "last N s" read as they did
live. A seek rebuilds the history up to the new time (charts and events included) without
drawing each step; gaps between sessions longer than :data:`MAX_GAP_S` are jumped over.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from textual import work
from textual.binding import Binding

from spoc_tui.config import Settings
from spoc_tui.core.hardware.gpu import analyse_groups
from spoc_tui.core.monitor.recording import Record, Recording
from spoc_tui.tui.app import SpocApp
from spoc_tui.tui.messages import GpusSampled, ServersSampled
from spoc_tui.tui.sources import MonitorSources

MAX_GAP_S = 10.0
SPEEDS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class ReplayApp(SpocApp):
    BINDINGS = [
        Binding("space", "toggle_pause", "Pause", priority=True),
        # priority: the monitor's scrolling body would take these keys first
        Binding("left", "seek(-30)", "-30s", priority=True),
        Binding("right", "seek(30)", "+30s", priority=True),
        Binding("shift+left,pageup", "seek(-300)", "-5m", show=False, priority=True),
        Binding("shift+right,pagedown", "seek(300)", "+5m", show=False, priority=True),
        Binding("home", "seek_to(0)", "Start", show=False, priority=True),
        Binding("end", "seek_to(1)", "End", show=False, priority=True),
        Binding("plus,equals_sign", "speed(1)", "Faster"),
        Binding("minus", "speed(-1)", "Slower"),
    ]

    def __init__(self, recording: Recording, speed: float = 1.0) -> None:
        head = recording.headers[-1]
        settings = Settings(
            window=float(head.get("window_s") or 60.0),
            interval=float(head.get("interval_s") or 1.0),
            sla=head.get("sla") or None,
            nvml=False,
        )
        super().__init__(settings, MonitorSources(), start_workers=False)
        self.recording = recording
        self.speed = speed
        self.pos_t = recording.start
        self.i = 0
        self.recorded_title = str(head.get("title") or "")

    def on_mount(self) -> None:
        # Textual calls every class's own on_mount, this one first and SpocApp's after it, which
        # makes the monitor: calling it here as well had pushed a second monitor over the first,
        # and the clock set on the first left the one shown on the wall clock
        self.call_later(self._start)

    def _start(self) -> None:
        self.monitor.clock = lambda: self.pos_t
        self._show_position()
        self._play()

    # -- playing -------------------------------------------------------------------------------
    def _apply(self, r: Record, draw: bool) -> None:
        m = self.monitor
        if r.servers is not None:
            if draw:
                m.apply_servers(ServersSampled(r.servers))
            else:
                m.ingest_servers(r.servers)
        elif r.gpus is not None:
            groups = tuple(analyse_groups(r.groups, r.gpus.gpus)) if r.groups else ()
            msg = GpusSampled(r.gpus, groups, r.note)
            if draw:
                m.apply_gpus(msg)
            else:
                m.ingest_gpus(msg)
        elif r.status is not None:
            if draw:
                m.apply_status(r.status)
            else:
                m.ingest_status(r.status)
        elif r.headroom is not None:  # the headroom as the monitor had it then
            m.apply_headroom(r.headroom)

    @work(group="replay", exclusive=True, exit_on_error=False)
    async def _play(self) -> None:
        records = self.recording.records
        while not self.monitor.ready:  # its widgets first, or the first records would be dropped
            await asyncio.sleep(0.02)
        shown = 0.0
        while True:
            now = time.monotonic()
            if now - shown >= 0.5:
                self._show_position()
                shown = now
            if self.paused or self.i >= len(records):
                await asyncio.sleep(0.1)
                continue
            r = records[self.i]
            gap = r.t - self.pos_t
            if gap > MAX_GAP_S:  # between two sessions: jump
                self.events.note("replay", f"gap of {gap:.0f} s in the recording skipped", t=r.t)
                self.pos_t = r.t
            elif gap > 0:
                step = min(gap, 0.1 * self.speed)
                await asyncio.sleep(step / self.speed)
                self.pos_t += step
                continue
            self.pos_t = max(self.pos_t, r.t)
            self._apply(r, draw=True)
            self.i += 1
            if self.i == len(records):
                self._show_position()

    def _show_position(self) -> None:
        rec = self.recording
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.pos_t))
        state = "paused" if self.paused else ("end" if self.i >= len(rec.records) else f"x{self.speed:g}")
        done = self.pos_t - rec.start
        total = rec.end - rec.start
        self.monitor.set_title(
            f"REPLAY {Path(rec.path).name} · {at} · {done:.0f}/{total:.0f} s · {state} · "
            "space pause, ←/→ 30 s, +/- speed" + (f" · {self.recorded_title}" if self.recorded_title else "")
        )

    # -- controls -----------------------------------------------------------------------------
    def action_toggle_pause(self) -> None:
        super().action_toggle_pause()
        self._show_position()

    def action_seek(self, seconds: float) -> None:
        self.seek(self.pos_t + float(seconds))

    def action_seek_to(self, fraction: float) -> None:
        rec = self.recording
        self.seek(rec.start + float(fraction) * (rec.end - rec.start))

    def seek(self, t: float) -> None:
        """Rebuild the state up to ``t`` (charts and events included), then draw it."""
        rec = self.recording
        t = min(max(t, rec.start), rec.end)
        m = self.monitor
        m.reset_history()
        i = 0
        while i < len(rec.records) and rec.records[i].t <= t:
            self.pos_t = rec.records[i].t
            self._apply(rec.records[i], draw=False)
            i += 1
        self.i, self.pos_t = i, t
        with self.batch_update():
            m.redraw()
        self._show_position()

    def action_speed(self, direction: int) -> None:
        i = min(range(len(SPEEDS)), key=lambda k: abs(SPEEDS[k] - self.speed))
        self.speed = SPEEDS[min(max(i + int(direction), 0), len(SPEEDS) - 1)]
        self._show_position()
