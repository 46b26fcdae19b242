"""A tuning study's request (:class:`TuneArgs`, :mod:`spoc_tui.tune.args`) checked, and the study
made from it (:func:`build`)."""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from pathlib import Path

from spoc_tui.core.errors import InputError
from spoc_tui.core.ramp.knee import FixedSpeeds, FixedUsers, KneeSearch, SaturationSearch, UserPlan, parse_user_plan
from spoc_tui.core.ramp.sla import MAX_SPEED, Limit, parse_sla
from spoc_tui.core.traces.read import TraceSource, trace_source
from spoc_tui.core.tuning.space import (
    Config,
    Space,
    SpaceError,
    load_space,
    parse_objectives,
    parse_template,
    template_flags,
)
from spoc_tui.load.ramp import RampConfig, RampError, scan_trace
from spoc_tui.tune.args import TuneArgs
from spoc_tui.tune.evaluate import ServerEvaluator
from spoc_tui.tune.study import TuneConfig
from spoc_tui.workload import load_workload


class TuneArgsError(InputError, ValueError):
    """An option of a study that cannot be; the message names it."""


def _check_numbers(a: TuneArgs) -> None:
    """The study's numeric options, each in its range (TuneArgsError naming the option)."""
    if a.trials < 1:
        raise TuneArgsError("--trials must be at least 1")
    if not 4 <= a.population <= 100:
        raise TuneArgsError("--population must be between 4 and 100 (about 8-12 suits expensive trials)")
    if not 1 <= a.screen_pool <= 1000:
        raise TuneArgsError("--screen-pool must be between 1 (plain NSGA-II) and 1000")
    if not 0 <= a.rerun_share <= 0.5:
        raise TuneArgsError("--rerun-share must be between 0 (no re-runs) and 0.5")
    if a.repeat_pareto < 0:
        raise TuneArgsError("--repeat-pareto must be 0 or more")
    if a.port is not None and not 0 < a.port < 65536:
        raise TuneArgsError("--port must be between 1 and 65535")
    if not 0 < a.start_timeout < math.inf:
        raise TuneArgsError("--start-timeout must be a positive number of seconds")


def _trace(a: TuneArgs) -> TraceSource | None:
    """The trace each trial replays (its rows checked now, not as every trial's failure), or None;
    the options that go with one refused without it."""
    if a.trace is None:
        if a.trace_window is not None or a.trace_max_rows is not None or a.speed != TuneArgs.speed:
            raise TuneArgsError("--speed, --trace-window and --trace-max-rows go with --trace FILE")
        return None
    trace = trace_source(a.trace, a.trace_format, (), a.trace_window, a.trace_max_rows)
    try:
        scan_trace(trace)
    except RampError as e:
        raise TuneArgsError(str(e)) from None
    if not 0 < a.speed <= MAX_SPEED:
        raise TuneArgsError(f"--speed must be above 0 and at most {MAX_SPEED:g}")
    if a.users != TuneArgs.users or a.ref_users is not None:
        raise TuneArgsError("--trace replays the trace at --speed in every trial: leave out --users and --ref-users")
    return trace


def _env(items: Sequence[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` items as the server's environment."""
    env: dict[str, str] = {}
    for item in items:
        k, eq, v = item.partition("=")
        if not eq or not k or not k.replace("_", "").isalnum():
            raise TuneArgsError(f"--env {item.split('=')[0]}=...: expected NAME=VALUE")
        env[k] = v
    return env


def build(a: TuneArgs) -> tuple[TuneConfig, ServerEvaluator]:
    """Check every option and build the study and its evaluator.

    Raises:
        InputError (SpaceError, SlaError, WorkloadError, TuneArgsError): with a message naming the option.
    """
    _check_numbers(a)
    template, known = parse_template(a.launch)
    prog = template[0]
    if shutil.which(prog) is None:
        raise TuneArgsError(f"--launch: {prog!r} is not a command on PATH or an executable file")
    objectives = parse_objectives(a.objectives)
    limits: tuple[Limit, ...] = parse_sla(a.sla)
    space: Space = load_space(a.space, known)
    clash = sorted(set(space.names) & template_flags(template))
    if clash:
        raise SpaceError(
            f"--launch already sets {', '.join('--' + c for c in clash)}, which the search space varies; take "
            f"it out of the command"
        )
    trace = _trace(a)
    plan = parse_user_plan(a.users)
    users = plan.users if isinstance(plan, FixedUsers) else []
    if a.ref_users is not None and not users:
        raise TuneArgsError("--ref-users needs explicit --users counts (with --users auto the calibration sets it)")
    if a.ref_users is not None and a.ref_users not in users:
        raise TuneArgsError(
            f"--ref-users {a.ref_users} is not one of the ramp's user counts ({', '.join(map(str, users))})"
        )
    tries: list[Config] = [space.parse_flags(t) for t in a.tries]
    for t in tries:
        broken = space.violated(t)
        if broken is not None:
            raise SpaceError(f"--try {' '.join(space.argv(t))}: breaks the condition {broken}")
    env = _env(a.env)
    profile = load_workload(a.profile)
    knee = any(o.name == "knee_users" for o in objectives)
    if trace is not None and knee:
        raise TuneArgsError(
            "knee_users needs steps of users; with --trace score out_tok_s, req_s, goodput or a latency at the speed"
        )
    ramp_plan: UserPlan = (
        FixedSpeeds([a.speed])
        if trace is not None
        else FixedUsers(users)
        if users
        else SaturationSearch(plan.max_users if isinstance(plan, KneeSearch) else 1024)
    )
    ramp = RampConfig(
        url="",  # each trial's server
        workload=profile,
        plan=ramp_plan,
        limits=limits,
        out_dir=Path(a.out_dir),  # each trial's folder under it
        step_s=a.rules.step_s,
        warmup_s=a.rules.warmup_s,
        abort_factor=3.0 if knee else float("inf"),
        seed=a.rules.seed,
        model=a.model,
        tokenizer=a.tokenizer,
        workers=a.workers,
        api_key=a.api_key,
        trace=trace,
    )
    try:
        ramp.validate()
    except RampError as e:
        raise TuneArgsError(str(e)) from None
    out = Path(a.out_dir)
    cfg = TuneConfig(
        space=space,
        objectives=objectives,
        limits=limits,
        trials=a.trials,
        out_dir=out,
        study_name=a.study,
        storage=a.storage,
        resume=a.resume,
        worker=a.worker,
        seed=None if a.worker else a.rules.seed,
        population=a.population,
        screen_pool=a.screen_pool,
        ref_users=a.ref_users,
        tries=tries,
        repeats=a.repeat_pareto,
        rerun_share=a.rerun_share,
        template=template,
    )
    evaluator = ServerEvaluator(
        template, ramp, env=env, port=a.port, start_timeout=a.start_timeout, marker=out / "server.json"
    )
    return cfg, evaluator
