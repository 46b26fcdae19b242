"""Alerts from a short history of server and GPU figures."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spoc_tui.core.hardware.gpu import GpuSample, TpGroupReport
from spoc_tui.core.metrics.vllm import EngineView

KV_HIGH = 0.90
SUSTAIN_SAMPLES = 5
"""An alert condition must hold for this many consecutive refreshes."""


@dataclass(frozen=True, slots=True)
class Alert:
    key: str
    severity: str
    """``warning`` or ``error``."""
    text: str


def server_alerts(history: Sequence[tuple[float | None, float | None, float | None]]) -> list[Alert]:
    """Alerts from ``(waiting, kv_usage, preemptions_total)`` samples, oldest first."""
    out: list[Alert] = []
    recent = list(history)[-SUSTAIN_SAMPLES - 1 :]
    waits = [w for w, _, _ in recent]
    if len(waits) > SUSTAIN_SAMPLES and all(w is not None for w in waits):
        ws = [w for w in waits if w is not None]
        # the queue never empties and only grows: a request that waits one step (0 -> 1) is not it
        if ws[0] > 0 and all(b >= a for a, b in zip(ws, ws[1:])) and ws[-1] > ws[0]:
            out.append(Alert("queue", "warning", f"queue keeps growing: {ws[0]:.0f} -> {ws[-1]:.0f} waiting"))
    kvs = [k for _, k, _ in recent[-SUSTAIN_SAMPLES:]]
    if len(kvs) == SUSTAIN_SAMPLES and all(k is not None and k >= KV_HIGH for k in kvs):
        out.append(
            Alert(
                "kv", "warning", f"KV cache above {KV_HIGH:.0%} ({kvs[-1]:.0%}): new requests wait, preemptions follow"
            )
        )
    pre = [p for _, _, p in recent]
    if len(pre) >= 2 and pre[0] is not None and pre[-1] is not None and pre[-1] > pre[0]:
        out.append(
            Alert(
                "preempt",
                "error",
                f"preemptions climbing: +{pre[-1] - pre[0]:.0f} in the last {len(pre) - 1} refreshes",
            )
        )
    return out


def shed_alerts(view: EngineView | None) -> list[Alert]:
    """Load turned away or lost over the window: admission rejections (a queue limit), aborted
    and errored requests, 4xx/5xx answers; each named with its rate once it is above zero."""
    if view is None:
        return []
    parts: list[str] = []
    if view.rejections_rate:
        parts.append(f"admission rejections {view.rejections_rate:.2g}/s")
    for reason in ("abort", "error"):
        r = view.finished_rates.get(reason)
        if r:
            parts.append(f"{'aborted' if reason == 'abort' else 'errored'} {r:.2g}/s")
    for status, r in sorted(view.http_rates.items()):
        if status[:1] in ("4", "5") and r:
            parts.append(f"HTTP {status} {r:.2g}/s")
    if not parts:
        return []
    severity = (
        "error"
        if view.rejections_rate or any(k.startswith("5") and v for k, v in view.http_rates.items())
        else "warning"
    )
    return [Alert("shed", severity, "shedding load over the window: " + ", ".join(parts))]


def gpu_alerts(gpus: Sequence[GpuSample], groups: Sequence[TpGroupReport]) -> list[Alert]:
    out: list[Alert] = []
    for rep in groups:
        msg = rep.alert()
        if msg:
            out.append(Alert(f"tp:{rep.name}", "error", msg))
    dragging = {m.gpu.key for rep in groups for m in rep.draggers}
    for g in gpus:
        if g.key in dragging or not g.throttling:
            continue
        kind = g.throttle_kind() or "other"
        reasons = ", ".join(g.throttle_reasons or []) or "violation counters"
        out.append(Alert(f"gpu:{g.key}", "warning", f"GPU {g.gpu} throttling ({kind}: {reasons})"))
    return out
