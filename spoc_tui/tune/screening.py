"""Surrogate pre-screening of NSGA-II's children, for trials that cost minutes each.

Plain NSGA-II spends a trial on every child it breeds. Here NSGA-II's own operators (selection,
SBX crossover, mutation) breed a pool of candidate children; each candidate is scored against
the trials already run, and only the most promising one is run. This is the "pre-selection"
form of surrogate-assisted NSGA-II: the search is still NSGA-II's (its parents, its elitism,
its front), it only stops spending trials on children that land next to configurations already
seen to fail or to be dominated.

The surrogate is a distance-weighted nearest-neighbour estimate over the trials run so far, in
the sampler's own coordinates (ordered flags by position, choices as match/mismatch):

- p: the chance the candidate is feasible (starts, meets the SLA), from its neighbours;
- y: its objective vector, from its neighbours that produced values;
- u: its uncertainty, the spread of those neighbours' values plus the distance to the nearest trial;
- score = p x (hypervolume that y - u would add to the current front, or minus how far it falls
  short): an optimistic estimate, so near-copies of trials already run add nothing and corners
  far from everything tried still get their turn.

Failed starts (FAIL trials, which NSGA-II itself ignores) count as infeasible neighbours.
Everything comes from the study's storage, so several workers share what they have learnt.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from spoc_tui.core.tuning.docs import RAN
from spoc_tui.core.tuning.pareto import hypervolume, pareto_indices
from spoc_tui.tune.optuna_compat import RandomState, nsga2_children

Params = dict[str, Any]


class Observation:
    __slots__ = ("feasible", "params", "values")

    def __init__(self, params: Params, feasible: bool, values: Sequence[float] | None) -> None:
        self.params = params
        self.feasible = feasible
        self.values = values


def observations(study: Any, objective_names: Sequence[str]) -> list[Observation]:
    """Trials that ran to a verdict: objective values (SLA met or not), or a failed start."""
    out = []
    for t in study.get_trials(deepcopy=False):
        status = t.user_attrs.get("status")
        if status not in RAN or not t.params or t.user_attrs.get("repeat_of") is not None:
            continue
        objs = t.user_attrs.get("objectives") or {}
        values = [objs.get(n) for n in objective_names]
        finite = [float(v) for v in values if v is not None and math.isfinite(v)]
        ok_values = finite if len(finite) == len(values) else None
        out.append(Observation(dict(t.params), bool(t.user_attrs.get("feasible")), ok_values))
    return out


class Surrogate:
    """Nearest-neighbour estimate of feasibility and objectives (objectives as minimisation)."""

    def __init__(
        self, obs: Sequence[Observation], distributions: dict[str, Any], directions: Sequence[str], k: int = 4
    ) -> None:
        self.obs = list(obs)
        self.dists = distributions
        self.k = k
        self.sign = np.array([-1.0 if d == "max" else 1.0 for d in directions])
        valued = [o for o in self.obs if o.values is not None]
        if valued:
            ys = np.array([o.values for o in valued]) * self.sign
            self.lo, self.hi = ys.min(axis=0), ys.max(axis=0)
        else:
            self.lo = self.hi = np.zeros(len(directions))
        span = np.where(self.hi - self.lo > 0, self.hi - self.lo, 1.0)
        self.span = span
        feas = [self.norm(o.values) for o in self.obs if o.feasible and o.values is not None]
        self.front = [feas[i] for i in pareto_indices(feas, ["min"] * len(directions))] if feas else []
        self.ref = tuple([1.1] * len(directions))
        self.front_hv = hypervolume(self.front, ["min"] * len(directions), self.ref) if self.front else 0.0

    def norm(self, values: Sequence[float]) -> tuple[float, ...]:
        return tuple(float(x) for x in (np.asarray(values) * self.sign - self.lo) / self.span)

    def distance(self, a: Params, b: Params) -> float:
        total = 0.0
        for name, d in self.dists.items():
            if name not in a or name not in b:
                continue
            x, y = a[name], b[name]
            if hasattr(d, "choices"):
                total += 0.0 if x == y else 1.0
            else:
                width = float(d.high - d.low) or 1.0
                total += ((float(x) - float(y)) / width) ** 2
        return math.sqrt(total / max(1, len(self.dists)))

    def score(self, params: Params, kappa: float = 1.0) -> float:
        """Optimistic value of running ``params``: the chance it is feasible times the hypervolume
        its optimistic objective estimate (estimate minus ``kappa`` x uncertainty) would add.

        The uncertainty is the spread of the neighbours' values plus the distance to the nearest
        trial, so a near-copy of a trial already run is rated at what that trial gave (nothing
        new), and configurations far from everything tried get the benefit of the doubt."""
        if not self.obs:
            return 0.0
        near = sorted(((self.distance(params, o.params), o) for o in self.obs), key=lambda x: x[0])[: self.k]
        d0 = near[0][0]
        weights = [1.0 / (d + 0.05) ** 2 for d, _ in near]
        # feasibility with a weak prior of 1/2 (weight of a neighbour at distance 0.45), so a corner
        # next to one failure is not written off for good
        prior_w = 4.0
        p = (sum(w for w, (_, o) in zip(weights, near, strict=True) if o.feasible) + 0.5 * prior_w) / (
            sum(weights) + prior_w
        )
        valued = [(w, self.norm(o.values)) for w, (_, o) in zip(weights, near, strict=True) if o.values is not None]
        if not valued:
            return p * (1.0 if not self.front else 0.0) + d0
        wsum = sum(w for w, _ in valued)
        y = np.array([sum(w * v[i] for w, v in valued) / wsum for i in range(len(self.sign))])
        spread = np.sqrt(
            np.array([sum(w * (v[i] - y[i]) ** 2 for w, v in valued) / wsum for i in range(len(self.sign))])
        )
        optimistic = tuple(float(x) for x in y - kappa * (spread + d0))
        return p * self._gain(optimistic)

    def _gain(self, y: tuple[float, ...]) -> float:
        """Hypervolume ``y`` adds to the front, or minus the distance by which it misses it."""
        dirs = ["min"] * len(y)
        if not self.front:
            return 1.0
        hv = hypervolume([*self.front, y], dirs, self.ref)
        if hv > self.front_hv + 1e-12:
            return hv - self.front_hv
        # additive epsilon: how much y must improve in every objective to be non-dominated
        return -min(max(max(yi - fi for yi, fi in zip(y, f, strict=True)), 0.0) for f in self.front)


class ScreenedChildren:
    """A child-generation strategy for :class:`optuna.samplers.NSGAIISampler`: breeds ``pool``
    children with NSGA-II's operators and returns the one the surrogate rates best.

    ``make_filter()`` returns, at each call, a test of whether a child may run (not a repeat of a
    trial run or running, no broken condition); children that may not are never chosen while
    another is available.
    """

    def __init__(
        self,
        *,
        seed: int | None,
        crossover: Any,
        objective_names: Sequence[str],
        directions: Sequence[str],
        make_filter: Callable[[], Callable[[Params], bool]],
        pool: int = 32,
        kappa: float = 1.0,
    ) -> None:
        self._rng = RandomState(seed)
        self._inner = nsga2_children(crossover, self._rng)
        self.objective_names = list(objective_names)
        self.directions = list(directions)
        self.make_filter = make_filter
        self.pool = pool
        self.kappa = kappa

    def _complete(self, child: Params, search_space: dict[str, Any]) -> Params:
        """Mutated parameters come back missing (Optuna would draw them at random): draw them here,
        so the candidate is whole when it is scored."""
        rng = self._rng.rng
        out = dict(child)
        for name, d in search_space.items():
            if name in out:
                continue
            if hasattr(d, "choices"):
                out[name] = d.choices[rng.randint(len(d.choices))]
            else:
                step = getattr(d, "step", None) or 1
                out[name] = d.low + step * rng.randint(int((d.high - d.low) // step) + 1)
        return out

    def __call__(self, study: Any, search_space: dict[str, Any], parent_population: list[Any]) -> Params:
        if self.pool <= 1:  # plain NSGA-II
            return self._inner(study, search_space, parent_population)
        candidates: list[Params] = []
        keys: set[tuple[Any, ...]] = set()
        acceptable = self.make_filter()
        for _ in range(self.pool * 3):
            c = self._complete(self._inner(study, search_space, parent_population), search_space)
            k = tuple(sorted(c.items(), key=lambda x: x[0]))
            if k in keys:
                continue
            keys.add(k)
            if acceptable(c):
                candidates.append(c)
                if len(candidates) >= self.pool:
                    break
        if not candidates:  # the neighbourhood of the parents is exhausted: let the study skip it
            return self._complete(self._inner(study, search_space, parent_population), search_space)
        surrogate = Surrogate(observations(study, self.objective_names), search_space, self.directions)
        return max(candidates, key=lambda c: surrogate.score(c, self.kappa))
