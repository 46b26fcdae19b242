"""The vLLM view: what a server (and each of its engines) is doing, from /metrics text.

Old and new metric names are both read (see reference/vllm_metrics_catalog.md); a metric the
server does not export is ``None`` ("n/a"), never 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from spoc_tui.core.metrics.history import ScrapeHistory
from spoc_tui.core.metrics.promparse import Exposition, Labels
from spoc_tui.core.metrics.stats import (
    Histogram,
    LatencySummary,
    histogram_groups,
    histogram_increase,
    merge_histograms,
    series_increase,
    summarize,
)

RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
WAITING_BY_REASON = ("vllm:num_requests_waiting_by_reason",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_RATE_V0 = ("vllm:gpu_prefix_cache_hit_rate",)
PREEMPTIONS = ("vllm:num_preemptions_total",)
PROMPT_TOKENS = ("vllm:prompt_tokens_total",)
GENERATION_TOKENS = ("vllm:generation_tokens_total",)
REQUEST_SUCCESS = ("vllm:request_success_total",)
REQUEST_PROMPT_TOKENS = ("vllm:request_prompt_tokens",)
REQUEST_GENERATION_TOKENS = ("vllm:request_generation_tokens",)
REQUEST_PREFILL_COMPUTED = ("vllm:request_prefill_kv_computed_tokens",)
"""Each prompt's tokens the engine computed (its prefix-cache hits left out); vLLM 0.13 and later."""
PREFILL_TIME = ("vllm:request_prefill_time_seconds",)
"""From a request's first scheduling to its first token (observed when it finishes)."""
CACHE_CONFIG = ("vllm:cache_config_info",)
FLOPS_PER_GPU = ("vllm:estimated_flops_per_gpu_total",)
READ_BYTES_PER_GPU = ("vllm:estimated_read_bytes_per_gpu_total",)
WRITE_BYTES_PER_GPU = ("vllm:estimated_write_bytes_per_gpu_total",)
ITERATION_TOKENS = ("vllm:iteration_tokens_total",)
REJECTIONS = ("vllm:admission_rejections_total",)
HTTP_REQUESTS = ("http_requests_total",)
SPEC_DRAFTS = ("vllm:spec_decode_num_drafts_total",)
SPEC_DRAFT_TOKENS = ("vllm:spec_decode_num_draft_tokens_total",)
SPEC_ACCEPTED = ("vllm:spec_decode_num_accepted_tokens_total",)
SIM_MARKER = "spoc_sim_info"

LATENCIES: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds", "vllm:time_in_queue_requests"),
}
"""Latency key -> histogram base names, newest first."""

LATENCY_LABELS = {
    "ttft": "TTFT",
    "itl": "ITL",
    "tpot": "TPOT",
    "e2e": "E2E",
    "queue": "Queue",
}

_V1_RUNNING_HELP = "Number of requests in model execution batches."
_V0_MARKERS = ("vllm:num_requests_swapped", "vllm:cpu_cache_usage_perc")
_V1_MARKERS = (
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:prefix_cache_queries_total",
    "vllm:request_time_per_output_token_seconds_count",
)


def is_vllm(exp: Exposition) -> bool:
    return any(n.startswith("vllm:") for n in exp.samples) or any(n.startswith("vllm:") for n in exp.types)


def engine_version(exp: Exposition) -> str:
    """``"v1"`` or ``"v0"`` from the labels, HELP texts and the metrics present."""
    for name, series in exp.samples.items():
        if name.startswith("vllm:") and any(k == "engine" for lbls in series for k, _ in lbls):
            return "v1"
    help_running = exp.helps.get("vllm:num_requests_running")
    if help_running is not None:
        return "v1" if help_running.strip() == _V1_RUNNING_HELP else "v0"
    if any(exp.has(m) or m in exp.types for m in _V0_MARKERS):
        return "v0"
    if any(exp.has(m) for m in _V1_MARKERS):
        return "v1"
    return "v0"


def model_names(exp: Exposition) -> tuple[str, ...]:
    names: set[str] = set()
    for name, series in exp.samples.items():
        if name.startswith("vllm:"):
            for lbls in series:
                for k, v in lbls:
                    if k == "model_name":
                        names.add(v)
    return tuple(sorted(names))


