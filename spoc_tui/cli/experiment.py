"""The options that say what a ramp runs, declared once for every command that runs one
(``spoc ramp`` measures it, ``spoc twin predict`` predicts it), and the one value they make: the
load (a profile's users, an open-loop rate or a trace's rows at speed multiples), the steps, the
budget, the pacing and the seed. Each command adds its own (``--sla``, ``--out``, what-ifs).
Light to import: a trace is read only when the command runs."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from spoc_tui.cli.types import FINITE, selected_trace, trace_selection, trace_think_option
from spoc_tui.core.errors import InputError
from spoc_tui.load import defaults
from spoc_tui.load.defaults import DEFAULT_BUDGET_S, DEFAULT_PROFILE, DEFAULT_USERS, ArrivalMode

if TYPE_CHECKING:
    from spoc_tui.core.ramp.knee import UserPlan
    from spoc_tui.core.traces.read import TraceSource

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ExperimentOptions:
    """What the command line asked the experiment to run, as given (checked when read)."""

    profile: str
    users_spec: str | None
    rate_spec: str | None
    trace_path: str | None
    speed_spec: str | None
    trace_format: str | None
    trace_filters: tuple[str, ...]
    trace_window: str | None
    trace_max_rows: int | None
    trace_think: str
    step_seconds: float
    warmup_seconds: float
    max_step_seconds: float | None
    budget_spec: str | None
    arrivals: ArrivalMode
    spawn_rate: float | None
    seed: int

    def trace(self) -> TraceSource | None:
        """The trace the options pick (None: a profile's users or a rate).

        Raises:
            InputError: ``--users`` with ``--rate``; a trace option without ``--trace``; the
                trace's own errors (no such file, a bad window...).
        """
        if self.users_spec is not None and self.rate_spec is not None:
            raise InputError("give --users (closed loop) or --rate (open loop), not both")
        return selected_trace(
            self.trace_path,
            self.speed_spec,
            self.users_spec,
            self.rate_spec,
            self.trace_format,
            self.trace_filters,
            self.trace_window,
            self.trace_max_rows,
            self.trace_think,
        )

    def plan(self, trace: TraceSource | None) -> UserPlan:
        """The levels the steps run: speed multiples of ``trace``, rates, or user counts.

        Raises:
            InputError: a level list that cannot be read.
        """
        from spoc_tui.core.ramp.knee import FixedRates, parse_speed_plan, parse_user_plan
        from spoc_tui.core.ramp.sla import parse_rates

        if trace is not None:
            return parse_speed_plan(self.speed_spec or "auto")
        if self.rate_spec is not None:
            return FixedRates(parse_rates(self.rate_spec))
        return parse_user_plan(self.users_spec or DEFAULT_USERS)

    def rules(self) -> dict[str, Any]:
        """How the steps run (:data:`spoc_tui.load.defaults.RULES`), as a ramp's request and a
        prediction take them.

        Raises:
            InputError: a budget that cannot be read.
        """
        return dict(step_s=self.step_seconds, warmup_s=self.warmup_seconds, max_step_s=self.max_step_seconds,
                    budget_s=self.budget_s(), arrivals=self.arrivals, spawn_rate=self.spawn_rate,
                    seed=self.seed)  # fmt: skip

    def budget_s(self) -> float | None:
        """``--budget`` in seconds (None: the plan's default).

        Raises:
            InputError: a budget that cannot be read.
        """
        from spoc_tui.core.ramp.sla import parse_budget

        return parse_budget(self.budget_spec) if self.budget_spec is not None else None


_DECLARED: dict[str, dict[str, Any]] = {
    "--profile": dict(
        default=DEFAULT_PROFILE,
        show_default=True,
        help="Built-in profile (coding, logs, chatbot, mix, tuning, agent) or a TOML file.",
    ),
    "--users": dict(
        dest="users_spec",
        default=None,
        help=(
            "User counts, a series like geom:1:64, or auto[:MAX]: search for the knee, inferring it across "
            "steps with its 95 % interval, until the interval is within 5 % or --budget is spent (while it "
            f"doubles, a step far under every limit ends early) [default: {DEFAULT_USERS}]."
        ),
    ),
    "--rate": dict(
        dest="rate_spec",
        default=None,
        help="Open loop instead of users: arrival rates in requests/s (Poisson, as vllm bench serve), e.g. 1,2,4,8.",
    ),
    "--trace": dict(
        dest="trace_path",
        default=None,
        type=click.Path(dir_okay=False),
        help=(
            "Replay this traffic trace instead of a profile (Mooncake, Bailian, BurstGPT, Azure, WEKA, OTLP "
            "or spoc JSONL): each step sends its rows on their timestamps divided by a --speed."
        ),
    ),
    "--speed": dict(
        dest="speed_spec",
        default=None,
        help=(
            "With --trace: speed multiples, one step each (0.5,1,2,4), or auto[:MAX]: search the knee in "
            "speed multiples of the trace [default: auto]."
        ),
    ),
    "--step-seconds": dict(
        type=FINITE, default=defaults.STEP_S, show_default=True, help="Measured length of each step."
    ),
    "--spawn-rate": dict(
        type=FINITE,
        default=None,
        help="Users added per second when a step starts [default: fast enough for half the warm-up, 1-100/s].",
    ),
    "--arrivals": dict(
        type=click.Choice(["staggered", "lockstep"]),
        default=defaults.ARRIVALS,
        show_default=True,
        help=(
            "staggered: starts spread out and turns jittered (each step measures how bunched its arrivals "
            "came); lockstep: at each step every user restarts at once once the requests in flight end, no "
            "jitter (the worst case; how AIPerf and GuideLLM start their probes)."
        ),
    ),
    "--budget": dict(
        dest="budget_spec",
        default=None,
        help=(
            "Most load time the ramp runs, warm-ups included (10m, 90s, 1h); no step starts once it is spent "
            f"[default: {DEFAULT_BUDGET_S / 60:g}m for the knee search, none for listed levels]."
        ),
    ),
    "--max-step-seconds": dict(
        type=FINITE,
        default=None,
        help="A step whose verdict is still inconclusive is measured on, up to this long [default: 4x --step-seconds].",
    ),
    "--warmup-seconds": dict(
        type=FINITE, default=defaults.WARMUP_S, show_default=True, help="Start of each step left out of the figures."
    ),
    "--seed": dict(type=int, default=defaults.SEED, show_default=True, help="Random seed of the users."),
}
"""Each option of an experiment, declared once: its type, default and help. Another command that
runs experiments (``spoc tune``'s trials) takes them by :func:`option`, changing what it must."""


def option(name: str, **changes: Any) -> Callable[[F], F]:
    """The declared option ``name`` as a click option, with ``changes`` (another default, help,
    destination) applied; ``dest=None`` keeps click's own name for it."""
    decl = {**_DECLARED[name], **changes}
    dest = decl.pop("dest", None)
    opt: Callable[[F], F] = click.option(name, *([dest] if dest else []), **decl)
    return opt


_OPTIONS: list[Callable[[Any], Any]] = [
    *(option(n) for n in ("--profile", "--users", "--rate", "--trace", "--speed")),
    trace_selection(),
    trace_think_option,
    *(option(n) for n in ("--step-seconds", "--spawn-rate", "--arrivals", "--budget", "--max-step-seconds")),
    *(option(n) for n in ("--warmup-seconds", "--seed")),
]
"""The options in the order --help lists them."""


def experiment_options(f: F) -> F:
    """Declare the experiment's options on a command and hand it one :class:`ExperimentOptions`
    as ``exp`` in their place."""
    names = ExperimentOptions.__dataclass_fields__

    @functools.wraps(f)
    def wrapper(*args: Any, **kw: Any) -> Any:
        exp = ExperimentOptions(**{k: kw.pop(k) for k in names})
        return f(*args, exp=exp, **kw)

    out: Any = wrapper
    for opt in reversed(_OPTIONS):
        out = opt(out)
    return cast(F, out)
