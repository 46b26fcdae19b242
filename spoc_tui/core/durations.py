"""Durations as the flags take them: ``10m``, ``90s``, ``1.5h``, ``2min`` or plain seconds."""

from __future__ import annotations

import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*$", re.IGNORECASE)
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def duration_s(text: str) -> float:
    """``text`` in seconds.

    Raises:
        ValueError: not a duration of those forms.
    """
    m = _DURATION.match(text)
    if not m:
        raise ValueError(text)
    return float(m.group(1)) * _UNIT[(m.group(2) or "").lower()]
