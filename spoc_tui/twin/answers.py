"""How long the server's answers are, learned from answers some of which it was made to cut.

A measured ramp's profile asks each answer for at most ``max_tokens``; where the model would have
gone on, the server stops there (``finish_reason: length``) and the request's length says only
that the answer is at least that long. Taking those lengths as they are learns answers shorter
than the model's, and a prediction that caps them again at its own ``max_tokens`` cuts them twice:
the chatbot profile asks a median of 180 tokens of a model whose own median is about 180, so half
its answers are cut, and a twin taught from them as they were read E2E about 20 % short.

The Kaplan-Meier estimator takes each cut answer as what it is, a lower bound (the cut-off is the
profile's draw, independent of where the model would have stopped), and gives the distribution of
the lengths the model would have given; the twin keeps a sample of it (evenly spaced quantiles).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Learned:
    """A sample of answer lengths and what it rests on, in words."""

    lengths: tuple[int, ...]
    observed: int
    cut: int
    """Of the answers observed, those the server stopped at ``max_tokens`` (lower bounds)."""
    unknown: int
    """Of the answers observed, those whose request did not say whether it was cut (files from
    before 2026-11-30): taken as ended by the model."""
    beyond: float
    """The share of answers longer than the longest answer seen whole: the estimator cannot say
    how long they are, and the sample has them at the longest length observed (a lower bound)."""

    def text(self, source: str) -> str:
        """``412 answers of the ramp X, 198 cut at max_tokens (their lengths as lower bounds)``."""
        out = f"{self.observed} answers of {source}"
        if self.cut:
            out += f", {self.cut} cut at max_tokens (lower bounds: Kaplan-Meier)"
        if self.beyond > 0.005:
            out += f"; the longest {100 * self.beyond:.0f} % only known to be over {max(self.lengths)} tokens"
        if self.unknown:
            out += f"; {self.unknown} not saying whether they were cut, taken as whole"
        return out


def learned_lengths(observed: Sequence[tuple[int, bool | None]], keep: int) -> Learned:
    """A sample of at most ``keep`` answer lengths from ``observed`` ``(tokens, cut)`` pairs
    (``cut`` True: the server stopped it at ``max_tokens``; None: not known, taken as False):
    the Kaplan-Meier estimate of the lengths' distribution, read at evenly spaced quantiles.

    Raises: ValueError for no observation."""
    obs = sorted((int(n), bool(c)) for n, c in observed if n > 0)
    if not obs:
        raise ValueError("no answer to learn from")
    # Kaplan-Meier: at each length with answers ending whole there, survival falls by the share
    # of those still "at risk" (as long or longer) that end there; cut answers leave the risk set
    # without an ending (at the same length, endings count first: the convention)
    points: list[tuple[int, float]] = []  # (length, the share of answers that end at or before it)
    at_risk, survive, i = len(obs), 1.0, 0
    while i < len(obs):
        n = obs[i][0]
        ended = cut = 0
        while i < len(obs) and obs[i][0] == n:
            ended += not obs[i][1]
            cut += obs[i][1]
            i += 1
        if ended:
            survive *= 1 - ended / at_risk
            points.append((n, 1 - survive))
        at_risk -= ended + cut
    longest = obs[-1][0]
    k = max(1, min(keep, len(obs)))
    lengths = []
    j = 0
    for q in ((m + 0.5) / k for m in range(k)):
        while j < len(points) and points[j][1] < q - 1e-12:
            j += 1
        lengths.append(points[j][0] if j < len(points) else longest)
    return Learned(
        lengths=tuple(lengths),
        observed=len(obs),
        cut=sum(c for _, c in obs),
        unknown=sum(c is None for n, c in observed if n > 0),
        beyond=survive,
    )
