"""Contract of the one piece of Optuna's private API spoc-tui uses (tune/optuna_compat.py).

When an Optuna release moves or changes NSGA-II's child-generation strategy, these tests fail
here, by name, rather than a study failing halfway through.
"""

from __future__ import annotations

import optuna
import pytest

from spoc_tui.tune import optuna_compat
from spoc_tui.tune.optuna_compat import OptunaChanged, RandomState, check, nsga2_children


def test_the_installed_optuna_is_one_we_support():
    check()  # raises OptunaChanged otherwise
    assert int(optuna.__version__.split(".")[0]) in optuna_compat.SUPPORTED


def test_the_strategy_breeds_a_child_from_a_real_population():
    """Breed from a real study's population as NSGAIISampler does: a full parameter dict within the space."""
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=1))
    dists = {
        "x": optuna.distributions.IntDistribution(0, 10),
        "c": optuna.distributions.CategoricalDistribution(["a", "b"]),
    }
    for i in range(8):
        t = study.ask(dists)
        study.tell(t, [float(i), float(10 - i)])
    strategy = nsga2_children(optuna.samplers.nsgaii.SBXCrossover(), RandomState(0))
    parents = study.get_trials(deepcopy=False)
    children = [strategy(study, dists, parents) for _ in range(20)]
    for child in children:
        assert set(child) <= set(dists)
        if "x" in child:
            assert 0 <= child["x"] <= 10
        if "c" in child:
            assert child["c"] in ("a", "b")
    assert any(child for child in children), "the strategy bred nothing"


def test_a_changed_optuna_is_refused_with_a_clear_message(monkeypatch):
    monkeypatch.setattr(optuna, "__version__", "99.0.0")
    with pytest.raises(OptunaChanged, match="optuna 99.0.0 is installed"):
        check()


def test_a_moved_strategy_is_refused_with_a_clear_message(monkeypatch):
    import optuna.samplers.nsgaii._child_generation_strategy as mod

    monkeypatch.delattr(mod, "NSGAIIChildGenerationStrategy")
    with pytest.raises(OptunaChanged, match="is gone"):
        check()
