"""A ramp's defaults, once: :class:`~spoc_tui.load.ramp.RampConfig` takes them, and ``spoc
ramp``'s options show them without loading the ramp's machinery (``spoc --help`` stays fast)."""

from __future__ import annotations

import math
import random
from typing import Any

from spoc_tui.core.ramp.rules import ABORT_FACTOR as ABORT_FACTOR
from spoc_tui.core.ramp.rules import ARRIVALS as ARRIVALS
from spoc_tui.core.ramp.rules import AUTO_SPAWN as AUTO_SPAWN
from spoc_tui.core.ramp.rules import DEFAULT_BUDGET_S as DEFAULT_BUDGET_S
from spoc_tui.core.ramp.rules import EXTEND_FACTOR as EXTEND_FACTOR
from spoc_tui.core.ramp.rules import LOCKSTEP_SPAWN_RATE as LOCKSTEP_SPAWN_RATE
from spoc_tui.core.ramp.rules import SEED as SEED
from spoc_tui.core.ramp.rules import STEP_S as STEP_S
from spoc_tui.core.ramp.rules import WARMUP_S as WARMUP_S
from spoc_tui.core.ramp.rules import ArrivalMode as ArrivalMode
from spoc_tui.core.ramp.rules import StepRules as StepRules
from spoc_tui.core.ramp.rules import budget as budget
from spoc_tui.core.ramp.rules import step_limit as step_limit
from spoc_tui.core.ramp.sla import MOST_STEP_S

DEFAULT_USERS = "auto"
MAX_WORKERS = 64
"""The most load-generator processes a ramp starts on this machine."""
DEFAULT_PROFILE = "chatbot"
WORKERS = 0
POLL_S = 5.0
MAX_SPAWN_RATE = 100.0
"""Locust's advice: faster ramp-ups are known to cause trouble."""


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


MOST_STEP_REQUESTS = 60_000
"""The most requests an open-loop step may send (its top rate over its longest length): each is a
sample kept until the step is summarised, some 7 KB in a prediction, so the bound keeps a step
under half a gigabyte (``--rate 10000`` at a minute's step reached 4.9 GB: issue 74)."""


def rules_error(r: Any, trace: bool) -> str | None:
    """What is wrong with an experiment's step rules (``r``'s :class:`StepRules`: a ramp's request or
    a prediction; ``trace``: a replay, whose step is the trace's span over its speed), in the
    flags' words; None when nothing is. The one check ``spoc ramp``, ``spoc twin predict``, the
    Load screen and a study's trials share."""
    if not 0 < r.step_s <= MOST_STEP_S:
        return f"--step-seconds must be above 0 and at most {MOST_STEP_S:,.0f} (a day)"
    if not 0 <= r.warmup_s < r.step_s:
        return "--warmup-seconds must be at least 0 and shorter than --step-seconds"
    if r.max_step_s is not None and not r.step_s <= r.max_step_s <= MOST_STEP_S:
        return f"--max-step-seconds must be at least --step-seconds and at most {MOST_STEP_S:,.0f} (a day)"
    if r.budget_s is not None and not (0 if trace else r.step_s) < r.budget_s < math.inf:
        # (a replay's step is the trace's span over its speed: checked against the budget when it starts)
        return "--budget must be at least one step (--step-seconds)"
    from spoc_tui.core.ramp.knee import FixedRates

    limit = step_limit(r.step_s, r.max_step_s)
    if isinstance(r.plan, FixedRates) and r.plan.rates and max(r.plan.rates) * limit > MOST_STEP_REQUESTS:
        top = max(r.plan.rates)
        return (
            f"--rate {top:g} over a step of up to {limit:,.0f} s (--max-step-seconds) is {top * limit:,.0f} requests; "
            f"a step holds at most {MOST_STEP_REQUESTS:,}: lower the rate or the step's length"
        )
    if r.arrivals not in ("staggered", "lockstep"):
        return f"--arrivals {r.arrivals!r}: staggered or lockstep"
    if r.spawn_rate is not None and not 0 < r.spawn_rate <= LOCKSTEP_SPAWN_RATE:
        return "--spawn-rate must be above 0 and at most 1000 users per second"
    return None


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
