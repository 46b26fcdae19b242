"""Fitting the twin's step time: non-negative least squares on relative error, over every probe's
observations at once, with a bootstrap by probe for each coefficient's spread.

Each observation is a measured time with its row of the design (:data:`~spoc_tui.twin.model.COEFFS`):

- ``prefill``: a prompt's TTFT alone on the server, from the client: its prefill steps' rows
  summed, plus the request's time outside the engine (a0, a_prompt);
- ``server_prefill``: the same prompt's prefill as the server timed it (``request_prefill_time``
  from /metrics): the steps alone, which separates the time outside the engine from b_prefill;
- ``decode``: the median gap between tokens while a batch of B sequences decodes (no prefill);
- ``shared``: the same, with prompts sharing a cached prefix (the context read again in the same
  blocks: ``b_shared``'s column, negative, as the coefficient is a saving);
- ``mixed``: the decoders' gap that holds a new prompt's prefill (what a prefill adds to a step).

The ridge (:data:`~spoc_tui.twin.model.RIDGES`, prompt tokens a step computes inside its fixed
cost) is not linear: each solve tries every ridge, with the prefill column rebuilt from the
observation's steps (:attr:`Observation.steps`), and keeps the one with the least weighted error;
a ridge above 0 must cut that error by :data:`RIDGE_GAIN` (else a CPU server's noise would buy
one). Each bootstrap resample searches it again, so its spread is in the draws.

Relative error (each row weighted by 1/y) because the times span three orders of magnitude and
a 1 ms decode gap matters as much as a 1 s prefill. The bootstrap resamples whole probes (a probe's
observations share its moment on the server), so the spread carries the server's drift between
probes as well as the noise within one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from spoc_tui.twin.model import COEFFS, RIDGES, Residuals, StepModel, TwinError, past_ridge, takes_time

KINDS = ("prefill", "server_prefill", "decode", "shared", "mixed")
BOOTSTRAP = 200
KEEP_DRAWS = 32
"""Draws kept in twin.json: a prediction runs once per draw (its interval is their spread)."""
RIDGE_GAIN = 0.10
"""A ridge above 0 is kept only where it cuts the fit's weighted squared error by this share."""
PREFILL = COEFFS.index("b_prefill")


@dataclass(frozen=True, slots=True)
class Observation:
    kind: str
    probe: int
    """Which probe it came from (the bootstrap's unit)."""
    x: tuple[float, ...]
    """The design row, one value per coefficient of :data:`COEFFS`."""
    y: float
    """Seconds measured."""
    steps: tuple[tuple[float, float, float], ...] = ()
    """The steps whose prompt tokens the row's prefill column sums, for the ridge: (how many such
    steps, prompt tokens in each, decodes beside them). Empty: the column as given."""

    def at_ridge(self, ridge: float) -> Observation:
        """The observation with its prefill column counted past ``ridge``."""
        if not self.steps:
            return self
        col = sum(k * past_ridge(n, int(d), ridge) for k, n, d in self.steps)
        return replace(self, x=(*self.x[:PREFILL], col, *self.x[PREFILL + 1 :]))


