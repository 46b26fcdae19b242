"""``spoc inspect``: one-shot (or two-shot, windowed) reading of sources, for scripts."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

import httpx

from spoc_tui.collectors.scrape import DEFAULT_TIMEOUT, Reading, SourceError, read_source
from spoc_tui.core import fmt
from spoc_tui.core.jsonsafe import json_safe
from spoc_tui.core.gpu import GpuSample, dcgm_gpus, with_throttle_window
from spoc_tui.core.vllm import LATENCY_LABELS, Scrape, ServerView, server_view


@dataclass
class InspectResult:
    servers: list[ServerView] = field(default_factory=list)
    gpus: list[GpuSample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "servers": [s.as_dict() for s in self.servers],
            "gpus": [g.as_dict() for g in self.gpus],
        }


async def _read_all(client: httpx.AsyncClient, sources: list[str], api_key: str | None) -> list[Reading | SourceError]:
    async def one(src: str) -> Reading | SourceError:
        try:
            return await read_source(client, src, api_key)
        except SourceError as e:
            return e

    return list(await asyncio.gather(*(one(s) for s in sources)))


async def inspect_sources(sources: list[str], interval: float | None = None, api_key: str | None = None) -> InspectResult:
    res = InspectResult()
    async with httpx.AsyncClient(timeout=DEFAULT_TIMEOUT) as client:
        first = await _read_all(client, sources, api_key)
        second: list[Reading | SourceError] | None = None
        if interval:
            await asyncio.sleep(interval)
            second = await _read_all(client, sources, api_key)
    for i, src in enumerate(sources):
        a = first[i]
        b = second[i] if second is not None else None
        if isinstance(a, SourceError):
            res.errors.append(str(a))
            continue
        if isinstance(b, SourceError):
            res.errors.append(str(b))
            continue
        now, then = (b, a) if b is not None else (a, None)
        if now.kind == "vllm":
            scrape = Scrape(now.exposition, now.taken_at, then.exposition if then else None, then.taken_at if then else None)
            res.servers.append(server_view(src, scrape))
        else:
            before = {g.key: g for g in dcgm_gpus(then.exposition, src)} if then else {}
            dt = now.taken_at - then.taken_at if then else None
            for g in dcgm_gpus(now.exposition, src):
                res.gpus.append(with_throttle_window(g, before.get(g.key), dt))
    return res


def render_text(res: InspectResult) -> str:
    lines: list[str] = []
    for s in res.servers:
        t = s.total
        sim = "  [SIMULATED]" if s.simulated else ""
        lines.append(f"vLLM {s.source}  engine {s.engine_version}  model {', '.join(s.model_names) or fmt.NA}{sim}")
        lines.append(
            f"  running {fmt.num(t.running)}  waiting {fmt.num(t.waiting)}  KV cache {fmt.pct(t.kv_cache_usage, digits=1)}"
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
                f"    {label:<6} {fmt.count(L.count):>20} {fmt.seconds(L.mean):>9} {fmt.seconds(L.p50):>9}"
                f" {fmt.seconds(L.p90):>9} {fmt.seconds(L.p99):>9}"
            )
        if len(s.engines) > 1:
            for e in s.engines:
                lines.append(
                    f"  engine {e.engine}: running {fmt.num(e.running)} waiting {fmt.num(e.waiting)}"
                    f" KV {fmt.pct(e.kv_cache_usage, digits=1)} TTFT p99 {fmt.seconds(e.latency['ttft'].p99)}"
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


def run_inspect(sources: list[str], interval: float | None, as_json: bool, api_key: str | None) -> tuple[str, list[str]]:
    res = asyncio.run(inspect_sources(sources, interval, api_key))
    out = json.dumps(json_safe(res.as_dict()), indent=2, allow_nan=False) if as_json else render_text(res)
    return out, res.errors
