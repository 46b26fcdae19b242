"""Regenerate screenshots/*.svg from the simulator (run: make screenshots; ``python
scripts/screenshots.py load fleet`` regenerates only the files whose names hold those words).

Starts the engine simulator with a background load in each scenario, opens the monitor on
it headlessly, lets it run, and saves SVG screenshots. Nothing here is drawn by hand.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from spoc_tui.config import Settings  # noqa: E402
from spoc_tui.procs.ports import free_block, free_ports  # noqa: E402
from spoc_tui.sim.process import start_sim  # noqa: E402
from spoc_tui.tui.app import SpocApp  # noqa: E402
from spoc_tui.tui.svg import fix_file  # noqa: E402

OUT = ROOT / "screenshots"
SHOTS = [
    # (file, scenario args, users, seconds to run, size)
    ("monitor-steady-120x40.svg", ["--scenario", "steady"], 48, 12, (120, 40)),
    ("monitor-thermal-120x40.svg", ["--scenario", "thermal", "--tp", "4", "--speed", "4"], 48, 20, (120, 40)),
    ("monitor-overload-120x40.svg", ["--scenario", "overload", "--speed", "3"], 768, 25, (120, 40)),
    ("monitor-steady-80x24.svg", ["--scenario", "steady"], 48, 8, (80, 24)),
    # a big terminal: the charts take the rows the tables leave
    ("monitor-thermal-200x60.svg", ["--scenario", "thermal", "--tp", "4", "--speed", "4"], 48, 45, (200, 60)),
    ("monitor-fleet-120x45.svg", ["--scenario", "fleet"], 96, 15, (120, 45)),
]


async def shoot(name: str, args: list[str], users: int, seconds: float, size: tuple[int, int]) -> None:
    replicas = 3 if "fleet" in args else 1
    port, dport = (free_block(3), free_block(3)) if replicas > 1 else free_ports(2)
    proc = start_sim([*args, "--dcgm-port", str(dport), "--load-users", str(users)], port)
    try:
        tp = args[args.index("--tp") + 1] if "--tp" in args else "1"
        settings = Settings(
            vllm_urls=[f"http://127.0.0.1:{port + i}" for i in range(replicas)],
            dcgm_urls=[f"http://127.0.0.1:{dport + i}/metrics" for i in range(replicas)],
            gpu_cost_per_hour=2.5 if replicas > 1 else None,
            nvml=False,
            tp_groups=f"0-{int(tp) - 1}" if int(tp) > 1 else None,
            interval=1.0,
            window=10.0,
        )
        app = SpocApp(settings)
        async with app.run_test(size=size) as pilot:
            if seconds < 90:  # a short run: charts over the last minute, not five mostly empty ones
                app.monitor.span_s = 60.0
            await asyncio.sleep(seconds)
            await pilot.pause()
            app.save_screenshot(path=str(OUT), filename=name)
            fix_file(OUT / name)  # renders right offline (no web font)
        print(f"wrote screenshots/{name}")
    finally:
        proc.stop()


async def shoot_load(name: str = "load-ramp-120x45.svg") -> None:
    """A short real ramp from the Load screen against a simulator with 8 seats."""
    port, dport = free_ports(2)
    proc = start_sim(["--gpu", "a100-40gb", "--max-num-seqs", "8", "--dcgm-port", str(dport)], port)
    try:
        settings = Settings(
            vllm_urls=[f"http://127.0.0.1:{port}"],
            dcgm_urls=[f"http://127.0.0.1:{dport}/metrics"],
            nvml=False,
            window=10,
        )
        app = SpocApp(settings)
        async with app.run_test(size=(120, 45)) as pilot:
            await pilot.press("l")
            await pilot.pause()
            scr = app.load_screen
            scr.query_one("#profile").value = "chatbot"
            scr.query_one("#users").value = "4,8,16,40"
            scr.query_one("#step").value = "10"
            scr.query_one("#warmup").value = "2"
            # chatbot users think 3-15 s: a short step sees few requests, enough to decide a p50
            scr.query_one("#sla").value = "ttft_p50<=500ms,itl_p50<=60ms"
            await pilot.press("ctrl+r")
            for _ in range(1200):
                await asyncio.sleep(0.25)
                if not scr.running:
                    break
            await pilot.pause()
            app.save_screenshot(path=str(OUT), filename=name)
            fix_file(OUT / name)  # renders right offline (no web font)
        print(f"wrote screenshots/{name}")
    finally:
        proc.stop()


TUNE_SPACE = """
[fixed]
max-model-len = 8192

[flags.max-num-seqs]
pow2 = [4, 64]
default = 64

[flags.max-num-batched-tokens]
choices = [1024, 4096, 16384]
default = 4096

[flags.enable-chunked-prefill]
choices = [true, false]
default = true
"""


async def shoot_tune(name: str = "tune-study-120x45.svg") -> None:
    """A real 8-trial study from the Tune screen: each trial starts a `spoc sim` server and ramps it."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        space = Path(d) / "space.toml"
        space.write_text(TUNE_SPACE)
        launch = (
            f"{sys.executable} -m spoc_tui.cli sim llama-3.1-8b --gpu a100-40gb --port {{port}} --dcgm-port 0 {{flags}}"
        )
        app = SpocApp(Settings(nvml=False, tune_launch=launch), start_workers=False)
        async with app.run_test(size=(120, 45)) as pilot:
            await pilot.press("t")
            await pilot.pause()
            scr = app.tune_screen
            scr.query_one("#space").value = str(space)
            scr.query_one("#objectives").value = "max:out_tok_s,min:ttft_p99"
            scr.query_one("#sla").value = "ttft_p99<=3s"
            scr.query_one("#trials").value = "8"
            scr.query_one("#users").value = "24"
            scr.query_one("#step").value = "8"
            await pilot.press("ctrl+r")
            for _ in range(1200):
                await asyncio.sleep(0.25)
                if not scr.running:
                    break
            app.clear_notifications()
            await pilot.pause()
            app.save_screenshot(path=str(OUT), filename=name)
            fix_file(OUT / name)  # renders right offline (no web font)
        print(f"wrote screenshots/{name}")


async def main(only: list[str]) -> None:
    """Every screenshot, or those whose file name holds one of ``only`` (``load``, ``fleet``)."""

    def wanted(name: str) -> bool:
        return not only or any(w in name for w in only)

    OUT.mkdir(exist_ok=True)
    for shot in SHOTS:
        if wanted(shot[0]):
            await shoot(*shot)
    if wanted("load-ramp-120x45.svg"):
        await shoot_load()
    if wanted("tune-study-120x45.svg"):
        await shoot_tune()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
