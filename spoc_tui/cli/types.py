"""Click parameter types shared by every command."""

from __future__ import annotations

import math
from typing import Any

import click


class FiniteFloat(click.ParamType[float]):
    """A float that is a number: ``nan``, ``inf`` and ``-inf`` (which Python's float() takes) are
    refused with a usage error instead of reaching the maths as a traceback or a silent NaN."""

    name = "float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, float) and math.isfinite(value):
            return value
        try:
            out = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(out):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return out


FINITE = FiniteFloat()
