"""A ramp's defaults, once: :class:`~spoc_tui.load.ramp.RampConfig` takes them, and ``spoc
ramp``'s options show them without loading the ramp's machinery (``spoc --help`` stays fast)."""

from __future__ import annotations

import math
import random
from typing import Any, Literal

DEFAULT_USERS = "auto"
MAX_WORKERS = 64
"""The most load-generator processes a ramp starts on this machine."""
EXTEND_FACTOR = 4.0
"""Default --max-step-seconds, as a multiple of --step-seconds."""
DEFAULT_PROFILE = "chatbot"
DEFAULT_BUDGET_S = 600.0
"""The knee search's default time budget: 10 minutes of load (warm-ups included)."""
STEP_S = 60.0
WARMUP_S = 10.0
ABORT_FACTOR = 3.0
WORKERS = 0
SEED = 0
POLL_S = 5.0
ArrivalMode = Literal["staggered", "lockstep"]
"""``--arrivals``: users staggered (the default) or started together (:data:`LOCKSTEP_SPAWN_RATE`)."""
ARRIVALS: ArrivalMode = "staggered"
MAX_SPAWN_RATE = 100.0
"""Locust's advice: faster ramp-ups are known to cause trouble."""
LOCKSTEP_SPAWN_RATE = 1000.0
"""``--arrivals lockstep``: new users spawned at once (1,000 a second, the most --spawn-rate takes);
every user then starts the step together (:class:`~spoc_tui.load.runner.Cohort`)."""


def spawn_rate(change: int, warmup_s: float, arrivals: str, given: float | None = None) -> float:
    """Users per second for a step that changes the user count by ``change``: ``--spawn-rate`` when
    given, else fast enough to finish within the first half of the warm-up, between 1 and 100 a
    second (Locust's advised maximum); every user at once with ``--arrivals lockstep``. The ramp
    and the twin's prediction both start users so."""
    if given:
        return given
    if arrivals == "lockstep":
        return LOCKSTEP_SPAWN_RATE
    return float(min(MAX_SPAWN_RATE, max(1.0, math.ceil(abs(change) / max(0.5, warmup_s / 2)))))


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


class StepRules:
    """The step rules in force, read the same by a ramp's request and a prediction
    (:class:`~spoc_tui.load.ramp.RampConfig`, :class:`~spoc_tui.twin.predict.Prediction`):
    their defaults applied to what they were given."""

    plan: object
    step_s: float
    max_step_s: float | None
    budget_s: float | None

    @property
    def step_limit_s(self) -> float:
        """The longest an undecided step is measured on (:func:`step_limit`)."""
        return step_limit(self.step_s, self.max_step_s)

    @property
    def budget(self) -> float | None:
        """The load-time budget in force: ``budget_s``, else the knee search's default."""
        return budget(self.plan, self.budget_s)


RULES = ("step_s", "warmup_s", "max_step_s", "budget_s", "arrivals", "spawn_rate", "seed")
"""How an experiment's steps run, named alike by a ramp's request and a prediction (and copied
from one to the other by :func:`rules`)."""


def rules(src: object) -> dict[str, Any]:
    """``src``'s :data:`RULES`, as keyword arguments for a :class:`RampConfig` or a
    :class:`~spoc_tui.twin.predict.Prediction` of the same experiment."""
    return {k: getattr(src, k) for k in RULES}


class PoissonArrivals:
    """An open loop's arrival times (``--rate``): a Poisson process on an absolute schedule, so a
    late wake-up does not lower the rate (the next arrival is drawn from the last one's time, not
    from when the sender woke), restarted from ``now`` when the rate changes (a new step)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.rate: float | None = None
        self.next_at = 0.0

    def next(self, rate: float, now: float) -> float:
        """The next arrival's time on ``now``'s clock, at ``rate`` arrivals per second."""
        if rate != self.rate:
            self.rate, self.next_at = rate, now
        self.next_at += self.rng.expovariate(rate)
        return self.next_at
