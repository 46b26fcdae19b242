"""Pareto front and hypervolume for two objectives (the maths of tuning studies).

Directions are ``"max"`` or ``"min"`` per objective. Internally everything is turned into
minimisation; hypervolume is the area dominated by the front up to a reference point.
"""

from __future__ import annotations

from collections.abc import Sequence

Point = tuple[float, float]


def _to_min(p: Sequence[float], directions: Sequence[str]) -> Point:
    if len(p) != 2 or len(directions) != 2:
        raise ValueError("two objectives and two directions expected")
    for d in directions:
        if d not in ("min", "max"):
            raise ValueError(f"direction must be 'min' or 'max', got {d!r}")
    return (p[0] if directions[0] == "min" else -p[0], p[1] if directions[1] == "min" else -p[1])


def dominates(a: Point, b: Point) -> bool:
    """``a`` dominates ``b`` (both minimised): no worse in both, better in one."""
    return a[0] <= b[0] and a[1] <= b[1] and (a[0] < b[0] or a[1] < b[1])


def pareto_indices(points: Sequence[Sequence[float]], directions: Sequence[str]) -> list[int]:
    """Indices of the non-dominated points, in input order (duplicates all kept)."""
    mins = [_to_min(p, directions) for p in points]
    return [i for i, p in enumerate(mins) if not any(dominates(q, p) for j, q in enumerate(mins) if j != i)]


def hypervolume(points: Sequence[Sequence[float]], directions: Sequence[str], reference: Sequence[float]) -> float:
    """Area dominated by ``points`` and bounded by ``reference`` (a point worse than all).

    Points that do not improve on the reference in both objectives add nothing.
    """
    ref = _to_min(reference, directions)
    pts = sorted({_to_min(p, directions) for p in points if all(c == c for c in p)})
    pts = [p for p in pts if p[0] < ref[0] and p[1] < ref[1]]
    area = 0.0
    best_y = ref[1]
    for x, y in pts:  # ascending x: each point adds the strip below the best y so far
        if y < best_y:
            area += (ref[0] - x) * (best_y - y)
            best_y = y
    return area