def cache_config(exp: Exposition) -> dict[str, str]:
    """Labels of ``vllm:cache_config_info`` (first engine), e.g. block_size, num_gpu_blocks."""
    for name in CACHE_CONFIG:
        for lbls in exp.get(name):
            return dict(lbls)
    return {}


KV_BLOCKS_MAX = 1 << 30
"""The most KV blocks a server's report is taken at (about 17 billion tokens at 16 a block; a
larger count is no cache a GPU holds)."""
KV_BLOCK_TOKENS_MAX = 4096
"""The longest KV block a report is taken at, in tokens (vLLM's are 1-256; hybrid models round
theirs up to a few hundred)."""


def kv_blocks(cc: dict[str, str]) -> tuple[int, int] | str | None:
    """``(num_gpu_blocks, block_size)`` from ``vllm:cache_config_info``'s labels; None where the
    server does not report them (vLLM says ``None`` before its profile run); else, where they are
    not a cache's (not a whole number, infinite, out of range), the reason, naming the label."""
    raw_blocks, raw_size = cc.get("num_gpu_blocks"), cc.get("block_size")
    if raw_blocks in (None, "None", "") or raw_size in (None, "None", ""):
        return None
    got: list[int] = []
    for key, raw, most in (
        ("num_gpu_blocks", raw_blocks, KV_BLOCKS_MAX),
        ("block_size", raw_size, KV_BLOCK_TOKENS_MAX),
    ):
        try:
            v = float(raw)
        except ValueError:
            v = math.nan
        if not (1 <= v <= most) or v != int(v):
            shown = raw if len(raw) <= 24 else raw[:21] + "..."
            return f"its cache_config_info says {key}={shown!r}, not a whole number from 1 to {most:,}"
        got.append(int(v))
    return got[0], got[1]


def _first_present(exp: Exposition, names: Sequence[str], suffixes: Sequence[str] = ("",)) -> str | None:
    for n in names:
        if any(exp.has(n + s) for s in suffixes):
            return n
    return None


class KvReading(NamedTuple):
    """What one scrape says of the KV cache, for a learner that reads every scrape; None where the
    server reports it not."""

    use: float | None
    """The cache's use now, the mean over engines (0-1)."""
    use_sum: float | None
    """The same summed over engines (each 0-1 of its own cache)."""
    steps: float | None
    """The engine steps so far (``iteration_tokens``' count, summed)."""
    running: float | None
    """The requests running now, summed."""


def kv_reading(exp: Exposition) -> KvReading:
    """From one scrape alone, the KV gauge read once (under whichever name the version uses, NaNs
    dropped), with the steps so far and the requests running. Cheap enough for every scrape: a
    learner averages the gauge over a window's steps with it (the window's last scrape alone is one
    instant), and the use summed over the running requests, over a window's scrapes, is the share
    of an engine's cache one running request holds: a decode context per sequence, where the
    gauge's mean also counts the instants the server stood idle between requests."""
    kv_name = _first_present(exp, KV_USAGE)
    kv = [v for v in exp.get(kv_name).values() if v == v] if kv_name else []
    steps = exp.get(ITERATION_TOKENS[0] + "_count")
    running = [v for v in exp.get(RUNNING[0]).values() if v == v]
    return KvReading(
        sum(kv) / len(kv) if kv else None,
        sum(kv) if kv else None,
        sum(steps.values()) if steps else None,
        sum(running) if running else None,
    )


def flow_now(exp: Exposition) -> tuple[float | None, float | None]:
    """From one scrape alone: the requests finished so far (every reason, every engine) and the
    requests in the engine now (running and waiting); None where the server reports either not.
    Between two scrapes the requests that arrived are the finished ones plus the change in those
    inside: a learner counts arrivals with it, where the counters count only what ended."""
    done = exp.get(REQUEST_SUCCESS[0])
    running, waiting = exp.get(RUNNING[0]), exp.get(WAITING[0])
    inside = [v for v in (*running.values(), *waiting.values()) if v == v]
    return (sum(done.values()) if done else None), (sum(inside) if running else None)


