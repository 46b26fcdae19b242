"""``spoc inspect``: the text report of one (or two, windowed) readings of the sources."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from spoc_tui.collectors.inspect import InspectResult, inspect_sources
from spoc_tui.core import fmt
from spoc_tui.core.jsonsafe import json_safe
from spoc_tui.core.sla import Limit
from spoc_tui.core.vllm import LATENCY_LABELS

if TYPE_CHECKING:
    from spoc_tui.twin.model import Twin


def render_text(res: InspectResult) -> str:
    lines: list[str] = []
    for s, v in zip(res.servers, res.verdicts(), strict=True):
        t = s.total
        sim = "  [SIMULATED]" if s.simulated else ""
        lines.append(f"vLLM {s.source}  engine {s.engine_version}  model {fmt.names(s.model_names)}{sim}")
        lines.append(f"  verdict: {v.text}" + "".join(f"\n    also {c}" for c in v.causes))
        if (h := res.headroom.get(s.source)) is not None:
            lines.append(f"  {h[0]}")
        lines.append(
            f"  running {fmt.num(t.running)}  waiting {fmt.num(t.waiting)}  KV cache "
            f"{fmt.pct(t.kv_cache_usage, digits=1)}"
            f"  prefix hits {fmt.pct(t.prefix_cache_hit_rate, digits=1)}  preemptions {fmt.count(t.preemptions_total)}"
        )
        lines.append(
            f"  tokens: prompt {fmt.count(t.prompt_tokens_total)} ({fmt.rate(t.prompt_tokens_rate, ' tok/s')})"
            f"  generation {fmt.count(t.generation_tokens_total)} ({fmt.rate(t.generation_tokens_rate, ' tok/s')})"
        )
        lines.append(f"  latency over {t.window}:       count      mean       p50       p90       p99")
        for key, label in LATENCY_LABELS.items():
            L = t.latency[key]
            lines.append(
                f"    {label:<6} {fmt.count(L.count):>20} {fmt.seconds(L.mean):>9}"
                + "".join(f" {fmt.seconds(getattr(L, p), L.is_bound(p)):>9}" for p in ("p50", "p90", "p99"))
            )
        if any(t.latency[key].bounded for key in LATENCY_LABELS):
            lines.append("    ≤: an upper bound, mean / (1 - q): the buckets are too coarse to interpolate in")
        if len(s.engines) > 1:
            for e in s.engines:
                lines.append(
                    f"  engine {e.engine}: running {fmt.num(e.running)} waiting {fmt.num(e.waiting)}"
                    f" KV {fmt.pct(e.kv_cache_usage, digits=1)} TTFT p99"
                    f" {fmt.seconds(e.latency['ttft'].p99, e.latency['ttft'].is_bound('p99'))}"
                )
    for g in res.gpus:
        reasons = g.throttle_reasons
        thr = fmt.NA if reasons is None else (", ".join(reasons) or "none")
        lines.append(
            f"GPU {g.gpu} {g.model or ''} ({g.source}{', ' + g.hostname if g.hostname else ''}): "
            f"{fmt.num(g.temp_c, unit='C')} mem {fmt.num(g.mem_temp_c, unit='C')}  "
            f"SM {fmt.num(g.sm_clock_mhz)}/{fmt.num(g.sm_clock_max_mhz)} MHz  "
            f"{fmt.num(g.power_w)}/{fmt.num(g.power_limit_w)} W  util {fmt.pct(g.util_pct, fraction=False)}  "
            f"FB {fmt.num(g.fb_used_mib)} MiB  throttle: {thr}"
        )
    return "\n".join(lines)


def run_inspect(
    sources: list[str], interval: float | None, as_json: bool, api_key: str | None
) -> tuple[str, list[str]]:
    res = asyncio.run(inspect_sources(sources, interval, api_key))
    out = json.dumps(json_safe(res.as_dict()), indent=2, allow_nan=False) if as_json else render_text(res)
    return out, res.errors


def run_headroom(
    sources: list[str], seconds: float, limits: Sequence[Limit], as_json: bool, api_key: str | None, prior: Twin | None
) -> tuple[str, list[str], bool]:
    """``spoc inspect --headroom``: watch, then the report with each server's headroom; and
    whether Ctrl-C ended the watch early (what was seen is reported all the same)."""

    def say(text: str) -> None:
        print(f"spoc: {text}", file=sys.stderr, flush=True)

    from spoc_tui.twin.live import watch_headroom

    say(f"watching {len(sources)} source(s) for {seconds:.0f} s (Ctrl-C ends the watch early and reports)")
    res = asyncio.run(watch_headroom(sources, seconds, limits, api_key, prior, say=say))
    out = json.dumps(json_safe(res.as_dict()), indent=2, allow_nan=False) if as_json else render_text(res)
    return out, res.errors, res.interrupted
