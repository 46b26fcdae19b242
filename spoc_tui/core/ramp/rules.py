"""An experiment's step rules, each declared once (issue 78): its type, default, bounds and help,
how the command line and the Load form offer it, and its key in ramp.json's header.

:class:`StepRules` is the declaration. A ramp's request (:class:`~spoc_tui.load.ramp.RampConfig`)
and a twin's prediction (:class:`~spoc_tui.twin.predict.Prediction`) are step rules plus what they
run on; ``spoc ramp``, ``spoc twin predict`` and ``spoc tune`` make their options from its fields
(:func:`spoc_tui.cli.experiment.rule_option`), the Load form its fields, and the result files'
codec reads a header that lacks one as the ramp that wrote it ran
(:class:`spoc_tui.core.results.RampHeader`). Light to import: the CLI's ``--help`` reads it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

STEP_S = 60.0
WARMUP_S = 10.0
ABORT_FACTOR = 3.0
SEED = 0
ArrivalMode = Literal["staggered", "lockstep"]
"""``--arrivals``: users staggered (the default) or started together."""
ARRIVALS: ArrivalMode = "staggered"
AUTO_SPAWN = "auto: within half the warm-up, 1-100 users/s"
"""ramp.json's ``spawn_rate`` where none was given (the ramp's own rule: ``load.defaults.spawn_rate``)."""
DEFAULT_BUDGET_S = 600.0
"""The knee search's default time budget: 10 minutes of load (warm-ups included)."""
EXTEND_FACTOR = 4.0
"""Default --max-step-seconds, as a multiple of --step-seconds."""
LOCKSTEP_SPAWN_RATE = 1000.0
"""``--arrivals lockstep``: new users spawned at once (1,000 a second, the most --spawn-rate takes);
every user then starts the step together (:class:`~spoc_tui.load.runner.Cohort`)."""

Kind = Literal["seconds", "budget", "rate", "choice", "int"]
"""How a setting is written: seconds (a finite number), a budget (``10m``, ``90s``, ``1h``), a rate
(users a second), one of ``choices``, a whole number."""


@dataclass(frozen=True)
class Setting:
    """How one step rule is offered and written (its field gives its name, type and default)."""

    flag: str
    """Its command-line option (``--step-seconds``); the form's error messages name the field."""
    help: str
    kind: Kind
    form: str
    """Its field's label on the Load form (the field's id: :func:`form_id`)."""
    form_row: str = "rules"
    """The Load form's row it stands in: ``first`` (beside the profile and the levels), ``rules``
    (the budget's) or ``pacing`` (how users start)."""
    show_default: bool = True
    """``--help`` shows the default (a rule whose default depends on others says it in its help)."""
    choices: tuple[str, ...] = ()
    form_scale: float = 1.0
    """The form's unit, in the flag's (the budget: minutes on the form, seconds on the command line)."""
    form_tip: str = ""
    form_value: str | None = None
    """The form's first text where it is not the default's (the budget's: the knee search's)."""
    said: str = ""
    """How the form's error messages name it, where they would name the flag (``the step``)."""


def rule(default: Any, setting: Setting) -> Any:
    """A :class:`StepRules` field (keyword-only, as the class makes them all: a request's own fields
    come first): ``default``, and its :class:`Setting`."""
    return field(default=default, metadata={"setting": setting})


