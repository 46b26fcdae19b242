"""Record NVML through spoc's own collector while a PyTorch matmul burns the GPU, beside nvidia-smi.

Run on a GPU host (PyTorch and nvidia-ml-py installed; vLLM not needed):

    python scripts/record_nvml.py --out DIR [--idle 6 --burn 20 --cool 8 --bursts 2 --hz 10]

It writes, under DIR:

- ``nvml_trace.jsonl``: the trace format ``--nvml-trace`` and ``TraceReplay`` read (a ``meta`` line,
  then one object per GPU per sample, ``t`` in seconds from the start and ``phase`` idle/burn/cool),
  read by :class:`spoc_tui.collectors.nvml.NvmlCollector` itself (``read_raw``), violation counters
  included;
- ``nvidia_smi.csv``: ``nvidia-smi --query-gpu`` every second over the same run, with the time
  from the same start, so every figure can be checked against NVIDIA's own tool;
- ``summary.json``: per phase and GPU, the medians of both sources side by side;
- with ``--panel-svg``, the monitor's GPU table and TP panel drawn from the last live samples
  (Textual, headless), as the monitor shows them.

The burn runs in a child process (its own session) that exits when this script does, whatever stops
it: it watches its parent and stops when the parent is gone.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spoc_tui.collectors.nvml import NvmlCollector, NvmlUnavailable

SMI_FIELDS = (
    "timestamp,index,temperature.gpu,clocks.sm,clocks.max.sm,power.draw,power.limit,utilization.gpu,memory.used,"
    "clocks_event_reasons.active"
)

BURN = r"""
import os, sys, time, torch
parent, seconds, gpu = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
dev = torch.device(f"cuda:{gpu}")
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
end = time.monotonic() + seconds
n = 0
while time.monotonic() < end and os.getppid() == parent:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize(dev)
    n += 20
