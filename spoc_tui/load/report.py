"""How a ramp's steps and knee read, in words: one place for the CLI table and the Load screen."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from spoc_tui.core import fmt
from spoc_tui.core.confidence import Decision
from spoc_tui.core.loadmath import Knee, StepSummary, client_saturated_text, levels_text

KneeTone = Literal["pending", "meets", "breaks_at_once", "breaks"]
"""How a knee sentence should look: nothing decided yet, SLA never broken, broken by the first
count, broken after smaller counts met it."""


def verdict(s: StepSummary) -> tuple[Decision, str | None]:
    """(the step's decision: meets, breaks or inconclusive; the limit it breaks)."""
    d = s.decision
    return d, str(s.verdict.get("broken_limit")) if d == "breaks" else None


def verdict_text(s: StepSummary, short: bool = False) -> str:
    """``meets SLA`` (``ok`` when short), ``breaks LIMIT`` or ``inconclusive``."""
    d, limit = verdict(s)
    if d == "meets":
        return "ok" if short else "meets SLA"
    if d == "breaks":
        return f"breaks {limit}"
    return "inconclusive"


def _figure(v: float | None, rate: bool) -> str:
    if v is None:
        return "?"
    return f"{v * 100:.1f}%" if rate else fmt.seconds(v)


def interval_text(value: float | None, ci: Sequence[float | None] | None, rate: bool = False) -> str:
    """``71ms [60ms-90ms]``: a figure and its 95 % interval (``?`` for a side the sample cannot bound)."""
    lo, hi = (ci[0], ci[1]) if ci else (None, None)
    return f"{_figure(value, rate)} [{_figure(lo, rate)}-{_figure(hi, rate)}]"


def step_cells(s: StepSummary) -> dict[str, str]:
    """Every figure a step table may show, formatted once (keys: the table's column keys)."""
    srv = s.server or {}
    lat = s.latency
    return {
        "users": f"{s.users}" if s.rate is None else f"{s.rate:g}/s",
        "n": str(s.requests),
        "req_s": f"{s.request_rate:.2f}",
        "out_tok_s": f"{s.output_tokens_per_s:.0f}",
        "goodput": f"{s.goodput:.2f}",
        "ttft_p50": fmt.seconds(lat["ttft"]["p50"]),
        "ttft_p99": fmt.seconds(lat["ttft"]["p99"]),
        "itl_p99": fmt.seconds(lat["itl"]["p99"]),
        "tpot_p99": fmt.seconds(lat["tpot"]["p99"]),
        "e2e_p99": fmt.seconds(lat["e2e"]["p99"]),
        "err_pct": f"{s.error_rate * 100:.1f}",
        "queue": fmt.num(srv.get("waiting_max")),
        "kv": fmt.pct(srv.get("kv_cache_usage_max")),
    }


def knee_sentence(knee: Knee | None, done: bool = True) -> tuple[str, KneeTone]:
    """The knee in one sentence, and its tone; ``done`` once the ramp has ended."""
    if knee is None:
        return "knee: no step finished yet", "pending"
    extra = ""
    if knee.inconclusive:
        extra += f"; inconclusive at {levels_text(knee.inconclusive, knee.unit)}"
    if knee.contradicted:
        above = levels_text(knee.contradicted, knee.unit)
        extra += f"; {above} met it above the break (noise or warm-up: re-run to confirm)"
    if knee.first_failing_users is None:
        if knee.max_users_within_sla is None:
            return "knee: no step decided yet" + extra, "pending"
        if done:
            return f"knee: not reached; {knee.meets_text} still meet the SLA" + extra, "meets"
        return f"knee: not reached yet; {knee.meets_text} meet the SLA" + extra, "meets"
    if knee.max_users_within_sla is None:
        return (
            f"knee: even {knee.breaks_text} break the SLA ({knee.broken_limit})" + extra,
            "breaks_at_once",
        )
    return (
        f"knee: {knee.meets_text} meet the SLA; {knee.first_failing_users:g} break {knee.broken_limit}" + extra,
        "breaks",
    )


def check_lines(s: StepSummary) -> list[str]:
    """One line per SLA limit of a step: the figure, its interval, the limit and the decision."""
    n = s.requests
    parts = []
    for key, c in (s.verdict.get("checks") or {}).items():
        rate = key == "error_rate"
        lim = f"{c['limit'] * 100:g}%" if rate else fmt.seconds(c["limit"])
        parts.append(f"{key} {interval_text(c.get('value'), c.get('ci95'), rate)} vs {lim}: {c.get('decision')}")
    extended = f", extended {s.extended_s:.0f} s" if s.extended_s >= 0.5 else ""
    head = f"  step {s.step} ({s.level_text}, {n} requests{extended}): "
    lines = [head + "; ".join(parts)] if parts else [head + verdict_text(s)]
    reason = s.verdict.get("reason")
    if s.decision == "inconclusive" and reason:
        lines.append(f"    inconclusive: {reason}")
    if sat := client_saturated_text(s):
        lines.append(f"    {sat}")
    return lines


# (key, header, width) of the CLI's step table
_TABLE = [
    ("users", "users", 6),
    ("n", "reqs", 5),
    ("req_s", "req/s", 7),
    ("out_tok_s", "out tok/s", 9),
    ("goodput", "goodput", 8),
    ("ttft_p50", "TTFT p50", 9),
    ("ttft_p99", "TTFT p99", 9),
    ("itl_p99", "ITL p99", 8),
    ("tpot_p99", "TPOT p99", 9),
    ("e2e_p99", "E2E p99", 8),
    ("err_pct", "err%", 5),
    ("queue", "queue", 6),
    ("kv", "KV", 5),
]


def step_table(steps: list[StepSummary], knee: Knee) -> str:
    """The CLI's table of steps, each SLA figure with its interval, then the knee and its reason."""
    heads = {"users": "rate"} if any(s.rate is not None for s in steps) else {}
    lines = [" ".join(f"{heads.get(key, head):>{w}}" for key, head, w in _TABLE) + "  verdict"]
    for s in steps:
        cells = step_cells(s)
        lines.append(" ".join(f"{cells[key]:>{w}}" for key, _, w in _TABLE) + "  " + verdict_text(s, short=True))
    lines.append("95 % intervals ([low-high], ? where the sample is too small to bound that side):")
    for s in steps:
        lines += check_lines(s)
    lines.append(knee_sentence(knee)[0])
    if knee.reason:
        lines.append(f"why: {knee.reason}")
    return "\n".join(lines)


KV_FULL = 0.9
"""KV-cache use at or above which a queue is put down to the cache (as the monitor's alert)."""


def knee_reason(step: StepSummary) -> str:
    """The server-side reason a step broke the SLA, in one sentence with the figures it rests on.

    Rules, first match wins, from the step's server view: a GPU throttled (thermal or power
    reasons); preemptions (the KV cache ran out and running requests were evicted); the KV cache
    full with requests waiting; requests waiting with the cache not full (the batch is at its
    seat or token limit: max-num-seqs, max-num-batched-tokens); an inter-token limit broken with
    no queue (decode slows as the batch grows, or prefills stall decodes); otherwise no server-side
    cause was seen, which points at the client (see ``--workers``). A step whose load generator
    was saturated says so after the server-side reason (or instead of "no server-side cause").
    """
    reason = _server_reason(step)
    sat = client_saturated_text(step)
    if sat is None:
        return reason
    if reason.startswith(("no server-side cause", "no server-side view")):
        return sat
    return f"{reason}; and the {sat}"


def _server_reason(step: StepSummary) -> str:
    srv = step.server or {}
    limit = str(step.verdict.get("broken_limit") or "")
    if limit == "queue_unbounded":
        return str(step.verdict.get("reason") or "the queue grew without bound")
    throttled = [
        g
        for g in srv.get("gpus") or []
        if any(
            r in ("sw_thermal", "hw_thermal", "sw_power", "hw_power", "hw_slowdown")
            for r in (g.get("throttle_reasons") or [])
        )
    ]
    waiting = srv.get("waiting_max")
    running = srv.get("running_max")
    kv = srv.get("kv_cache_usage_max")
    pre = srv.get("preemptions_per_s")
    if throttled:
        g = throttled[0]
        return (
            f"GPU {g.get('gpu')} throttled ({', '.join(g.get('throttle_reasons') or [])}) at "
            f"{fmt.num(g.get('sm_clock_mhz'))}/{fmt.num(g.get('sm_clock_max_mhz'))} MHz, "
            f"{fmt.num(g.get('temp_c'), unit='C')}"
        )
    if pre:
        return f"preemptions ({pre:.2f}/s): the KV cache ran out and running requests were evicted (KV {fmt.pct(kv)})"
    if waiting and kv is not None and kv >= KV_FULL:
        return (
            f"KV cache full ({fmt.pct(kv)}) and requests queue "
            f"(up to {fmt.num(waiting)} waiting, {fmt.num(running)} running)"
        )
    if waiting:
        return (
            f"the batch is full: {fmt.num(running)} running, up to {fmt.num(waiting)} waiting with the KV cache at "
            f"{fmt.pct(kv)} (max-num-seqs or max-num-batched-tokens)"
        )
    if limit.startswith(("itl", "tpot")):
        return (
            f"no queue, but each step of decoding slows as the batch grows ({fmt.num(running)} running): "
            "prefills stall decodes, or the GPU is saturated"
        )
    if srv:
        return (
            f"no server-side cause seen ({fmt.num(running)} running, no queue, KV {fmt.pct(kv)}): "
            "the client may be the limit (try --workers)"
        )
    return "no server-side view was recorded for the step"
