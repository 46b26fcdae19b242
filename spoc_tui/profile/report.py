"""A profile's text report (the CLI's) and the decode roofline beside it."""

from __future__ import annotations

from spoc_tui.core.hardware.capacity import weights_bytes
from spoc_tui.core.hardware.kernels import CLASSES, IDLE
from spoc_tui.core.hardware.presets import GpuSpec, ModelSpec
from spoc_tui.core.hardware.roofline import si
from spoc_tui.core.textsafe import for_terminal
from spoc_tui.profile.analyze import Breakdown

SHORT = {
    "GEMM": "GEMM",
    "attention": "attn",
    "KV-cache write": "KVwr",
    "communication": "comm",
    "sampling & logits": "samp",
    "norms/activations/elementwise": "elem",
    "memory copies": "copy",
    "other": "other",
    "idle": "idle",
}


def decode_roofline(model: ModelSpec, gpu: GpuSpec, tp: int = 1) -> tuple[float, str]:
    """The shortest possible decode step: every step reads each GPU's share of the weights
    once, at the GPU's peak HBM bandwidth (KV reads and launch overhead only add to it)."""
    per_gpu = weights_bytes(model) / tp
    seconds = per_gpu / gpu.mem_bw_bytes_s
    basis = f"{si(per_gpu, 'B')} of weights per GPU / {si(gpu.mem_bw_bytes_s, 'B/s')} ({gpu.label}, TP {tp})"
    return seconds, basis


def _bar(share: float, width: int = 24) -> str:
    full = share * width
    n = int(full)
    part = " ▏▎▍▌▋▊▉"[int((full - n) * 8)] if n < width else ""
    return ("█" * n + part).rstrip()


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _time(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def render_text(b: Breakdown) -> str:
    lines: list[str] = []
    timeline = b.timeline + ": " + ", ".join(b.lanes)
    lines.append(f"profile of {for_terminal(b.source)}")
    lines.append(f"  {timeline}; {b.events:,} events; span {_time(b.span_s)}")
    lines.append("")
    lines.append(f"{'class':<31}{'time':>10}{'share':>8}  count")
    shares = b.shares
    for cls in (*CLASSES, IDLE):
        sec = b.seconds.get(cls, 0.0)
        if cls == IDLE and b.timeline.startswith("device (nsys"):
            continue
        count = "" if cls == IDLE else f"{b.counts.get(cls, 0):,}"
        lines.append(f"{cls:<31}{_time(sec):>10}{shares[cls]:>7.1%}  {count:>7}  {_bar(shares[cls])}")
    lines.append(f"{'total':<31}{_time(sum(b.seconds.values())):>10}{1:>7.1%}")
    if b.phases:
        lines.append("")
        head = f"{'step kind':<9}{'steps':>7}{'p50':>10}{'mean':>10}{'tok/step':>9}"
        head += "".join(f"{SHORT[c]:>6}" for c in (*CLASSES, IDLE))
        lines.append(head)
        for p in b.phases:
            row = f"{p.kind:<9}{p.steps:>7,}{_ms(p.p50_step_s):>10}{_ms(p.mean_step_s):>10}{p.tokens_per_step:>9.1f}"
            row += "".join(f"{p.shares[c]:>6.0%}" for c in (*CLASSES, IDLE))
            lines.append(row)
    lines.append("")
    measured = b.decode_step_s
    if b.roofline_step_s is not None:
        roof = f"decode roofline {_ms(b.roofline_step_s)} ({b.roofline_basis})"
        if measured is not None:
            n = next(p.steps for p in b.phases if p.kind == "decode")
            lines.append(
                f"decode step: measured {_ms(measured)} (mean of {n:,} decode steps), "
                f"{measured / b.roofline_step_s:.2f}x the {roof}"
            )
        else:
            lines.append(f"{roof}; no decode-only step in the trace to compare with")
    else:
        m = f"measured {_ms(measured)}" if measured is not None else "no decode-only step in the trace"
        lines.append(f"decode step: {m}; roofline n/a (give --model and --gpu)")
    if b.top:
        lines.append("")
        lines.append(f"top kernels by time{' (self time)' if b.timeline == 'host' else ''}:")
        total = sum(v for k, v in b.seconds.items() if k != IDLE) or 1.0
        for k in b.top:
            name = for_terminal(k.name)
            name = name if len(name) <= 70 else name[:69] + "…"
            lines.append(f"  {k.seconds / total:>6.1%} {_time(k.seconds):>9} {k.count:>8,}x  {SHORT[k.cls]:<5} {name}")
    for note in b.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)
