"""JSON has no NaN or infinity: turn them into null before writing."""

from __future__ import annotations

import math
from typing import TypeGuard


def finite_number(v: object) -> TypeGuard[int | float]:
    """A JSON or TOML number a reader can compute with: an int or a finite float, not a bool."""
    return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and math.isfinite(v))


def json_safe(obj: object) -> object:
    """A copy of ``obj`` with non-finite floats as None (dict keys as strings)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
