"""The one place spoc-tui reaches into Optuna beyond its documented API.

NSGA-II's child generation (selection, crossover, mutation) is what
:class:`~spoc_tui.tune.screening.ScreenedChildren` calls to breed its pool of candidates.
Optuna builds that strategy in ``NSGAIISampler.__init__`` from a class it does not export,
``optuna.samplers.nsgaii._child_generation_strategy.NSGAIIChildGenerationStrategy``, which takes
its random state as an object with an ``rng`` attribute (Optuna's ``LazyRandomState``).

Everything that depends on that is here, checked against the Optuna versions it was written
for (:data:`SUPPORTED`), and pinned by ``tests/unit/test_optuna_compat.py``: when Optuna
changes it, that test fails, and :func:`check` raises with a message that says so instead of
a study failing halfway.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import optuna

from spoc_tui.core.errors import SpocError

SUPPORTED = (5,)
"""Optuna major versions this module was checked against (pyproject pins optuna>=5,<6)."""
STRATEGY_PATH = "optuna.samplers.nsgaii._child_generation_strategy.NSGAIIChildGenerationStrategy"
_ARGS = ("crossover", "crossover_prob", "swapping_prob", "rng")
_CALL = ("study", "search_space", "parent_population")

ChildStrategy = Callable[[Any, dict[str, Any], list[Any]], dict[str, Any]]
"""(study, search space, parent population) -> a child's parameters."""


class OptunaChanged(SpocError):
    """The installed Optuna no longer has the private API this module uses."""


class RandomState:
    """What the strategy expects of its random state: an ``rng`` attribute (a NumPy RandomState)."""

    def __init__(self, seed: int | None) -> None:
        self.rng = np.random.RandomState(seed)


def _strategy_class() -> type:
    try:
        from optuna.samplers.nsgaii._child_generation_strategy import NSGAIIChildGenerationStrategy
    except ImportError as e:
        raise OptunaChanged(
            f"optuna {optuna.__version__}: {STRATEGY_PATH} is gone ({e}); spoc-tui supports optuna {SUPPORTED}"
        ) from None
    return NSGAIIChildGenerationStrategy


def check() -> None:
    """Raises: OptunaChanged when the installed Optuna is not one this module knows."""
    major = int(optuna.__version__.split(".")[0])
    if major not in SUPPORTED:
        raise OptunaChanged(
            f"optuna {optuna.__version__} is installed; spoc-tui's NSGA-II screening supports optuna {SUPPORTED}"
        )
    cls = _strategy_class()
    init = inspect.signature(cls).parameters
    call = list(inspect.signature(cls.__call__).parameters)[1:]
    missing = [a for a in _ARGS if a not in init]
    if missing or call != list(_CALL):
        raise OptunaChanged(
            f"optuna {optuna.__version__}: {STRATEGY_PATH} changed its signature "
            f"(expected arguments {_ARGS}, call {_CALL}); spoc-tui supports optuna {SUPPORTED}"
        )


def nsga2_children(
    crossover: Any, rng: RandomState, crossover_prob: float = 0.9, swapping_prob: float = 0.5
) -> ChildStrategy:
    """NSGA-II's own child-generation strategy (as ``NSGAIISampler`` builds it by default).

    Raises:
        OptunaChanged: see :func:`check`.
    """
    check()
    strategy: ChildStrategy = _strategy_class()(
        crossover=crossover, crossover_prob=crossover_prob, swapping_prob=swapping_prob, rng=rng
    )
    return strategy


def ask_preferring(study: Any, prefer: Callable[[Any], bool]) -> Any:
    """``study.ask()``, except that a queued (WAITING) trial for which ``prefer(frozen_trial)``
    holds is taken before the ones queued earlier: a configuration an interruption cut short runs
    first when the study goes on, not after the whole first generation queued before it.

    Optuna's queue is first in, first out (``Study._pop_waiting_trial_id``); taking a chosen trial
    does what it does for the first one: set it RUNNING in the storage (which refuses if another
    worker took it meanwhile) and wrap it as a ``Trial``."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        if not prefer(t):
            continue
        try:
            if not study._storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                continue
        except UpdateFinishedTrialError:
            continue
        study._thread_local.cached_all_trials = None
        return optuna.Trial(study, t._trial_id)
    return study.ask()


def add_frozen(study: Any, frozen: Any) -> int:
    """Store a finished trial and return its number (``Study.add_trial`` returns nothing, and the
    last trial's number may be another worker's by the time it is read)."""
    trial_id = study._storage.create_new_trial(study._study_id, template_trial=frozen)
    return int(study._storage.get_trial_number_from_id(trial_id))
