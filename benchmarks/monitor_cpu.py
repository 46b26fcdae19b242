"""CPU use of the monitor watching one server and 8 GPUs at 1 s refresh for 60 s.

Target (issue 2): under 3 % of one core. The simulator runs in its own process (not counted);
this process runs the real app headlessly with its real workers and collectors.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spoc_tui.config import Settings  # noqa: E402
from spoc_tui.procs.ports import free_ports  # noqa: E402
from spoc_tui.sim.process import start_sim  # noqa: E402
from spoc_tui.tui.app import SpocApp  # noqa: E402

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def main() -> None:
    port, dport = free_ports(2)
    proc = start_sim(["--model", "llama-3.1-70b", "--tp", "8", "--dcgm-port", str(dport), "--load-users", "32"], port)
    try:
        s = Settings(
            vllm_urls=[f"http://127.0.0.1:{port}"],
            dcgm_urls=[f"http://127.0.0.1:{dport}/metrics"],
            nvml=False,
            tp_groups="0-7",
            interval=1.0,
        )
        app = SpocApp(s)
        async with app.run_test(size=(160, 48)):
            await asyncio.sleep(5)  # warm-up: first scrapes, layout
            c0, t0 = cpu(), time.monotonic()
            await asyncio.sleep(SECONDS)
            c1, t1 = cpu(), time.monotonic()
        ticks = len(app.monitor.latency.history["ttft"])
        print(
            f"monitor CPU over {t1 - t0:.0f} s at 1 s refresh, 1 server + 8 GPUs: {c1 - c0:.2f} s CPU = {100 * (c1 - c0) / (t1 - t0):.2f} % of one core (target < 3 %); {ticks} refreshes drawn"
        )
    finally:
        proc.stop()


if __name__ == "__main__":
    asyncio.run(main())