@dataclass(frozen=True, kw_only=True)
class StepRules:
    """How an experiment's steps run, each rule declared once; a ramp's request and a prediction
    are these plus what they run on (their ``plan`` above all, which :attr:`budget` reads). In the
    order ``--help`` lists them."""

    step_s: float = rule(
        STEP_S,
        Setting("--step-seconds", "Measured length of each step.", "seconds", "step s", "first", said="the step"),
    )
    spawn_rate: float | None = rule(
        None,
        Setting(
            "--spawn-rate",
            "Users added per second when a step starts [default: fast enough for half the warm-up, 1-100/s].",
            "rate",
            "spawn /s",
            form_row="pacing",
            show_default=False,
            form_tip="users started a second as a step begins (empty: within half the warm-up)",
            said="spawn /s",
        ),
    )
    arrivals: ArrivalMode = rule(
        ARRIVALS,
        Setting(
            "--arrivals",
            "staggered: starts spread out and turns jittered (each step measures how bunched its arrivals "
            "came); lockstep: at each step every user restarts at once once the requests in flight end, no "
            "jitter (the worst case; how AIPerf and GuideLLM start their probes).",
            "choice",
            "arrivals",
            form_row="pacing",
            choices=("staggered", "lockstep"),
            form_tip="staggered (the default) or lockstep: every user at once, the worst case",
            said="arrivals",
        ),
    )
    budget_s: float | None = rule(
        None,
        Setting(
            "--budget",
            "Most load time the ramp runs, warm-ups included (10m, 90s, 1h); no step starts once it is spent "
            f"[default: {DEFAULT_BUDGET_S / 60:g}m for the knee search, none for listed levels].",
            "budget",
            "budget min",
            show_default=False,
            form_scale=60.0,
            form_tip="most minutes of load the ramp runs (empty: no limit for listed levels)",
            form_value=f"{DEFAULT_BUDGET_S / 60:g}",
            said="the budget",
        ),
    )
    max_step_s: float | None = rule(
        None,
        Setting(
            "--max-step-seconds",
            "A step whose verdict is still inconclusive is measured on, up to this long [default: 4x --step-seconds].",
            "seconds",
            "max step s",
            show_default=False,
            form_tip="an inconclusive step is measured on up to this long",
            said="max step",
        ),
    )
    warmup_s: float = rule(
        WARMUP_S,
        Setting(
            "--warmup-seconds",
            "Start of each step left out of the figures.",
            "seconds",
            "warm-up s",
            "first",
            said="warm-up",
        ),
    )
    seed: int = rule(
        SEED,
        Setting(
            "--seed",
            "Random seed of the users.",
            "int",
            "seed",
            "pacing",
            form_tip="the users' random seed",
            said="seed",
        ),
    )

    @property
    def step_limit_s(self) -> float:
        """The longest an undecided step is measured on (:func:`step_limit`)."""
        return step_limit(self.step_s, self.max_step_s)

    @property
    def budget(self) -> float | None:
        """The load-time budget in force: ``budget_s``, else the knee search's default (the plan's:
        a subclass's ``plan``)."""
        return budget(getattr(self, "plan", None), self.budget_s)

    def rules(self) -> StepRules:
        """These rules alone (a request's, without what it runs on)."""
        return StepRules(**self.values())

    def values(self) -> dict[str, Any]:
        """Each rule by its name, for another request of the same experiment
        (``RampConfig(..., **p.values())``)."""
        return {f.name: getattr(self, f.name) for f in fields(StepRules)}


def form_id(name: str) -> str:
    """The Load form's field of the step rule ``name`` (``step_s``: ``step``, ``max_step_s``:
    ``max-step``)."""
    return name.removesuffix("_s").replace("_", "-")


def settings() -> list[tuple[str, Setting]]:
    """Each step rule's field name and :class:`Setting`, in their order."""
    return [(f.name, f.metadata["setting"]) for f in fields(StepRules)]


def declared(name: str) -> tuple[Setting, Any]:
    """The step rule ``name``'s :class:`Setting` and default.

    Raises:
        KeyError: no step rule of that name.
    """
    for f in fields(StepRules):
        if f.name == name:
            return f.metadata["setting"], f.default
    raise KeyError(name)


def step_limit(step_s: float, max_step_s: float | None) -> float:
    """The longest an undecided step is measured on: ``--max-step-seconds``, else
    :data:`EXTEND_FACTOR` steps (the ramp's rule and the prediction's)."""
    return max_step_s if max_step_s is not None else EXTEND_FACTOR * step_s


def budget(plan: object, budget_s: float | None) -> float | None:
    """The load budget in force: ``--budget``, else the knee searches' default (listed levels
    have none)."""
    from spoc_tui.core.ramp.knee import KneeSearch, SpeedSearch

    if budget_s is not None:
        return budget_s
    return DEFAULT_BUDGET_S if isinstance(plan, (KneeSearch, SpeedSearch)) else None
