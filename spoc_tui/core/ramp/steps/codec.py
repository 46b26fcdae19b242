"""The result files' small readers: a number, a count, an interval, a decision from a dict."""

from __future__ import annotations

from collections.abc import Mapping

from spoc_tui.core.confidence import (
    Decision,
    Interval,
)

Json = Mapping[str, object]
"""A decoded JSON object as a reader receives it (values unchecked)."""


def json_float(d: Json, k: str) -> float | None:
    """``d[k]`` when it is a number (not a bool), else None: how every result reader takes a figure."""
    v = d.get(k)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def json_int(d: Json, k: str) -> int | None:
    """``d[k]`` as a whole number when it is a number (not a bool), else None."""
    v = d.get(k)
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _obj(v: object) -> Json:
    return v if isinstance(v, Mapping) else {}


def json_interval(v: object) -> Interval:
    """``[lo, hi]`` as written (a side null where it was not bounded) as an interval."""
    if isinstance(v, (list, tuple)) and len(v) == 2:
        lo, hi = v
        return (
            float(lo) if isinstance(lo, (int, float)) and not isinstance(lo, bool) else None,
            float(hi) if isinstance(hi, (int, float)) and not isinstance(hi, bool) else None,
        )
    return None, None


def _decision(v: object) -> Decision:
    if v == "meets":
        return "meets"
    return "breaks" if v == "breaks" else "inconclusive"
