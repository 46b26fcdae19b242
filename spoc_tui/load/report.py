"""How a ramp's steps and knee read, in words: one place for the CLI table and the Load screen."""

from __future__ import annotations

from typing import Literal

from spoc_tui.core import fmt
from spoc_tui.core.loadmath import Knee, StepSummary

KneeTone = Literal["pending", "meets", "breaks_at_once", "breaks"]
"""How a knee sentence should look: no step yet, SLA never broken, broken by the first step,
broken after some steps met it."""


def verdict(s: StepSummary) -> tuple[bool, str | None]:
    """(the step meets the SLA, the limit it breaks)."""
    ok = bool(s.verdict.get("ok"))
    limit = s.verdict.get("broken_limit")
    return ok, None if ok else str(limit)


def verdict_text(s: StepSummary, short: bool = False) -> str:
    """``meets SLA`` (``ok`` when short) or ``breaks LIMIT``."""
    ok, limit = verdict(s)
    if ok:
        return "ok" if short else "meets SLA"
    return f"breaks {limit}"


def step_cells(s: StepSummary) -> dict[str, str]:
    """Every figure a step table may show, formatted once (keys: the table's column keys)."""
    srv = s.server or {}
    lat = s.latency
    return {
        "users": str(s.users),
        "req_s": f"{s.request_rate:.2f}",
        "out_tok_s": f"{s.output_tokens_per_s:.0f}",
        "goodput": f"{s.goodput:.2f}",
        "ttft_p50": fmt.seconds(lat["ttft"]["p50"]),
        "ttft_p99": fmt.seconds(lat["ttft"]["p99"]),
        "itl_p99": fmt.seconds(lat["itl"]["p99"]),
        "tpot_p99": fmt.seconds(lat["tpot"]["p99"]),
        "e2e_p99": fmt.seconds(lat["e2e"]["p99"]),
        "err_pct": f"{s.error_rate * 100:.1f}",
        "queue": fmt.num(srv.get("waiting_max")),  # type: ignore[arg-type]  # server view values are JSON numbers
        "kv": fmt.pct(srv.get("kv_cache_usage_max")),  # type: ignore[arg-type]  # as above
    }


def knee_sentence(knee: Knee | None, done: bool = True) -> tuple[str, KneeTone]:
    """The knee in one sentence, and its tone; ``done`` once the ramp has ended."""
    if knee is None:
        return "knee: no step finished yet", "pending"
    if knee.first_failing_users is None:
        if done:
            return f"knee: not reached; {knee.max_users_within_sla} users still meet the SLA", "meets"
        return f"knee: not reached yet; {knee.max_users_within_sla} users meet the SLA", "meets"
    if knee.max_users_within_sla is None:
        return f"knee: even {knee.first_failing_users} users break the SLA ({knee.broken_limit})", "breaks_at_once"
    return (
        f"knee: {knee.max_users_within_sla} users meet the SLA; {knee.first_failing_users} break {knee.broken_limit}",
        "breaks",
    )


# (key, header, width) of the CLI's step table
_TABLE = [
    ("users", "users", 6),
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
    """The CLI's table of steps, then the knee sentence."""
    lines = [" ".join(f"{head:>{w}}" for _, head, w in _TABLE) + "  verdict"]
    for s in steps:
        cells = step_cells(s)
        lines.append(" ".join(f"{cells[key]:>{w}}" for key, _, w in _TABLE) + "  " + verdict_text(s, short=True))
    lines.append(knee_sentence(knee)[0])
    return "\n".join(lines)