@dataclass(frozen=True, slots=True)
class Scrape:
    """One replica's current exposition and, when there is one, a baseline for the window."""

    now: Exposition
    t_now: float
    then: Exposition | None = None
    t_then: float | None = None

    @property
    def dt(self) -> float | None:
        if self.then is None or self.t_then is None:
            return None
        d = self.t_now - self.t_then
        return d if d > 0 else None


@dataclass(frozen=True, slots=True)
class EngineView:
    """Figures for one engine, one server (all its engines) or several replicas."""

    engine: str
    """Engine label, or ``""`` for a whole server / replica set."""
    running: float | None
    waiting: float | None
    waiting_by_reason: dict[str, float]
    kv_cache_usage: float | None
    prefix_cache_hit_rate: float | None
    preemptions_total: float | None
    prompt_tokens_total: float | None
    generation_tokens_total: float | None
    preemptions_rate: float | None
    prompt_tokens_rate: float | None
    generation_tokens_rate: float | None
    request_success: dict[str, float]
    """finished_reason -> count (lifetime)."""
    request_rate: float | None
    """Finished requests per second over the window."""
    latency: dict[str, LatencySummary]
    window: str
    flops_per_gpu_rate: float | None = None
    """Estimated FLOP/s per GPU over the window (vLLM's MFU counters; mean over engines)."""
    read_bytes_per_gpu_rate: float | None = None
    write_bytes_per_gpu_rate: float | None = None
    steps_rate: float | None = None
    """Engine steps per second over the window (``iteration_tokens`` observations)."""
    tokens_per_step: float | None = None
    """Mean tokens scheduled per engine step over the window (lifetime without a window)."""
    rejections_rate: float | None = None
    """Admission attempts refused by a queue limit, per second (vLLM 0.32+)."""
    finished_rates: dict[str, float] = field(default_factory=dict)
    """finished_reason -> requests per second over the window (abort and error are shed load)."""
    http_rates: dict[str, float] = field(default_factory=dict)
    """HTTP status (class) -> responses per second over the window (the API server's counter)."""
    spec_acceptance: float | None = None
    """Speculative decoding: accepted / proposed draft tokens over the window."""
    spec_mean_length: float | None = None
    """Speculative decoding: tokens emitted per draft (1 + accepted / drafts) over the window."""

    @property
    def shed_rate(self) -> float | None:
        """Load the server turned away or lost, per second: admission rejections, aborted and
        errored requests, and 4xx/5xx answers other than 2xx. None when nothing is known."""
        parts = [self.rejections_rate]
        parts += [self.finished_rates.get(r) for r in ("abort", "error")]
        parts += [v for k, v in self.http_rates.items() if k[:1] in ("4", "5")]
        known = [p for p in parts if p is not None]
        if self.rejections_rate is None and not self.finished_rates and not self.http_rates:
            return None
        return sum(known)

    def as_dict(self) -> dict[str, object]:
        return {
            "running": self.running,
            "waiting": self.waiting,
            "waiting_by_reason": self.waiting_by_reason or None,
            "kv_cache_usage": self.kv_cache_usage,
            "prefix_cache_hit_rate": self.prefix_cache_hit_rate,
            "preemptions_total": self.preemptions_total,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "preemptions_rate": self.preemptions_rate,
            "prompt_tokens_rate": self.prompt_tokens_rate,
            "generation_tokens_rate": self.generation_tokens_rate,
            "request_success": self.request_success or None,
            "request_rate": self.request_rate,
            "latency": {k: v.as_dict() for k, v in self.latency.items()},
            "flops_per_gpu_rate": self.flops_per_gpu_rate,
            "read_bytes_per_gpu_rate": self.read_bytes_per_gpu_rate,
            "write_bytes_per_gpu_rate": self.write_bytes_per_gpu_rate,
            "steps_rate": self.steps_rate,
            "tokens_per_step": self.tokens_per_step,
            "rejections_rate": self.rejections_rate,
            "finished_rates": self.finished_rates or None,
            "http_rates": self.http_rates or None,
            "shed_rate": self.shed_rate,
            "spec_acceptance": self.spec_acceptance,
            "spec_mean_length": self.spec_mean_length,
        }


