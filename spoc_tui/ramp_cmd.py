"""``spoc ramp``: a headless load ramp with progress lines and a final table."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from spoc_tui.core import fmt
from spoc_tui.core.loadmath import Knee, StepSummary
from spoc_tui.load.ramp import RampConfig, RampError, RampProgress, RampResult, run_ramp


def _progress(p: RampProgress) -> None:
    if p.phase == "preflight":
        print("checking the server and the model...", flush=True)
    elif p.phase == "starting":
        print("starting the load generator (Locust)...", flush=True)
    elif p.phase == "warmup":
        print(f"step {p.step}: {p.users} users, warming up", flush=True)
    elif p.phase == "step_done":
        s = p.steps[-1]
        v = s.verdict
        mark = "meets SLA" if v.get("ok") else f"BREAKS {v.get('broken_limit')}"
        print(
            f"step {s.step}: {s.users} users  {s.request_rate:.2f} req/s  {s.output_tokens_per_s:.0f} out tok/s  "
            f"TTFT p99 {fmt.seconds(s.latency['ttft']['p99'])}  ITL p99 {fmt.seconds(s.latency['itl']['p99'])}  "
            f"errors {s.error_rate * 100:.1f}%  -> {mark}",
            flush=True,
        )


def table(steps: list[StepSummary], knee: Knee) -> str:
    head = f"{'users':>6} {'req/s':>7} {'out tok/s':>9} {'goodput':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p99':>8} {'TPOT p99':>9} {'E2E p99':>8} {'err%':>5} {'queue':>6} {'KV':>5}  verdict"
    lines = [head]
    for s in steps:
        srv = s.server or {}
        kv = srv.get("kv_cache_usage_max")
        lines.append(
            f"{s.users:>6} {s.request_rate:>7.2f} {s.output_tokens_per_s:>9.0f} {s.goodput:>8.2f} {fmt.seconds(s.latency['ttft']['p50']):>9} "
            f"{fmt.seconds(s.latency['ttft']['p99']):>9} {fmt.seconds(s.latency['itl']['p99']):>8} {fmt.seconds(s.latency['tpot']['p99']):>9} "
            f"{fmt.seconds(s.latency['e2e']['p99']):>8} {s.error_rate * 100:>5.1f} {fmt.num(srv.get('waiting_max')):>6} "
            f"{fmt.pct(kv):>5}  {'ok' if s.verdict.get('ok') else 'breaks ' + str(s.verdict.get('broken_limit'))}"
        )
    if knee.max_users_within_sla is None and knee.first_failing_users is not None:
        lines.append(f"knee: even {knee.first_failing_users} users break the SLA ({knee.broken_limit})")
    elif knee.first_failing_users is None:
        lines.append(f"knee: not reached; {knee.max_users_within_sla} users still meet the SLA")
    else:
        lines.append(f"knee: {knee.max_users_within_sla} users meet the SLA; {knee.first_failing_users} break {knee.broken_limit}")
    return "\n".join(lines)


def run(cfg: RampConfig) -> int:
    try:
        result: RampResult = asyncio.run(run_ramp(cfg, _progress))
    except RampError as e:
        print(f"spoc ramp: error: {e}", file=sys.stderr)
        if (Path(cfg.out_dir) / "ramp.json").exists():
            print(f"finished steps are in {cfg.out_dir}/ramp.json", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        print(f"\ninterrupted: finished steps are in {cfg.out_dir}/ramp.json", file=sys.stderr)
        return 130
    print(table(result.steps, result.knee))
    if result.status == "stopped_early":
        print(f"stopped early: the SLA was broken by more than {cfg.abort_factor:g}x")
    print(f"results: {cfg.out_dir}/ramp.json, {cfg.out_dir}/requests.jsonl")
    return 0
