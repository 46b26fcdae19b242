"""A study's policies, as functions of what it measured: the calibration's reference load, early
stopping of a clearly dominated trial, and the configuration the KV cache suggests. The study
(:class:`~spoc_tui.tune.study.TuneSession`) applies them; they touch no storage."""

from __future__ import annotations

from collections.abc import Sequence

from spoc_tui.core.ramp.knee import Knee, reference_load
from spoc_tui.core.ramp.steps import StepSummary
from spoc_tui.core.tuning.noisyfront import dominated_by_front
from spoc_tui.core.tuning.space import Config, Objective, Space, objective_interval, objective_value
from spoc_tui.tune.records import Front, config_key


def calibration(steps: Sequence[StepSummary]) -> tuple[int, str]:
    """The reference load a calibration's steps found and why, in words: the fewest users at which
    the configuration reaches 90 % of its best output tokens/s (:func:`reference_load`), or the
    first level when every step clearly broke the SLA."""
    found = reference_load(steps)
    if found is None:
        ref = min((s.users for s in steps), default=1)
        return ref, f"clearly breaks the SLA from {ref} user(s) on"
    ref, why = found
    top = max((s.users for s in steps), default=0)
    last = steps[-1] if steps else None
    if last is not None and ref == top and last.decision != "breaks":
        why += (
            f"; tokens/s still grew at {top} users, the most the calibration tries: the server is not "
            "saturated (raise --users auto:MAX, or use a profile with less think time)"
        )
    return ref, why


def dominated(objectives: Sequence[Objective], front: Front, step: StepSummary) -> str | None:
    """Why the reference step measured so far is clearly dominated, or None: its interval box
    (each objective's 95 % interval over the window so far) lies wholly beyond a confirmed front
    member's pessimistic corner."""
    lo, hi = [], []
    for o in objectives:
        v = objective_value(o, [step], Knee(None, None, None), None)
        ci, _ = objective_interval(o, [step], Knee(None, None, None), None)
        if v is None or ci[0] is None or ci[1] is None:
            return None
        lo.append(float(ci[0]))
        hi.append(float(ci[1]))
    estimates = [e for e in front.estimates if e.status == "confirmed"]
    by = dominated_by_front(lo, hi, estimates, [o.direction for o in objectives])
    if by is None:
        return None
    m = next((m for m in front.members if config_key(m.record.config) == by.key), None)
    who = f"trial {m.record.number}" if m else "a confirmed front member"
    return f"clearly dominated by {who} ({step.requests} requests so far)"


def kv_seed(space: Space, kv_tokens: int, tokens_per_request: float) -> tuple[Config, int | float, float, str]:
    """The configuration whose max-num-seqs is what the KV cache holds (the space's defaults
    otherwise): (config, the max-num-seqs picked, sequences that fit, the reckoning in words)."""
    fits = kv_tokens / tokens_per_request
    values = sorted(v for v in space.param("max-num-seqs").values if isinstance(v, (int, float)))
    pick = max([v for v in values if v <= fits] or values[:1])
    config = {**space.defaults(), "max-num-seqs": pick}
    what = f"KV cache: {kv_tokens} tokens / {tokens_per_request:.0f} per request = {fits:.0f} sequences"
    return config, pick, fits, what
