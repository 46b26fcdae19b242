"""Nsight Systems: a kernel summary (``nsys stats --report cuda_gpu_kern_sum --format csv``)
into the same classes as a torch trace.

A summary has no timeline, so it gives class shares of kernel time (no idle, no steps).
Older nsys versions call the report ``gpukernsum``; both print the same columns, preceded by
progress lines, which are skipped.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from pathlib import Path

from spoc_tui.core.hardware.kernels import CLASSES, IDLE, classify
from spoc_tui.profile.analyze import TOP_KERNELS, Breakdown, KernelRow
from spoc_tui.profile.trace import TraceError

REPORTS = ("cuda_gpu_kern_sum", "gpukernsum")
NS = 1e-9


def parse_kernel_summary(text: str, source: str) -> Breakdown:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip('"').startswith("Time")), None)
    if start is None:
        raise TraceError(f"{source}: no kernel summary table (a 'Time (%)' header) in the nsys output")
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    if not rows or "Name" not in rows[0] or "Total Time (ns)" not in rows[0]:
        raise TraceError(f"{source}: not an nsys kernel summary (need the Total Time (ns) and Name columns)")
    seconds = dict.fromkeys((*CLASSES, IDLE), 0.0)
    counts = dict.fromkeys(CLASSES, 0)
    kernels: list[KernelRow] = []
    for n, row in enumerate(rows, start=start + 2):
        name = (row.get("Name") or "").strip()
        if not name:
            continue
        try:
            total = float((row.get("Total Time (ns)") or "").replace(",", "")) * NS
            count = int(float((row.get("Instances") or row.get("Count") or "0").replace(",", "")))
        except ValueError:
            raise TraceError(f"{source}: line {n}: a time or count that is not a number") from None
        cls = classify(name)
        seconds[cls] += total
        counts[cls] += count
        kernels.append(KernelRow(name, cls, count, total))
    if not kernels:
        raise TraceError(f"{source}: the kernel summary lists no kernels")
    kernels.sort(key=lambda k: k.seconds, reverse=True)
    return Breakdown(
        source=source,
        timeline="device (nsys kernel summary)",
        lanes=["all devices"],
        span_s=sum(seconds.values()),
        seconds=seconds,
        counts=counts,
        top=kernels[:TOP_KERNELS],
        phases=[],
        events=len(kernels),
        notes=["an nsys summary has no timeline: shares are of kernel time, idle is not measured"],
    )


def read_nsys(path: Path) -> Breakdown:
    """A CSV the user exported, or an ``.nsys-rep``/``.sqlite`` report summarised by ``nsys stats``."""
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.suffix.lower() == ".csv":
        try:
            return parse_kernel_summary(path.read_text(errors="replace"), str(path))
        except OSError as e:
            raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    nsys = shutil.which("nsys")
    if nsys is None:
        raise TraceError(
            "nsys is not on PATH: install Nsight Systems, or give the CSV that "
            "`nsys stats --report cuda_gpu_kern_sum --format csv` writes"
        )
    last = ""
    for report in REPORTS:
        try:
            r = subprocess.run(
                [nsys, "stats", "--report", report, "--format", "csv", "--output", "-", str(path)],
                capture_output=True,
                text=True,
                timeout=600,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise TraceError(f"nsys stats failed on {path}: {e}") from None
        if r.returncode == 0 and "Time" in r.stdout:
            return parse_kernel_summary(r.stdout, str(path))
        said = (r.stderr or r.stdout).strip().splitlines()
        last = said[-1] if said else last
    raise TraceError(f"nsys stats could not summarise {path}: {last or 'no kernel summary'}")
