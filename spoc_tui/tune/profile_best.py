"""``spoc tune --profile-best``: the study ends with a profile of its best configuration.

The best configuration (the front member with the best pooled value of the first objective) is
launched once more with the torch profiler on (``--profiler-config``, vLLM 0.32), driven at the
study's reference load, and profiled for a few seconds; the breakdown is written to the
study's ``profile/`` folder as ``profile.json`` and ``profile.txt`` (the trace and the server's
log beside them, under ``trial-N/``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from spoc_tui.core.errors import SpocError
from spoc_tui.core.ramp.knee import FixedUsers, UserPlan
from spoc_tui.core.tuning.space import command_line
from spoc_tui.procs.ports import free_port
from spoc_tui.procs.server import LaunchError, ServerProcess
from spoc_tui.profile.analyze import Breakdown, analyse
from spoc_tui.profile.capture import CaptureConfig, capture, profiler_config
from spoc_tui.profile.report import render_text
from spoc_tui.profile.trace import read_trace
from spoc_tui.tune.evaluate import ServerEvaluator
from spoc_tui.tune.records import Front, FrontMember
from spoc_tui.tune.study import TuneConfig

PROFILE_SECONDS = 5.0


def best_member(front: Front, cfg: TuneConfig) -> FrontMember | None:
    if not front.members:
        return None
    first = cfg.objectives[0]
    sign = 1.0 if first.direction == "max" else -1.0
    return max(front.members, key=lambda m: sign * m.values[0])


def profile_best(
    cfg: TuneConfig,
    evaluator: ServerEvaluator,
    front: Front,
    say: Callable[[str], None],
    seconds: float = PROFILE_SECONDS,
    plan: UserPlan | None = None,
) -> Breakdown:
    """Launch, load, profile and stop the best configuration; raises SpocError with the reason.
    ``plan``: the levels the study's trials stepped (its reference load; None: the ramp's own)."""
    m = best_member(front, cfg)
    if m is None:
        raise SpocError("--profile-best: no feasible configuration to profile")
    rec = m.record
    folder = cfg.out_dir / "profile" / f"trial-{rec.number}"
    traces = folder / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    flags = [*rec.flags, "--profiler-config", json.dumps(profiler_config(traces))]
    port = evaluator.port or free_port()
    argv = command_line(evaluator.template, flags, port)
    say(f"--profile-best: trial #{rec.number} again with the profiler on: {' '.join(rec.flags) or '(defaults)'}")
    server = ServerProcess(argv, port, folder / "server.log", evaluator.env, guard=True, marker=evaluator.marker)
    try:
        try:
            server.start(timeout=evaluator.start_timeout)
        except LaunchError as e:
            raise SpocError(
                f"--profile-best: the server did not start with the profiler ({e}); vLLM before 0.32 takes "
                f"VLLM_TORCH_PROFILER_DIR={traces} in --env instead (log: {folder / 'server.log'})"
            ) from None
        plan = plan or evaluator.ramp.plan
        planned = plan.users[-1] if isinstance(plan, FixedUsers) and plan.users else 4
        users = int((rec.reference.users if rec.reference else None) or planned)
        ramp = evaluator.ramp
        cap = CaptureConfig(
            url=server.url,
            trace_dir=traces,
            seconds=seconds,
            users=users,
            profile=ramp.workload,
            model=ramp.model,
            warmup_s=min(ramp.warmup_s, 10.0),
            api_key=ramp.api_key,
            seed=ramp.seed,
        )
        path = asyncio.run(capture(cap, say))
    finally:
        server.stop()
    b = analyse(read_trace(path))
    b.notes.append(f"trial #{rec.number} at {users} users, profiled for {seconds:g} s")
    _write(folder.parent, b)
    return b


def _write(folder: Path, b: Breakdown) -> None:
    (folder / "profile.json").write_text(json.dumps(b.as_dict(), indent=2))
    (folder / "profile.txt").write_text(render_text(b) + "\n")
