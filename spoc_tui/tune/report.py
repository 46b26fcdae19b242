"""How a study's figures read, in words: one place for the CLI and the Tune screen."""

from __future__ import annotations

from spoc_tui.core import fmt
from spoc_tui.core.tuning.docs import TrialRecord
from spoc_tui.core.tuning.space import Objective
from spoc_tui.tune.records import Front, FrontMember


def value_text(o: Objective, v: float | None) -> str:
    if v is None:
        return "-"
    if o.is_latency:
        return fmt.seconds(v)
    if o.name == "knee_users":
        return f"{v:.0f} users"
    return f"{v:,.1f}" if v < 100 else f"{v:,.0f}"


def objectives_text(objectives: tuple[Objective, ...] | list[Objective], r: TrialRecord, sep: str = ", ") -> str:
    """``LABEL VALUE`` for each objective of a trial."""
    return sep.join(f"{o.label} {value_text(o, r.objectives.get(o.name))}" for o in objectives)


def hypervolume_text(front: Front) -> str:
    return f"{front.hypervolume:.4g}"


def pooled_text(o: Objective, m: FrontMember, i: int) -> str:
    """``VALUE [LO, HI]``: a front member's pooled value of objective ``i`` and its interval."""
    return f"{value_text(o, m.values[i])} [{value_text(o, m.ci95[i][0])}, {value_text(o, m.ci95[i][1])}]"


def member_text(objectives: tuple[Objective, ...] | list[Objective], m: FrontMember, sep: str = "  ") -> str:
    """``LABEL VALUE [LO, HI]`` for each objective of a front member (its runs pooled)."""
    return sep.join(f"{o.label} {pooled_text(o, m, i)}" for i, o in enumerate(objectives))


def member_tag(m: FrontMember) -> str:
    """``confirmed, 2 runs`` / ``provisional, 1 run``."""
    return f"{m.status}, {m.runs} run{'s' if m.runs != 1 else ''}"
