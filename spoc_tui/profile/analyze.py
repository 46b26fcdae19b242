"""Where a profiled step's time went: kernel classes, idle time between kernels, per step kind.

Two timelines, whichever the trace has:

* **device** (GPU traces): kernels, copies and memsets on each device. A class's time is the
  sum of its kernels' durations; idle is, per device, the time between its first and last
  kernel that no kernel covers (streams overlapping count once for idle, and each kernel for
  its class).
* **host** (the vLLM CPU build, whose kernels are operators such as ``_C::onednn_mm``): the
  engine thread (the one with vLLM's step annotations, else the busiest), each operator counted
  by its *self* time (its duration less its children's), so nested operators are not counted
  twice; idle is the time between its first and last operator that no operator covers.

Shares are of class time plus idle, so they sum to 100 %. Steps are vLLM's ``execute_…``
annotations: prefill (only requests without output yet), decode (only requests generating) or
mixed; each gets its own shares, step count and step time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spoc_tui.core.hardware.kernels import CLASSES, IDLE, classify
from spoc_tui.profile.trace import Intervals, Steps, TraceData, TraceError

US = 1e-6
TOP_KERNELS = 15


@dataclass(frozen=True, slots=True)
class KernelRow:
    name: str
    cls: str
    count: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Phase:
    kind: str
    """prefill, decode or mixed."""
    steps: int
    mean_step_s: float
    p50_step_s: float
    tokens_per_step: float
    seconds: dict[str, float]
    """Class -> seconds within these steps, idle included."""

    @property
    def shares(self) -> dict[str, float]:
        return _shares(self.seconds)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "steps": self.steps,
            "mean_step_ms": self.mean_step_s * 1e3,
            "p50_step_ms": self.p50_step_s * 1e3,
            "tokens_per_step": self.tokens_per_step,
            "seconds": self.seconds,
            "shares": self.shares,
        }


@dataclass
class Breakdown:
    source: str
    timeline: str
    """device or host."""
    lanes: list[str]
    """Devices (GPU traces) or the engine thread (host traces)."""
    span_s: float
    seconds: dict[str, float]
    """Class -> seconds, idle included (sums to the denominator of the shares)."""
    counts: dict[str, int]
    top: list[KernelRow]
    phases: list[Phase]
    events: int
    notes: list[str] = field(default_factory=list)
    roofline_step_s: float | None = None
    """The shortest possible decode step (weight bytes per GPU / HBM bandwidth), when known."""
    roofline_basis: str | None = None

    @property
    def shares(self) -> dict[str, float]:
        return _shares(self.seconds)

    @property
    def decode_step_s(self) -> float | None:
        for p in self.phases:
            if p.kind == "decode":
                return p.mean_step_s
        return None

    def as_dict(self) -> dict[str, Any]:
        measured = self.decode_step_s
        return {
            "source": self.source,
            "timeline": self.timeline,
            "lanes": self.lanes,
            "span_s": self.span_s,
            "events": self.events,
            "seconds": self.seconds,
            "shares": self.shares,
            "counts": self.counts,
            "top_kernels": [{"name": k.name, "class": k.cls, "count": k.count, "seconds": k.seconds} for k in self.top],
            "phases": [p.as_dict() for p in self.phases],
            "decode_step_ms": None if measured is None else measured * 1e3,
            "decode_roofline_ms": None if self.roofline_step_s is None else self.roofline_step_s * 1e3,
            "decode_roofline_basis": self.roofline_basis,
            "decode_vs_roofline": (
                None if measured is None or not self.roofline_step_s else measured / self.roofline_step_s
            ),
            "notes": self.notes,
        }


def _shares(seconds: dict[str, float]) -> dict[str, float]:
    total = sum(seconds.values())
    return {k: (v / total if total > 0 else 0.0) for k, v in seconds.items()}


def _empty_seconds() -> dict[str, float]:
    return dict.fromkeys((*CLASSES, IDLE), 0.0)


def _arrays(iv: Intervals) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.frombuffer(iv.ts, dtype=np.float64),
        np.frombuffer(iv.end, dtype=np.float64),
        np.frombuffer(iv.lane, dtype=np.int64),
        np.frombuffer(iv.name, dtype=np.int64),
    )


def _gaps(ts: np.ndarray, end: np.ndarray) -> tuple[float, float]:
    """(span, idle) of intervals sorted by start: idle is the span no interval covers."""
    if ts.size == 0:
        return 0.0, 0.0
    reach = np.maximum.accumulate(end)
    gaps = np.clip(ts[1:] - reach[:-1], 0.0, None)
    return float(reach[-1] - ts[0]), float(gaps.sum())


def _step_kind(steps: Steps, i: int) -> str | None:
    ctx, gen = steps.ctx_reqs[i], steps.gen_reqs[i]
    if ctx and gen:
        return "mixed"
    if ctx:
        return "prefill"
    if gen:
        return "decode"
    return None


def _phases(
    steps: Steps, keep: np.ndarray | None, ts: np.ndarray, secs: np.ndarray, cls_idx: np.ndarray, labels: list[str]
) -> list[Phase]:
    """Per step kind: step count and times, and the class seconds of the events that start
    inside its steps (idle: the steps' time no event covers)."""
    if len(steps) == 0:
        return []
    s_ts = np.frombuffer(steps.ts, dtype=np.float64)
    s_end = np.frombuffer(steps.end, dtype=np.float64)
    idx = np.arange(len(steps)) if keep is None else np.flatnonzero(keep)
    if idx.size == 0:
        return []
    order = idx[np.argsort(s_ts[idx], kind="stable")]
    starts, ends = s_ts[order], s_end[order]
    pos = np.searchsorted(starts, ts, side="right") - 1
    inside = (pos >= 0) & (ts < ends[np.clip(pos, 0, None)])
    kinds = np.array([_step_kind(steps, int(i)) or "" for i in order])
    out: list[Phase] = []
    for kind in ("prefill", "decode", "mixed"):
        sel = kinds == kind
        if not sel.any():
            continue
        durs = (ends - starts)[sel]
        mine = inside & np.isin(pos, np.flatnonzero(sel))
        seconds = _empty_seconds()
        sums = np.bincount(cls_idx[mine], weights=secs[mine], minlength=len(labels))
        for i, label in enumerate(labels):
            seconds[label] += float(sums[i])
        busy = sum(seconds.values())
        seconds[IDLE] = max(0.0, float(durs.sum()) * US - busy)
        toks = [steps.ctx_tokens[int(i)] + steps.gen_tokens[int(i)] for i in order[sel]]
        out.append(
            Phase(
                kind=kind,
                steps=int(sel.sum()),
                mean_step_s=float(durs.mean()) * US,
                p50_step_s=float(np.median(durs)) * US,
                tokens_per_step=float(np.mean(toks)),
                seconds=seconds,
            )
        )
    return out


def _top(names: list[str], name_idx: np.ndarray, secs: np.ndarray) -> list[KernelRow]:
    if name_idx.size == 0:
        return []
    totals = np.bincount(name_idx, weights=secs)
    counts = np.bincount(name_idx)
    best = np.argsort(totals)[::-1][:TOP_KERNELS]
    return [
        KernelRow(names[int(i)], classify(names[int(i)]), int(counts[i]), float(totals[i]))
        for i in best
        if counts[i] > 0
    ]


def _class_index(names: list[str]) -> tuple[np.ndarray, list[str]]:
    labels = list(CLASSES)
    where = {c: i for i, c in enumerate(labels)}
    return np.array([where[classify(n)] for n in names] or [0], dtype=np.int64), labels


def analyse(data: TraceData) -> Breakdown:
    """The breakdown of a trace read by :func:`spoc_tui.profile.trace.read_trace`."""
    if len(data.device):
        return _device(data)
    if len(data.host):
        return _host(data)
    raise TraceError(
        f"{data.path}: no kernels and no operators in {data.events:,} events: "
        "was anything running while the profiler was on?"
    )


def _device(data: TraceData) -> Breakdown:
    ts, end, lane, name = _arrays(data.device)
    cls_of_name, labels = _class_index(data.names)
    cls_idx = cls_of_name[name]
    secs = (end - ts) * US
    seconds = _empty_seconds()
    for i, s in enumerate(np.bincount(cls_idx, weights=secs, minlength=len(labels))):
        seconds[labels[i]] += float(s)
    counts = {labels[i]: int(c) for i, c in enumerate(np.bincount(cls_idx, minlength=len(labels)))}
    span = idle = 0.0
    lanes: list[str] = []
    for dev in np.unique(lane):
        sel = lane == dev
        order = np.argsort(ts[sel], kind="stable")
        sp, gap = _gaps(ts[sel][order], end[sel][order])
        span = max(span, sp * US)
        idle += gap * US
        lanes.append(data.device_names.get(int(dev), f"device {int(dev)}"))
    seconds[IDLE] = idle
    notes: list[str] = []
    steps = data.device_steps
    if not len(steps) and len(data.host_steps):
        notes.append(
            "no step annotations on the device timeline: per-step figures left out "
            "(kernels run after their launch, so host-side steps would misplace them)"
        )
    phases = _phases(steps, None, ts, secs, cls_idx, labels)
    return Breakdown(
        source=data.path,
        timeline="device",
        lanes=lanes,
        span_s=span,
        seconds=seconds,
        counts=counts,
        top=_top(data.names, name, secs),
        phases=phases,
        events=data.events,
        notes=notes,
    )


def _self_times(ts: list[float], end: list[float]) -> tuple[list[float], list[bool]]:
    """Self time of each operator (sorted by start, longest first on ties) and whether it is
    top-level, from a stack of the operators that enclose it."""
    n = len(ts)
    child = [0.0] * n
    top = [False] * n
    stack: list[int] = []
    for i in range(n):
        t = ts[i]
        while stack and end[stack[-1]] <= t:
            stack.pop()
        if stack:
            p = stack[-1]
            child[p] += min(end[i], end[p]) - t
        else:
            top[i] = True
        stack.append(i)
    return [max(0.0, end[i] - ts[i] - child[i]) for i in range(n)], top


def _host(data: TraceData) -> Breakdown:
    ts, end, lane, name = _arrays(data.host)
    notes: list[str] = []
    steps = data.host_steps
    if len(steps):
        threads = np.frombuffer(steps.thread, dtype=np.int64)
        engine = int(np.bincount(threads).argmax())
    else:
        engine = int(np.bincount(lane, weights=end - ts).argmax())
        notes.append("no vLLM step annotations: the busiest thread is taken as the engine's")
    sel = lane == engine
    ts, end, name = ts[sel], end[sel], name[sel]
    order = np.lexsort((-(end - ts), ts))
    ts, end, name = ts[order], end[order], name[order]
    self_us, top = _self_times(ts.tolist(), end.tolist())
    secs = np.array(self_us) * US
    cls_of_name, labels = _class_index(data.names)
    cls_idx = cls_of_name[name] if name.size else np.zeros(0, dtype=np.int64)
    seconds = _empty_seconds()
    for i, s in enumerate(np.bincount(cls_idx, weights=secs, minlength=len(labels))):
        seconds[labels[i]] += float(s)
    counts = {labels[i]: int(c) for i, c in enumerate(np.bincount(cls_idx, minlength=len(labels)))}
    top_mask = np.array(top, dtype=bool)
    span, gap = _gaps(ts[top_mask], end[top_mask])
    seconds[IDLE] = gap * US
    keep = None
    if len(steps):
        keep = np.frombuffer(steps.thread, dtype=np.int64) == engine
    pid, tid = data.threads[engine]
    return Breakdown(
        source=data.path,
        timeline="host",
        lanes=[f"thread {tid} (pid {pid})"],
        span_s=span * US,
        seconds=seconds,
        counts=counts,
        top=_top(data.names, name, secs),
        phases=_phases(steps, keep, ts, secs, cls_idx, labels),
        events=data.events,
        notes=notes,
    )