@dataclass(frozen=True, slots=True)
class ServerView:
    """The vLLM view of one source (one server URL or file)."""

    source: str
    engine_version: str
    model_names: tuple[str, ...]
    total: EngineView
    engines: tuple[EngineView, ...]
    cache_config: dict[str, str] = field(default_factory=dict)
    simulated: bool = False

    def as_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "source": self.source,
            "engine_version": self.engine_version,
            "model_names": list(self.model_names),
            "simulated": self.simulated,
        }
        d.update(self.total.as_dict())
        d["engines"] = [dict(engine=e.engine, **e.as_dict()) for e in self.engines]
        return d


Pred = Callable[[Labels], bool]


def _all(_: Labels) -> bool:
    return True


def _gauge(scrapes: Sequence[Scrape], names: Sequence[str], pred: Pred, mean: bool) -> float | None:
    vals: list[float] = []
    for s in scrapes:
        name = _first_present(s.now, names)
        if name is None:
            continue
        vals.extend(v for k, v in s.now.get(name).items() if pred(k) and v == v)  # NaN: unknown
    if not vals:
        return None
    return sum(vals) / len(vals) if mean else sum(vals)


def _counter(
    scrapes: Sequence[Scrape], names: Sequence[str], pred: Pred
) -> tuple[float | None, float | None, float | None]:
    """(lifetime total, windowed increase, rate per second); unknowns are None."""
    total: float | None = None
    inc: float | None = 0.0
    rate: float | None = 0.0
    for s in scrapes:
        name = _first_present(s.now, names)
        if name is None:
            continue
        now = {k: v for k, v in s.now.get(name).items() if pred(k)}
        if not now:
            continue
        total = (total or 0.0) + sum(now.values())
        dt = s.dt
        if dt is None or s.then is None or inc is None or rate is None:
            inc = rate = None
            continue
        then_name = _first_present(s.then, (name,))
        d = sum(series_increase(now, s.then.get(then_name) if then_name else None).values())
        inc += d
        rate += d / dt
    if total is None:
        return None, None, None
    return total, inc, rate


def _per_gpu_rate(scrapes: Sequence[Scrape], names: Sequence[str], pred: Pred) -> float | None:
    """A per-GPU counter's rate, averaged over the series (engines, replicas) that export it:
    each engine runs on GPUs of its own, so summing per-GPU figures across engines would
    compare several GPUs' work with one GPU's peak."""
    _, _, rate = _counter(scrapes, names, pred)
    if rate is None:
        return None
    n = 0
    for s in scrapes:
        name = _first_present(s.now, names)
        if name is not None:
            n += sum(1 for k in s.now.get(name) if pred(k))
    return rate / n if n else None


def _rates_by(scrapes: Sequence[Scrape], names: Sequence[str], label: str, pred: Pred) -> dict[str, float]:
    """Per value of ``label``: the counter's windowed rate (reset-aware, summed over the other
    labels, engines and replicas); empty without a window or the metric."""
    out: dict[str, float] = {}
    for s in scrapes:
        name = _first_present(s.now, names)
        dt = s.dt
        if name is None or dt is None or s.then is None:
            continue
        now = {k: v for k, v in s.now.get(name).items() if pred(k)}
        for k, d in series_increase(now, s.then.get(name)).items():
            key = dict(k).get(label, "?")
            out[key] = out.get(key, 0.0) + d / dt
    return out


def _ratio(scrapes: Sequence[Scrape], num: Sequence[str], den: Sequence[str], pred: Pred) -> float | None:
    _, n, _ = _counter(scrapes, num, pred)
    _, d, _ = _counter(scrapes, den, pred)
    if n is None or not d:
        return None
    return n / d


