"""How ramp steps and knees read in words: the tables, verdicts and sentences that `spoc ramp`,
the Load screen, `spoc report` and `spoc twin` print (in core, below every service that prints them)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from spoc_tui.core import fmt
from spoc_tui.core.confidence import Decision
from spoc_tui.core.ramp.knee import Knee
from spoc_tui.core.ramp.sla import level_text, levels_text
from spoc_tui.core.ramp.steps import StepSummary

KneeTone = Literal["pending", "meets", "breaks_at_once", "breaks"]
"""How a knee sentence should look: nothing decided yet, SLA never broken, broken by the first
count, broken after smaller counts met it."""


def verdict(s: StepSummary) -> tuple[Decision, str | None]:
    """(the step's decision: meets, breaks or inconclusive; the limit it breaks)."""
    d = s.decision
    return d, s.verdict.broken_limit if d == "breaks" else None


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
    srv = s.server
    lat = s.latency
    return {
        "users": f"x{s.speed:g}" if s.speed is not None else f"{s.users}" if s.rate is None else f"{s.rate:g}/s",
        "n": str(s.requests),
        "req_s": f"{s.request_rate:.2f}",
        "out_tok_s": f"{s.output_tokens_per_s:.0f}",
        "goodput": f"{s.goodput:.2f}",
        "ttft_p50": fmt.seconds(lat.ttft.p50),
        "ttft_p99": fmt.seconds(lat.ttft.p99),
        "itl_p99": fmt.seconds(lat.itl.p99),
        "tpot_p99": fmt.seconds(lat.tpot.p99),
        "e2e_p99": fmt.seconds(lat.e2e.p99),
        "err_pct": f"{s.error_rate * 100:.1f}",
        "queue": fmt.num(srv.waiting_max),
        "kv": fmt.pct(srv.kv_cache_usage_max),
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
    # "8 users meet", "2 req/s meet", "the trace at x2 meets"
    one = knee.unit == "x"
    meets, breaks = ("meets", "breaks") if one else ("meet", "break")
    meets_text = f"the trace at {knee.meets_text}" if one else knee.meets_text
    breaks_text = f"the trace at {knee.breaks_text}" if one else knee.breaks_text
    if knee.breaks_level is None:
        if knee.meets_level is None:
            return "knee: no step decided yet" + extra, "pending"
        if done:
            return f"knee: not reached; {meets_text} still {meets} the SLA" + extra, "meets"
        return f"knee: not reached yet; {meets_text} {meets} the SLA" + extra, "meets"
    if knee.meets_level is None:
        if any(level < knee.breaks_level for level in knee.inconclusive):
            # lower levels ran but none was decided: "even 128 users break" read as if fewer failed too
            return (
                f"knee: no step surely met the SLA; {breaks_text} {breaks} it ({knee.broken_limit})" + extra,
                "breaks",
            )
        return (
            f"knee: even {breaks_text} {breaks} the SLA ({knee.broken_limit})" + extra,
            "breaks_at_once",
        )
    first_break = level_text(knee.breaks_level, knee.unit) if one else f"{knee.breaks_level:g}"
    return (
        f"knee: {meets_text} {meets} the SLA; {first_break} {breaks} {knee.broken_limit}" + extra,
        "breaks",
    )


def check_lines(s: StepSummary) -> list[str]:
    """One line per SLA limit of a step: the figure, its interval, the limit and the decision."""
    n = s.requests
    parts = []
    for c in s.verdict.checks:
        if c.limit is None:  # a rule, not a figure against a limit (the queue grew without bound)
            parts.append(f"{c.key}: {c.decision} ({c.reason})")
            continue
        lim = f"{c.limit * 100:g}%" if c.is_rate else fmt.seconds(c.limit)
        parts.append(f"{c.key} {interval_text(c.value, c.ci95, c.is_rate)} vs {lim}: {c.decision}")
    extended = f", extended {s.extended_s:.0f} s" if s.extended_s >= 0.5 else ""
    if s.drained_s >= 0.5:
        extended += f", after {s.drained_s:.0f} s for the last level's requests to end"
    if s.settled_early:
        extended += f", ended {s.settled_early.saved_s:.0f} s early: {s.settled_early.reason}"
    head = f"  step {s.step} ({s.level_text}, {n} requests{extended}): "
    lines = [head + "; ".join(parts)] if parts else [head + verdict_text(s)]
    if s.trace is not None:
        lines.append(f"    trace: {s.trace.text}")
    reason = s.verdict.reason
    if s.decision == "inconclusive" and reason:
        lines.append(f"    inconclusive: {reason}")
    if sat := s.client.saturated_text:
        lines.append(f"    {sat}")
    if sends := s.client.sends_text:
        lines.append(f"    client: {sends}")
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
    heads = (
        {"users": "speed"}
        if any(s.speed is not None for s in steps)
        else {"users": "rate"}
        if any(s.rate is not None for s in steps)
        else {}
    )
    lines = [" ".join(f"{heads.get(key, head):>{w}}" for key, head, w in _TABLE) + "  verdict"]
    for s in steps:
        cells = step_cells(s)
        lines.append(" ".join(f"{cells[key]:>{w}}" for key, _, w in _TABLE) + "  " + verdict_text(s, short=True))
    lines.append("95 % intervals ([low-high], ? where the sample is too small to bound that side):")
    for s in steps:
        lines += check_lines(s)
    lines.append(knee_sentence(knee)[0])
    if knee.inferred is not None:
        lines.append(f"knee across steps: {knee.inferred.text}")
    if knee.reason:
        lines.append(f"why: {knee.reason}")
    return "\n".join(lines)


def interval_strip(knee: Knee, levels: Sequence[float], width: int = 40, ascii_only: bool = False) -> str:
    """The knee's 95 % interval drawn on the span of the levels run (log scale: the search
    doubles), so the operator sees it narrow step by step::

        1 ·········━━━━●━━━━····· 128 users

    Empty without an inferred knee or with fewer than two levels."""
    inferred = knee.inferred
    if inferred is None or len(set(levels)) < 2 or width < 8:
        return ""
    lo_x, hi_x = min(levels), max(levels)
    if lo_x <= 0:
        return ""
    span = math.log(hi_x / lo_x) or 1.0

    def col(v: float) -> int:
        return max(0, min(width - 1, round((math.log(max(v, lo_x) / lo_x)) / span * (width - 1))))

    dot, bar, mark = (".", "=", "o") if ascii_only else ("·", "━", "●")
    cells = [dot] * width
    lo, hi = inferred.ci95
    a = col(lo) if lo is not None else 0
    b = col(hi) if hi is not None else width - 1
    for i in range(a, b + 1):
        cells[i] = bar
    if inferred.estimate is not None:
        cells[col(inferred.estimate)] = mark
    return f"{lo_x:g} {''.join(cells)} {hi_x:g} {inferred.unit}"
