"""``spoc ramp``: a headless load ramp with progress lines and a final table."""

from __future__ import annotations

import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from spoc_tui.cli.signals import run_stoppable
from spoc_tui.core import fmt
from spoc_tui.core.errors import EXIT_INTERRUPTED, EXIT_OK
from spoc_tui.core.ramp.text import step_table, verdict
from spoc_tui.load.ramp import RampConfig, RampError, RampProgress, RampResult, run_ramp

_ANNOUNCED: set[int] = set()
"""Replay steps whose start was printed (a replay step has no warm-up line to say it)."""


def _progress(p: RampProgress) -> None:
    if p.phase == "preflight":
        print(p.message or "checking the server and the model...", flush=True)
    elif p.phase == "starting":
        if p.message:
            print(p.message, flush=True)
        print("starting the load generator (Locust)...", flush=True)
    elif p.phase == "measuring" and p.unit == "x" and p.step not in _ANNOUNCED:
        _ANNOUNCED.add(p.step)
        print(f"step {p.step}: replaying the trace at {p.level_text}", flush=True)
    elif p.phase == "warmup":
        print(f"step {p.step}: {p.level_text}, warming up" + (f" ({p.message})" if p.message else ""), flush=True)
    elif p.phase == "extending" and p.message:
        print(f"step {p.step}: {p.message}", flush=True)
    elif p.phase == "step_done":
        s = p.steps[-1]
        decision, limit = verdict(s)
        mark = {"meets": "meets SLA", "breaks": f"BREAKS {limit}"}.get(decision, "INCONCLUSIVE")
        print(
            f"step {s.step}: {s.level_text}  {s.request_rate:.2f} req/s done  {s.output_tokens_per_s:.0f} out tok/s  "
            f"TTFT p99 {fmt.seconds(s.latency.ttft.p99)}  ITL p99 {fmt.seconds(s.latency.itl.p99)}  "
            f"errors {s.error_rate * 100:.1f}%  ({s.requests} requests) -> {mark}",
            flush=True,
        )
        if sat := s.client.saturated_text:
            print(f"  {sat}", flush=True)
        if s.sessions is not None:
            print(f"  {s.sessions.line()}", flush=True)
        so_far = p.knee.inferred.text if p.knee is not None and p.knee.inferred is not None else ""
        left = f"budget left {p.budget_left_s / 60:.1f} min" if p.budget_left_s is not None else ""
        if so_far or left:
            print("  " + "; ".join(x for x in (f"knee so far: {so_far}" if so_far else "", left) if x), flush=True)


Ramp = Callable[[RampConfig, Callable[[RampProgress], None]], Coroutine[Any, Any, RampResult]]


def run(cfg: RampConfig, ramp: Ramp = run_ramp) -> int:
    """``spoc ramp``: the ramp (``ramp``: the live one; a test gives the same experiment on the
    virtual backend) with its progress lines, then its table and where its files are."""
    if cfg.trace is not None:
        print(
            "a turn that follows another (an agent's next call, a conversation's next turn) waits for its answer "
            + (
                "plus the recorded time between them divided by the speed (--trace-think scaled)"
                if cfg.trace.think_scaled
                else "plus the recorded time between them at every speed (--trace-think scaled divides it too)"
            ),
            flush=True,
        )
    try:
        result: RampResult = run_stoppable(ramp(cfg, _progress))
    except RampError as e:
        if (Path(cfg.out_dir) / "ramp.json").exists():
            e.hint = f"finished steps are in {cfg.out_dir}/ramp.json"
        raise
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished steps are in {cfg.out_dir}/ramp.json", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(step_table(result.steps, result.knee))
    if any(s.sessions is not None for s in result.steps) and all(s.unit == "users" for s in result.steps):
        print("each user runs one session (a conversation, an agent's chain of calls) at a time: users are "
              "concurrent sessions")  # fmt: skip
    if result.status == "stopped_early":
        print(f"stopped early: {result.stop_reason}")
    elif result.stop_reason:
        print(f"stopped: {result.stop_reason}")
    print(f"results: {cfg.out_dir}/ramp.json, {cfg.out_dir}/requests.jsonl")
    return EXIT_OK