def _steps(scrapes: Sequence[Scrape], pred: Pred, windowed: bool) -> tuple[float | None, float | None]:
    """(engine steps per second per engine, mean tokens per step) from ``iteration_tokens``."""
    h = _histogram(scrapes, ITERATION_TOKENS, pred, windowed)
    if h is None:
        return None, None
    n, total = h.count, h.sum
    per_step = total / n if n and total is not None else None
    rate: float | None = None
    dts = [s.dt for s in scrapes]
    if windowed and n is not None and dts and all(d is not None for d in dts):
        engines = len(
            {
                (i, _engine_of(k))
                for i, s in enumerate(scrapes)
                for k in s.now.get(ITERATION_TOKENS[0] + "_count")
                if pred(k)
            }
        )
        rate = n / min(d for d in dts if d is not None) / max(1, engines)
    return rate, per_step


def _histogram(scrapes: Sequence[Scrape], names: Sequence[str], pred: Pred, windowed: bool) -> Histogram | None:
    parts: list[Histogram] = []
    for s in scrapes:
        base = _first_present(s.now, names, ("_bucket", "_count", "_sum"))
        if base is None:
            continue
        now = _groups(s.now, base, pred)
        then: dict[Labels, Histogram] = {}
        if windowed and s.then is not None:
            then = _groups(s.then, base, _all)
        for key, h in now.items():
            parts.append(histogram_increase(h, then.get(key)) if windowed else h)
    return merge_histograms(parts)


def _groups(exp: Exposition, base: str, pred: Pred) -> dict[Labels, Histogram]:
    """The histograms of ``base`` in ``exp`` that ``pred`` selects; every one of them is kept
    with the exposition, for when it is a later window's baseline."""
    if pred is not _all:
        return histogram_groups(
            {k: v for k, v in exp.get(base + "_bucket").items() if pred(k)},
            {k: v for k, v in exp.get(base + "_sum").items() if pred(k)},
            {k: v for k, v in exp.get(base + "_count").items() if pred(k)},
        )
    key = ("histograms", base)
    hit = exp.memo.get(key)
    if hit is None:
        hit = exp.memo[key] = histogram_groups(
            exp.get(base + "_bucket"), exp.get(base + "_sum"), exp.get(base + "_count")
        )
    return hit  # type: ignore[return-value]


