"""A simulated fleet's scrapes as a Prometheus history: OpenMetrics text with each sample's
timestamp, for ``promtool tsdb create-blocks-from openmetrics``. A real Prometheus started on the
blocks then holds minutes or hours of the fleet's series, made on the virtual clock in seconds,
for the headroom learned through Prometheus (issue 75) to read with PromQL as it reads a fleet
Prometheus scraped. Each sample name is its own family of type ``unknown`` (OpenMetrics keeps a
family's samples together; Prometheus stores the raw samples either way)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TextIO

from spoc_tui.core.metrics.promparse import Exposition

Stored = Mapping[str, Sequence[tuple[float, Exposition]]]
"""Each instance's scrapes: (wall time, what it read)."""


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_openmetrics(scrapes: Stored, out: TextIO, job: str = "vllm") -> int:
    """Every scrape of every instance, labelled ``instance`` and ``job`` as Prometheus labels what
    it scrapes; returns the samples written."""
    names = sorted({name for rows in scrapes.values() for _, exp in rows for name in exp.samples})
    n = 0
    for name in names:
        out.write(f"# TYPE {name} unknown\n")
        series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
        for inst, rows in scrapes.items():
            for t, exp in rows:
                for labels, v in exp.get(name).items():
                    series.setdefault((inst, labels), []).append((t, v))
        for (inst, labels), points in sorted(series.items()):
            text = ",".join(f'{k}="{_label(v)}"' for k, v in (*labels, ("instance", inst), ("job", job)))
            out.writelines(f"{name}{{{text}}} {v!r} {t:.3f}\n" for t, v in points)
            n += len(points)
    out.write("# EOF\n")
    return n


def shifted(rows: Iterable[tuple[float, Exposition]], to: float) -> list[tuple[float, Exposition]]:
    """Scrapes on the virtual clock moved to wall time, the first at ``to``."""
    rows = list(rows)
    t0 = rows[0][0] if rows else 0.0
    return [(to + t - t0, exp) for t, exp in rows]