def nnls(a: np.ndarray, b: np.ndarray, max_iter: int = 200, support: np.ndarray | None = None) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson and Hanson's active set method), on the normal
    equations: ``a``'s Gram matrix is formed once and each passive set's least squares is a solve
    of a few columns of it (as SciPy's ``nnls`` does since 1.12), where an SVD of ``a``'s columns
    each time made a calibration's bootstrap seconds of CPU.

    ``support``: a guess of the columns above zero (a fit of rows like these: the bootstrap's
    resamples start from the whole fit's). Where the least squares on those columns is positive
    and no other column would lower the error (the optimum's conditions), it is the answer, in
    one solve; else the search starts from nothing, as without a guess."""
    m, n = a.shape
    gram = a.T @ a
    atb = a.T @ b
    tol = 1e-12 * max(1.0, float(np.abs(a).max(initial=0.0))) * max(m, n)
    if support is not None and support.any():
        idx = np.flatnonzero(support)
        z = np.zeros(n)
        z[idx] = _least_squares(gram[np.ix_(idx, idx)], atb[idx])
        if (z[idx] > 0).all() and (atb - gram @ z)[~support].max(initial=-np.inf) <= tol:
            return z
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = atb.copy()
    for _ in range(max_iter):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            idx = np.flatnonzero(passive)
            z[idx] = _least_squares(gram[np.ix_(idx, idx)], atb[idx])
            if (z[idx] > 0).all():
                x = z
                break
            neg = idx[z[idx] <= 0]
            alpha = np.min(x[neg] / np.maximum(x[neg] - z[neg], 1e-300))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
            if not passive.any():
                break
        w = atb - gram @ x
    return x


def _least_squares(gram: np.ndarray, atb: np.ndarray) -> np.ndarray:
    """The least-squares coefficients from the normal equations, by SVD: columns that are nearly
    one another's multiples (a calibration's mixed steps beside its decodes) get the minimum-norm
    answer, as ``lstsq`` on the columns gave, where a plain solve returned NaN."""
    out: np.ndarray = np.linalg.lstsq(gram, atb, rcond=None)[0]
    return out


def _solve(x: np.ndarray, y: np.ndarray, free: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """The relative-error NNLS of ``y`` on the design rows ``x`` over the columns ``free`` (the
    others held at zero); ``start``: the coefficients guessed above zero (:func:`nnls`)."""
    w = 1.0 / np.maximum(y, 2e-4)  # a time under 0.2 ms is a client's artefact, not a step: never dominant
    # columns scaled to unit size so the active set's tolerance means the same for each
    cols = np.flatnonzero(free & (np.abs(x).max(axis=0) > 0))  # a resample may lack a kind: held at 0
    a = x[:, cols] * w[:, None]
    scale = np.maximum(np.abs(a).max(axis=0), 1e-300)
    coef = nnls(a / scale, y * w, support=None if start is None else start[cols]) / scale
    out = np.zeros(len(COEFFS))
    out[cols] = coef
    return out


def _weighted_sse(x: np.ndarray, y: np.ndarray, coef: np.ndarray) -> float:
    r = (x @ coef - y) / np.maximum(y, 2e-4)
    return float(r @ r)


def _designs(obs: Sequence[Observation]) -> list[np.ndarray]:
    """The observations' design rows at each ridge of :data:`RIDGES` (the first, 0: the columns
    as given); one set when no observation has a prefill column to count past a ridge. Built once
    a fit: the bootstrap's resamples take their rows (it rebuilt them for every resample, most of
    a calibration's fitting time)."""
    given = np.array([o.x for o in obs], dtype=float)
    if not any(o.steps for o in obs):
        return [given]
    return [given, *(np.array([o.at_ridge(r).x for o in obs], dtype=float) for r in RIDGES[1:])]


def _solve_each(
    xs: Sequence[np.ndarray], y: np.ndarray, free: np.ndarray, starts: Sequence[np.ndarray] | None = None
) -> list[np.ndarray]:
    """The fit at each ridge's rows (:func:`_designs`); ``starts``: each one's coefficients
    guessed above zero (a resample's: the whole fit's at that ridge)."""
    return [_solve(x, y, free, None if starts is None else starts[i]) for i, x in enumerate(xs)]


def _best_ridge(xs: Sequence[np.ndarray], y: np.ndarray, coefs: Sequence[np.ndarray]) -> tuple[np.ndarray, float]:
    """Of the fits at each ridge of :data:`RIDGES` (:func:`_solve_each` over the rows
    :func:`_designs` made), the best: (coefficients, ridge), the ridge 0 unless another cuts the
    error by :data:`RIDGE_GAIN`."""
    if len(xs) == 1:
        return coefs[0], 0.0
    base = _weighted_sse(xs[0], y, coefs[0])
    best = (base, coefs[0], 0.0)
    for ridge, x, coef in zip(RIDGES[1:], xs[1:], coefs[1:], strict=True):
        err = _weighted_sse(x, y, coef)
        if err < best[0] and err < (1 - RIDGE_GAIN) * base:
            best = (err, coef, ridge)
    return best[1], best[2]


def fit_step_model(
    obs: Sequence[Observation], seed: int = 0, bootstrap: int = BOOTSTRAP
) -> tuple[StepModel, StepModel, tuple[StepModel, ...], tuple[Residuals, ...], list[str]]:
    """The fit, each coefficient's bootstrap SD, the kept draws, the residuals by kind, and notes.

    A coefficient no observation can tell apart (its column all zero: no mixed probe ran, no
    prompt long enough for attention to show) is held at zero and said in the notes.

    Raises:
        TwinError: too few observations, or none of a kind the fit cannot do without.
    """
    kinds = {o.kind for o in obs}
    if "decode" not in kinds or not kinds & {"prefill", "server_prefill"}:
        raise TwinError("too few probes finished to fit a step time (decodes and prefills are both needed)")
    if len(obs) < len(COEFFS) + 2:
        raise TwinError(f"too few observations to fit a step time ({len(obs)}; at least {len(COEFFS) + 2})")
    if any(len(o.x) != len(COEFFS) for o in obs):
        raise ValueError(f"an observation's row is not {len(COEFFS)} wide (design_row builds one)")
    x = np.array([o.x for o in obs], dtype=float)
    free = np.abs(x).max(axis=0) > 0
    notes = [f"{COEFFS[i]} not measured (no probe exercised it): held at 0" for i in range(len(COEFFS)) if not free[i]]
    xs = _designs(obs)
    y_all = np.array([o.y for o in obs], dtype=float)
    each = _solve_each(xs, y_all, free)
    best, ridge = _best_ridge(xs, y_all, each)
    starts = [c > 0 for c in each]  # each resample's search starts from the whole fit's columns
    probes = sorted({o.probe for o in obs})
    by_probe: dict[int, list[int]] = {p: [] for p in probes}
    for i, o in enumerate(obs):
        by_probe[o.probe].append(i)
    if not takes_time(StepModel.from_vector([*best.tolist(), ridge])):
        raise TwinError(
            "the probes' steps fit to no time at all (b0 and every per-token cost 0): the host's speed "
            "moved too much while they ran; calibrate again on a quieter host"
        )
    rng = np.random.default_rng(seed)
    boots = []
    timeless = 0
    for _ in range(bootstrap):
        pick = rng.choice(len(probes), size=len(probes), replace=True)
        rows = [i for k in pick for i in by_probe[probes[k]]]
        kinds_in = {obs[i].kind for i in rows}
        if "decode" in kinds_in and kinds_in & {"prefill", "server_prefill"}:
            sub, ys = [x[rows] for x in xs], y_all[rows]
            coef, r = _best_ridge(sub, ys, _solve_each(sub, ys, free, starts))
            if not takes_time(StepModel.from_vector([*coef.tolist(), r])):
                timeless += 1  # a resample of a noisy host's probes fit to no time: no model of a step
                continue
            boots.append(np.append(coef, r))
    if timeless:
        notes.append(f"{timeless} of {bootstrap} bootstrap resamples fit a step to no time and were left out")
    if len(boots) < 10:
        raise TwinError(
            "the probes are too few to say how sure the fit is (the bootstrap found too few usable resamples)"
        )
    arr = np.array(boots)
    sd = arr.std(axis=0, ddof=1)
    keep = arr[np.linspace(0, len(arr) - 1, min(KEEP_DRAWS, len(arr))).astype(int)]
    x = np.array([o.at_ridge(ridge).x for o in obs], dtype=float)
    pred = x @ best
    y = np.array([o.y for o in obs])
    rel = np.abs(pred - y) / np.maximum(y, 1e-9) * 100
    residuals = []
    for k in KINDS:
        m = np.array([o.kind == k for o in obs])
        if m.any():
            residuals.append(Residuals(k, int(m.sum()), float(np.median(rel[m])), float(rel[m].max())))
    return (
        StepModel.from_vector([*best.tolist(), ridge]),
        StepModel.from_vector(sd.tolist()),
        tuple(StepModel.from_vector(r.tolist()) for r in keep),
        tuple(residuals),
        notes,
    )