def _prefix_pair(scrapes: Sequence[Scrape]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The prefix-cache (queries, hits) names of the first generation that has both (none: no
    counter-based hit rate)."""
    for q, h in zip(PREFIX_QUERIES, PREFIX_HITS, strict=True):
        if any(s.now.has(q) and s.now.has(h) for s in scrapes):
            return (q,), (h,)
    return (), ()


def window_label(scrapes: Sequence[Scrape]) -> str:
    dts = [s.dt for s in scrapes]
    if not dts or any(d is None for d in dts):
        return "lifetime"
    return f"{round(min(d for d in dts if d is not None))}s"


def build_view(scrapes: Sequence[Scrape], engine: str = "", pred: Pred = _all) -> EngineView:
    """Derive the figures for the series that ``pred`` selects across ``scrapes``.

    Counters and histogram buckets are differenced per series (reset-aware), then summed
    across engines and replicas, and only then turned into quantiles.
    """
    window = window_label(scrapes)
    windowed = window != "lifetime"
    waiting_by_reason: dict[str, float] = {}
    success: dict[str, float] = {}
    for s in scrapes:
        for k, v in s.now.get(WAITING_BY_REASON[0]).items():
            if pred(k):
                reason = dict(k).get("reason", "?")
                waiting_by_reason[reason] = waiting_by_reason.get(reason, 0.0) + v
        for k, v in s.now.get(REQUEST_SUCCESS[0]).items():
            if pred(k):
                reason = dict(k).get("finished_reason", "?")
                success[reason] = success.get(reason, 0.0) + v
    preempt_total, _, preempt_rate = _counter(scrapes, PREEMPTIONS, pred)
    prompt_total, _, prompt_rate = _counter(scrapes, PROMPT_TOKENS, pred)
    gen_total, _, gen_rate = _counter(scrapes, GENERATION_TOKENS, pred)
    _, _, req_rate = _counter(scrapes, REQUEST_SUCCESS, pred)
    # queries and hits from the same generation of names: a server exporting the old and the new
    # names together (or in different amounts) must not divide one by the other (it gave > 100 %)
    q_names, h_names = _prefix_pair(scrapes)
    q_total, q_inc, _ = _counter(scrapes, q_names, pred)
    h_total, h_inc, _ = _counter(scrapes, h_names, pred)
    hit_rate: float | None = None
    if q_inc is not None and h_inc is not None and q_inc > 0:
        hit_rate = min(1.0, max(0.0, h_inc / q_inc))
    elif q_total is not None and h_total is not None and q_total > 0 and not windowed:
        hit_rate = min(1.0, max(0.0, h_total / q_total))
    elif q_total is None:
        g = _gauge(scrapes, PREFIX_RATE_V0, pred, mean=True)
        hit_rate = g if g is not None and g >= 0 else None
    latency = {key: summarize(_histogram(scrapes, names, pred, windowed), window) for key, names in LATENCIES.items()}
    steps_rate, tokens_per_step = _steps(scrapes, pred, windowed)
    return EngineView(
        engine=engine,
        running=_gauge(scrapes, RUNNING, pred, mean=False),
        waiting=_gauge(scrapes, WAITING, pred, mean=False),
        waiting_by_reason=waiting_by_reason,
        kv_cache_usage=_gauge(scrapes, KV_USAGE, pred, mean=True),
        prefix_cache_hit_rate=hit_rate,
        preemptions_total=preempt_total,
        prompt_tokens_total=prompt_total,
        generation_tokens_total=gen_total,
        preemptions_rate=preempt_rate,
        prompt_tokens_rate=prompt_rate,
        generation_tokens_rate=gen_rate,
        request_success=success,
        request_rate=req_rate,
        latency=latency,
        window=window,
        flops_per_gpu_rate=_per_gpu_rate(scrapes, FLOPS_PER_GPU, pred),
        read_bytes_per_gpu_rate=_per_gpu_rate(scrapes, READ_BYTES_PER_GPU, pred),
        write_bytes_per_gpu_rate=_per_gpu_rate(scrapes, WRITE_BYTES_PER_GPU, pred),
        steps_rate=steps_rate,
        tokens_per_step=tokens_per_step,
        rejections_rate=_counter(scrapes, REJECTIONS, pred)[2],
        finished_rates=_rates_by(scrapes, REQUEST_SUCCESS, "finished_reason", pred),
        http_rates=_rates_by(scrapes, HTTP_REQUESTS, "status", pred),
        spec_acceptance=_ratio(scrapes, SPEC_ACCEPTED, SPEC_DRAFT_TOKENS, pred),
        spec_mean_length=None if (a := _ratio(scrapes, SPEC_ACCEPTED, SPEC_DRAFTS, pred)) is None else 1 + a,
    )


MAX_ENGINE_ROWS = 64
"""Engines beyond this many (by name) are in the server's total but get no row of their own."""


def _engine_of(labels: Labels) -> str | None:
    for k, v in labels:
        if k == "engine":
            return v
    return None


def split_by_engine(exp: Exposition, keep: int | None = None) -> dict[str, Exposition]:
    """The ``vllm:`` series of each engine (of the first ``keep`` by name, when given), in linear
    time (selecting each engine's series from the whole exposition was quadratic: 8,000 engines
    took 4 s) and memory for the engines kept only. Kept with the exposition (a window's
    baseline was split when it was the newest scrape)."""
    hit = exp.memo.get(("engines", keep))
    if hit is None:
        hit = exp.memo[("engines", keep)] = _split_by_engine(exp, keep)
    return hit  # type: ignore[return-value]


def _split_by_engine(exp: Exposition, keep: int | None) -> dict[str, Exposition]:
    vllm = [(name, series) for name, series in exp.samples.items() if name.startswith("vllm:")]
    wanted: set[str] | None = None
    if keep is not None:
        names = {e for _, series in vllm for labels in series if (e := _engine_of(labels)) is not None}
        wanted = set(sorted(names, key=lambda e: (len(e), e))[:keep])
    parts: dict[str, Exposition] = {}
    for name, series in vllm:
        for labels, value in series.items():
            engine = _engine_of(labels)
            if engine is None or (wanted is not None and engine not in wanted):
                continue
            part = parts.get(engine)
            if part is None:
                part = parts[engine] = Exposition()
            part.samples.setdefault(name, {})[labels] = value
    return parts


_FRONT_END = frozenset(REJECTIONS) | {"vllm:admission_rejections_created"}
"""``vllm:`` series that vLLM's API server exports without an engine label (0.32: admission)."""


def _engine_holds_all(exp: Exposition, part: Exposition) -> bool:
    """Whether ``part`` (one engine's series) holds every ``vllm:`` series of ``exp`` but the
    front end's, whose figures no engine view has."""
    return all(
        name in _FRONT_END or len(part.samples.get(name, ())) == len(series)
        for name, series in exp.samples.items()
        if name.startswith("vllm:")
    )


def server_view(source: str, scrape: Scrape) -> ServerView:
    """The whole view of one vLLM source, with a row per engine (the first
    :data:`MAX_ENGINE_ROWS`); linear in the size of the exposition."""
    exp = scrape.now
    # split as a later window's baseline will be (with room for engines that since went away)
    split = split_by_engine(exp, keep=MAX_ENGINE_ROWS * 4)
    names = sorted(split, key=lambda e: (len(e), e))[:MAX_ENGINE_ROWS]
    now_parts = {e: split[e] for e in names}
    then_parts = {}
    if scrape.then is not None:
        then_parts = {e: p for e, p in split_by_engine(scrape.then, keep=MAX_ENGINE_ROWS * 4).items() if e in now_parts}
    total = build_view([scrape])
    if (
        len(names) == 1
        and _engine_holds_all(exp, now_parts[names[0]])
        and (scrape.then is None or _engine_holds_all(scrape.then, then_parts.get(names[0], Exposition())))
    ):
        # one engine holding every vllm: series (the usual server): its view is the total's but
        # for the front end's counters, HTTP and admission, which are no engine's
        per_engine: tuple[EngineView, ...] = (replace(total, engine=names[0], http_rates={}, rejections_rate=None),)
    else:
        per_engine = tuple(
            build_view(
                [
                    Scrape(
                        now_parts[e],
                        scrape.t_now,
                        then_parts.get(e, Exposition()) if scrape.then else None,
                        scrape.t_then,
                    )
                ],
                e,
            )
            for e in names
        )
    return ServerView(
        source=source,
        engine_version=engine_version(exp),
        model_names=model_names(exp),
        total=total,
        engines=per_engine,
        cache_config=cache_config(exp),
        simulated=exp.has(SIM_MARKER),
    )


def windowed_histogram(scrape: Scrape, names: Sequence[str]) -> Histogram | None:
    """A histogram's increase over the scrape's window, every engine's merged (None: absent)."""
    return _histogram([scrape], names, _all, True)


def replicas_view(scrapes: Sequence[Scrape]) -> EngineView:
    """All replicas together: buckets merged across replicas before the quantile."""
    return build_view(scrapes)


WINDOW_SLACK_S = 0.5
"""A tick a few ms early or late keeps its baseline (and the window's label): see ScrapeHistory."""


class ServerWindows:
    """Each server's scrapes, windowed over ``window_s``: the view one tick shows of it. The one
    rule for the live poller (:class:`spoc_tui.collectors.poller.VllmPoller`) and the monitor of
    simulated servers on the virtual clock (:class:`spoc_tui.sim.watch.VirtualWatch`)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._histories: dict[str, ScrapeHistory[Exposition]] = {}

    def view(self, key: str, name: str, t: float, exp: Exposition) -> tuple[ServerView, Scrape]:
        """The scrape ``exp`` of server ``key`` (shown as ``name``) taken at ``t``, differenced
        against the newest one a window older."""
        history = self._histories.get(key)
        if history is None:
            history = self._histories[key] = ScrapeHistory(self.window_s, slack_s=WINDOW_SLACK_S)
        base = history.add(t, exp)
        scrape = Scrape(exp, t, base[1] if base else None, base[0] if base else None)
        return server_view(name, scrape), scrape

    def scrapes(self, key: str) -> int:
        """How many of ``key``'s scrapes are kept."""
        history = self._histories.get(key)
        return len(history) if history is not None else 0

    def clear(self) -> None:
        """Forget every earlier scrape: the next window starts at the next one."""
        self._histories.clear()
