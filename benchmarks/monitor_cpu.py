"""CPU use of the monitor watching one server and 8 GPUs at 1 s refresh, beside a bare Textual app.

Target (issue 35): at most 1 % of one core at 160x48 with one server (TP 8) and 8 GPUs at 1 s.
The simulator runs in its own process (not counted); this process runs the real app headlessly
with its real workers and collectors (scrapes and parsing included). In the same run, for scale,
a bare Textual app of the same size redraws one line of text every second: what Textual itself
costs at that refresh. Run with ``make bench`` (60 s each) or ``python benchmarks/monitor_cpu.py
[SECONDS]``; ``--smoke`` measures 5 s each (that the script runs, not its figures).
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from textual.app import App, ComposeResult  # noqa: E402
from textual.widgets import Static  # noqa: E402

from spoc_tui.config import Settings  # noqa: E402
from spoc_tui.procs.ports import free_ports  # noqa: E402
from spoc_tui.sim.process import start_sim  # noqa: E402
from spoc_tui.tui.app import SpocApp  # noqa: E402

SMOKE = "--smoke" in sys.argv
ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
SECONDS = 5.0 if SMOKE else float(ARGS[0]) if ARGS else 60.0
WINDOW_S = 60.0
"""The monitor's default window; it is measured once a full window of history is kept (the
steady state an operator watches in), not while the first minute fills it."""
WARMUP_S = 5.0 if SMOKE else WINDOW_S + 5.0
SIZE = (160, 48)
TARGET_PCT = 1.0


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Bare(App[None]):
    """The baseline: one line of text redrawn every second, nothing else."""

    def compose(self) -> ComposeResult:
        yield Static("", id="line")

    def on_mount(self) -> None:
        self.n = 0
        self.set_interval(1.0, self.tick)

    def tick(self) -> None:
        self.n += 1
        self.query_one("#line", Static).update(f"refresh {self.n} at {time.strftime('%H:%M:%S')}")


async def measure(app: App[object], warmup: float) -> tuple[float, float]:
    async with app.run_test(size=SIZE):
        await asyncio.sleep(warmup)
        c0, t0 = cpu(), time.monotonic()
        await asyncio.sleep(SECONDS)
        c1, t1 = cpu(), time.monotonic()
    return c1 - c0, t1 - t0


async def main() -> int:
    bare = Bare()
    b_cpu, b_wall = await measure(bare, 2.0)
    port, dport = free_ports(2)
    proc = start_sim(["--model", "llama-3.1-70b", "--tp", "8", "--dcgm-port", str(dport), "--load-users", "32"], port)
    try:
        s = Settings(
            vllm_urls=[f"http://127.0.0.1:{port}"],
            dcgm_urls=[f"http://127.0.0.1:{dport}/metrics"],
            nvml=False,
            tp_groups="0-7",
            interval=1.0,
            window=WINDOW_S,
        )
        app = SpocApp(s)
        m_cpu, m_wall = await measure(app, WARMUP_S)
        drawn = app.monitor.drawn
    finally:
        proc.stop()
    m_pct, b_pct = 100 * m_cpu / m_wall, 100 * b_cpu / b_wall
    print(f"{SIZE[0]}x{SIZE[1]}, 1 s refresh, {m_wall:.0f} s each after {WARMUP_S:.0f} s of warm-up, one run:")
    print(
        f"  spoc monitor, 1 server (TP 8) + 8 GPUs: {m_cpu:.2f} s CPU = {m_pct:.2f} % of one core ({drawn} ticks drawn)"
    )
    print(f"  a bare Textual app, one line a second:  {b_cpu:.2f} s CPU = {b_pct:.2f} % of one core")
    verdict = "meets" if m_pct <= TARGET_PCT else "MISSES"
    print(
        f"monitor {m_pct:.2f} % ({m_pct / max(b_pct, 1e-9):.1f}x the bare app): {verdict} the {TARGET_PCT:g} % target"
    )
    return 0 if SMOKE or m_pct <= TARGET_PCT else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
