"""The options that say what a ramp runs, declared once for every command that runs one
(``spoc ramp`` measures it, ``spoc twin predict`` predicts it), and the one value they make: the
load (a profile's users, an open-loop rate or a trace's rows at speed multiples), the steps, the
budget, the pacing and the seed. The load's options are declared here; the step rules' are made
from their one declaration (:class:`~spoc_tui.core.ramp.rules.StepRules`, :func:`rule_option`).
Each command adds its own (``--sla``, ``--out``, what-ifs). Light to import: a trace is read only
when the command runs."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click

from spoc_tui.cli.types import FINITE, selected_trace, trace_selection, trace_think_option
from spoc_tui.core.errors import InputError
from spoc_tui.core.ramp.rules import StepRules, declared, settings
from spoc_tui.load.defaults import DEFAULT_PROFILE, DEFAULT_USERS

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
    given: Mapping[str, object]
    """The step rules as the options gave them, by their field's name in
    :class:`~spoc_tui.core.ramp.rules.StepRules` (checked and read by :meth:`rules`)."""

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

    def rules(self) -> StepRules:
        """How the steps run (:class:`~spoc_tui.core.ramp.rules.StepRules`), as a ramp's request and
        a prediction take them.

        Raises:
            InputError: a budget that cannot be read.
        """
        from spoc_tui.core.ramp.sla import parse_budget

        values: dict[str, Any] = {}
        for name, setting in settings():
            v = self.given[name]
            values[name] = parse_budget(str(v)) if setting.kind == "budget" and v is not None else v
        return StepRules(**values)


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
}
"""Each option of an experiment's load, declared once: its type, default and help. Another command
that runs experiments (``spoc tune``'s trials) takes them by :func:`option`, changing what it must
(the step rules: :func:`rule_option`)."""


def option(name: str, **changes: Any) -> Callable[[F], F]:
    """The declared option ``name`` as a click option, with ``changes`` (another default, help,
    destination) applied; ``dest=None`` keeps click's own name for it."""
    decl = {**_DECLARED[name], **changes}
    dest = decl.pop("dest", None)
    opt: Callable[[F], F] = click.option(name, *([dest] if dest else []), **decl)
    return opt


_TYPES: dict[str, Any] = {"seconds": FINITE, "rate": FINITE, "int": int, "budget": str}
"""Each kind of step rule's click type (a choice's is its choices)."""


def rule_option(name: str, **changes: Any) -> Callable[[F], F]:
    """The step rule ``name`` (a field of :class:`~spoc_tui.core.ramp.rules.StepRules`) as a click
    option made from its declaration, its value under that name; ``changes``: another default or
    help (``spoc tune``'s shorter steps)."""
    s, default = declared(name)
    kind = click.Choice(list(s.choices)) if s.kind == "choice" else _TYPES[s.kind]
    default = changes.get("default", default)
    opt: Callable[[F], F] = click.option(
        s.flag, name, type=kind, default=default, show_default=s.show_default, help=changes.get("help", s.help)
    )
    return opt


_OPTIONS: list[Callable[[Any], Any]] = [
    *(option(n) for n in ("--profile", "--users", "--rate", "--trace", "--speed")),
    trace_selection(),
    trace_think_option,
    *(rule_option(n) for n, _ in settings()),
]
"""The options in the order --help lists them."""


def experiment_options(f: F) -> F:
    """Declare the experiment's options on a command and hand it one :class:`ExperimentOptions`
    as ``exp`` in their place."""
    names = [k for k in ExperimentOptions.__dataclass_fields__ if k != "given"]

    @functools.wraps(f)
    def wrapper(*args: Any, **kw: Any) -> Any:
        given = {n: kw.pop(n) for n, _ in settings()}
        exp = ExperimentOptions(**{k: kw.pop(k) for k in names}, given=given)
        return f(*args, exp=exp, **kw)

    out: Any = wrapper
    for opt in reversed(_OPTIONS):
        out = opt(out)
    return cast(F, out)