print(f"burn done: {n} matmuls of 8192^2 bf16 in {seconds:.0f} s", flush=True)
"""


def _smi_row(t0: float, writer: Any) -> None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return
    t = round(time.monotonic() - t0, 3)
    for line in out.strip().splitlines():
        writer.writerow([t, *[c.strip() for c in line.split(",")]])


def _phases(idle: float, burn: float, cool: float, bursts: int) -> list[tuple[str, float]]:
    out = [("idle", idle)]
    for i in range(bursts):
        out.append(("burn", burn))
        out.append(("cool" if i == bursts - 1 else "idle", cool if i == bursts - 1 else idle))
    return out


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 1) if vals else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--idle", type=float, default=6.0)
    ap.add_argument("--burn", type=float, default=20.0)
    ap.add_argument("--cool", type=float, default=8.0)
    ap.add_argument("--bursts", type=int, default=2)
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--gpu", type=int, default=0, help="the GPU to burn (all are recorded)")
    ap.add_argument("--panel-svg", type=Path, default=None)
    ap.add_argument("--summarize", action="store_true", help="only summarise the recording already in --out")
    a = ap.parse_args()
    if a.summarize:
        print(json.dumps(summarize(a.out, a.gpu), indent=1))
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        col = NvmlCollector()
        col.start()
    except NvmlUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    burn: subprocess.Popen[str] | None = None

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    last_live: list[Any] = []
    try:
        with (a.out / "nvml_trace.jsonl").open("w") as trace, (a.out / "nvidia_smi.csv").open("w", newline="") as sf:
            smi = csv.writer(sf)
            smi.writerow(["t", *SMI_FIELDS.split(",")])
            metas = [m for _, m in col.read_raw()]
            trace.write(json.dumps({"meta": metas}) + "\n")
            next_smi = 0.0
            for phase, seconds in _phases(a.idle, a.burn, a.cool, a.bursts):
                if phase == "burn":
                    burn = subprocess.Popen(
                        [sys.executable, "-c", BURN, str(os.getpid()), str(seconds), str(a.gpu)], text=True
                    )
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    tick = time.monotonic()
                    t = round(tick - t0, 3)
                    for reading, _meta in col.read_raw():
                        row = {"t": t, "phase": phase, **reading}
                        rows.append(row)
                        trace.write(json.dumps(row) + "\n")
                    last_live = col.read()
                    if t >= next_smi:
                        _smi_row(t0, smi)
                        next_smi = t + 1.0
                    time.sleep(max(0.0, 1.0 / a.hz - (time.monotonic() - tick)))
                if burn is not None:
                    burn.wait(timeout=60)
                    burn = None
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        if burn is not None and burn.poll() is None:
            burn.kill()
            burn.wait()
        col.stop()
    summary = summarize(a.out, a.gpu)
    print(json.dumps(summary, indent=1))
    if a.panel_svg is not None and last_live:
        _panel(last_live, a.panel_svg)
    return 0


def summarize(out: Path, gpu: int) -> dict[str, Any]:
    """Per phase, the medians of spoc's samples and of nvidia-smi's rows, each nvidia-smi row
    taking the phase of spoc's sample nearest in time (written to ``summary.json``)."""
    rows = [json.loads(line) for line in (out / "nvml_trace.jsonl").read_text().splitlines()[1:]]
    rows = [r for r in rows if r["gpu"] == gpu]
    smi_rows = [r for r in csv.DictReader((out / "nvidia_smi.csv").open()) if int(r["index"]) == gpu]

    def phase_at(t: float) -> str:
        return str(min(rows, key=lambda r: abs(r["t"] - t))["phase"])

    def f(r: dict[str, str], k: str) -> float | None:
        try:
            return float(r[k])
        except (KeyError, ValueError):
            return None

    summary: dict[str, Any] = {}
    for phase in ("idle", "burn", "cool"):
        ours = [r for r in rows if r["phase"] == phase]
        theirs = [r for r in smi_rows if phase_at(float(r["t"])) == phase]
        summary[phase] = {
            "spoc": {
                "samples": len(ours),
                "temp_c": _median([r["temp_c"] for r in ours]),
                "sm_mhz": _median([r["sm_mhz"] for r in ours]),
                "power_w": _median([r["power_mw"] / 1000 for r in ours if r["power_mw"] is not None]),
                "util_gpu": _median([r["util_gpu"] for r in ours]),
                "reasons": sorted({r["reasons"] for r in ours if r["reasons"] is not None}),
            },
            "nvidia_smi": {
                "samples": len(theirs),
                "temp_c": _median([f(r, "temperature.gpu") for r in theirs]),
                "sm_mhz": _median([f(r, "clocks.sm") for r in theirs]),
                "power_w": _median([f(r, "power.draw") for r in theirs]),
                "util_gpu": _median([f(r, "utilization.gpu") for r in theirs]),
                "reasons": sorted({int(r["clocks_event_reasons.active"], 16) for r in theirs}),
            },
        }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _panel(samples: list[Any], path: Path) -> None:
    """The monitor's GPU table and TP panel over the live samples, drawn headless."""
    import asyncio

    from textual.app import App, ComposeResult

    from spoc_tui.core.hardware.gpu import analyse_groups
    from spoc_tui.core.monitor.snapshots import GpuTick, SourceStatus
    from spoc_tui.tui.widgets.panels import GpuTable, TpPanel

    tick = GpuTick(tuple(samples), frozenset(), (), (SourceStatus("nvml", True),))
    groups = tuple(analyse_groups([list(range(len(samples)))], samples))

    class Panel(App[None]):
        def compose(self) -> ComposeResult:
            yield GpuTable(id="gpus")
            yield TpPanel(id="tp")

        def on_mount(self) -> None:
            self.query_one(GpuTable).show(tick, set())
            self.query_one(TpPanel).show(groups, [], None)

    async def run() -> None:
        app = Panel()
        async with app.run_test(size=(120, 20)) as pilot:
            await pilot.pause()
            app.save_screenshot(path.name, str(path.parent))

    asyncio.run(run())
    print(f"panel: {path}")


if __name__ == "__main__":
    sys.exit(main())
