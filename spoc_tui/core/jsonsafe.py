"""JSON has no NaN or infinity: turn them into null before writing."""

from __future__ import annotations

import math


def json_safe(obj: object) -> object:
    """A copy of ``obj`` with non-finite floats as None (dict keys as strings)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj
