"""``spoc tune``: a headless tuning study with a line per trial and the Pareto set at the end."""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spoc_tui.core import fmt
from spoc_tui.core.loadmath import Limit, parse_sla, parse_users
from spoc_tui.core.tunespace import Config, Objective, Space, SpaceError, load_space, parse_objectives, parse_template, template_flags
from spoc_tui.tune.evaluate import RampSettings, ServerEvaluator, TuneFatal
from spoc_tui.tune.study import Front, TrialRecord, TuneConfig, TuneError, TuneSession, redact_url


@dataclass
class TuneArgs:
    launch: str
    sla: str
    out_dir: str
    space: str | None = None
    objectives: str = "max:out_tok_s,min:ttft_p99"
    trials: int = 20
    storage: str | None = None
    study: str = "spoc"
    resume: bool = False
    worker: bool = False
    profile: str = "chatbot"
    users: str = "16"
    ref_users: int | None = None
    step_seconds: float = 30.0
    warmup_seconds: float = 5.0
    seed: int = 0
    population: int = 8
    screen_pool: int = 32
    tries: tuple[str, ...] = ()
    repeat_pareto: int = 0
    env: tuple[str, ...] = ()
    port: int | None = None
    start_timeout: float = 600.0
    model: str | None = None
    tokenizer: str | None = None
    workers: int = 0
    api_key: str | None = field(default=None, repr=False)


def value_text(o: Objective, v: float | None) -> str:
    if v is None:
        return "-"
    if o.is_latency:
        return fmt.seconds(v)
    if o.name == "knee_users":
        return f"{v:.0f} users"
    return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def build(a: TuneArgs) -> tuple[TuneConfig, ServerEvaluator]:
    """Check every option and build the study and its evaluator.

    Raises:
        SpaceError / ValueError: with a message naming the option.
    """
    from spoc_tui.load.profiles import load_profile

    if a.trials < 1:
        raise ValueError("--trials must be at least 1")
    if not 4 <= a.population <= 100:
        raise ValueError("--population must be between 4 and 100 (about 8-12 suits expensive trials)")
    if not 1 <= a.screen_pool <= 1000:
        raise ValueError("--screen-pool must be between 1 (plain NSGA-II) and 1000")
    if a.step_seconds <= 0 or not 0 <= a.warmup_seconds < a.step_seconds:
        raise ValueError("--warmup-seconds must be at least 0 and shorter than --step-seconds")
    if a.repeat_pareto < 0:
        raise ValueError("--repeat-pareto must be 0 or more")
    if a.port is not None and not 0 < a.port < 65536:
        raise ValueError("--port must be between 1 and 65535")
    if a.start_timeout <= 0:
        raise ValueError("--start-timeout must be positive")
    template, known = parse_template(a.launch)
    prog = template[0]
    if shutil.which(prog) is None:
        raise ValueError(f"--launch: {prog!r} is not a command on PATH or an executable file")
    objectives = parse_objectives(a.objectives)
    limits: tuple[Limit, ...] = parse_sla(a.sla)
    space: Space = load_space(a.space, known)
    clash = sorted(set(space.names) & template_flags(template))
    if clash:
        raise SpaceError(f"--launch already sets {', '.join('--' + c for c in clash)}, which the search space varies; take it out of the command")
    users = parse_users(a.users)
    if a.ref_users is not None and a.ref_users not in users:
        raise ValueError(f"--ref-users {a.ref_users} is not one of the ramp's user counts ({', '.join(map(str, users))})")
    tries: list[Config] = [space.parse_flags(t) for t in a.tries]
    for t in tries:
        broken = space.violated(t)
        if broken is not None:
            raise SpaceError(f"--try {' '.join(space.argv(t))}: breaks the condition {broken}")
    env: dict[str, str] = {}
    for item in a.env:
        k, eq, v = item.partition("=")
        if not eq or not k or not k.replace("_", "").isalnum():
            raise ValueError(f"--env {item.split('=')[0]}=...: expected NAME=VALUE")
        env[k] = v
    profile = load_profile(a.profile)
    knee = any(o.name == "knee_users" for o in objectives)
    ramp = RampSettings(profile=profile, users=users, limits=limits, step_s=a.step_seconds, warmup_s=a.warmup_seconds,
                        abort_factor=3.0 if knee else float("inf"), seed=a.seed, model=a.model, tokenizer=a.tokenizer, workers=a.workers, api_key=a.api_key)
    out = Path(a.out_dir)
    cfg = TuneConfig(space=space, objectives=objectives, limits=limits, trials=a.trials, out_dir=out, study_name=a.study, storage=a.storage,
                     resume=a.resume, worker=a.worker, seed=None if a.worker else a.seed, population=a.population, screen_pool=a.screen_pool, ref_users=a.ref_users,
                     tries=tries, repeats=a.repeat_pareto, template=template)
    evaluator = ServerEvaluator(template, ramp, env=env, port=a.port, start_timeout=a.start_timeout, marker=out / "server.json")
    return cfg, evaluator


class Printer:
    """One line per trial (and per note) on stdout."""

    def __init__(self, cfg: TuneConfig) -> None:
        self.cfg = cfg
        self.front_numbers: set[int] = set()

    def __call__(self, kind: str, d: dict[str, Any]) -> None:
        o = self.cfg.objectives
        if kind == "opened":
            recs = [r for r in d["records"] if r.repeat_of is None]
            print(f"study {d['study']!r} in {d['storage']}" + (f": {len(recs)} trial(s) already run" if recs else ""), flush=True)
        elif kind == "note":
            print(f"note: {d['message']}", flush=True)
        elif kind == "trial_start":
            seeded = f"  [{d['seeded']}]" if d.get("seeded") else ""
            print(f"trial {d['ordinal']}/{d['total']} (#{d['number']}): {' '.join(d['flags'])}{seeded}", flush=True)
        elif kind == "server_ready":
            print(f"  server ready in {d['start_s']:.0f} s", flush=True)
        elif kind == "trial_done":
            r: TrialRecord = d["record"]
            front: Front = d["front"]
            self.front_numbers = {x.number for x in front.records}
            if r.status == "ok":
                vals = ", ".join(f"{x.label} {value_text(x, r.objectives.get(x.name))}" for x in o)
                tag = "" if r.feasible else "  breaks SLA (" + ", ".join(k for k, v in r.constraints.items() if v > 0) + ")"
                star = "  * Pareto" if r.number in self.front_numbers else ""
                print(f"  -> {vals}{tag}{star}   (hypervolume {front.hypervolume:.4g})", flush=True)
            else:
                print(f"  -> {r.status}: {r.reason}", flush=True)
        elif kind == "skipped" and d.get("seeded"):  # NSGA-II's own repeats are skipped silently
            print(f"skipped #{d['number']} [{d['seeded']}]: {d['reason']}", flush=True)
        elif kind == "others_done":
            nums = ", ".join(f"#{r.number}" for r in d["records"])
            print(f"  other workers finished trial(s) {nums}", flush=True)
        elif kind == "repeat_start":
            print(f"repeat {d['index']}/{d['total']} of trial #{d['number']}: {' '.join(d['flags'])}", flush=True)
        elif kind == "repeat_done":
            r = d["record"]
            vals = ", ".join(f"{x.label} {value_text(x, r.objectives.get(x.name))}" for x in o) if r.status == "ok" else f"{r.status}: {r.reason}"
            print(f"  -> {vals}", flush=True)


def pareto_table(session: TuneSession, front: Front) -> str:
    o = session.cfg.objectives
    if not front.records:
        return "Pareto set: empty (no trial met the SLA)"
    lines = [f"Pareto set ({len(front.records)} of {len([r for r in session.records if r.repeat_of is None])} trials), hypervolume {front.hypervolume:.4g}:"]
    for r in front.records:
        vals = "  ".join(f"{x.label} {value_text(x, r.objectives.get(x.name))}" for x in o)
        lines.append(f"  #{r.number:<4} {vals}")
        lines.append(f"        {session.command(r.flags)}")
    return "\n".join(lines)


def run(a: TuneArgs) -> int:
    try:
        cfg, evaluator = build(a)
    except (SpaceError, ValueError) as e:
        print(f"spoc tune: error: {e}", file=sys.stderr)
        return 2
    for note in cfg.space.notes:
        print(f"note: {note}", flush=True)
    print(f"search space: {cfg.space.source}, {cfg.space.size} configurations; objectives: {', '.join(map(str, cfg.objectives))}; "
          f"SLA: {', '.join(map(str, cfg.limits))}", flush=True)
    session = TuneSession(cfg, evaluator, Printer(cfg))
    try:
        session.open()
        summary = session.run()
    except TuneError as e:
        print(f"spoc tune: error: {e}", file=sys.stderr)
        return 2
    except TuneFatal as e:
        print(f"spoc tune: error: {e}", file=sys.stderr)
        print(f"finished trials are in {cfg.out_dir}/trials.jsonl", file=sys.stderr)
        return 1
    except Exception as e:  # a bug: say so in one line, keep the details in the output folder
        import traceback

        log = cfg.out_dir / "tune-error.log"
        log.write_text(traceback.format_exc())
        print(f"spoc tune: internal error: {type(e).__name__}: {e} (details in {log}); finished trials are in {cfg.out_dir}/trials.jsonl", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\ninterrupted: the server was stopped; finished trials are in {cfg.out_dir}/trials.jsonl and {cfg.out_dir}/pareto.json;"
              f" continue with --resume", file=sys.stderr)
        return 130
    print(pareto_table(session, summary.front))
    for num, reps in summary.repeats.items():
        for ob in cfg.objectives:
            vals = [r[ob.name] for r in reps if r.get(ob.name) is not None]
            if vals:
                print(f"  #{num} {ob.label} over {len(vals)} repeat(s): {value_text(ob, min(vals))} .. {value_text(ob, max(vals))}")
    if summary.message:
        print(summary.message)
    if summary.status == "interrupted":
        print(f"stopped: continue with --resume", file=sys.stderr)
    print(f"results: {cfg.out_dir}/trials.jsonl, {cfg.out_dir}/pareto.json; study: {redact_url(session.storage_url)} (opens in optuna-dashboard)")
    return 0 if summary.status != "interrupted" else 130
