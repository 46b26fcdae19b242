"""Click parameter types shared by every command."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import click

from spoc_tui.core.errors import InputError
from spoc_tui.core.traces.formats import FORMATS as TRACE_FORMATS

if TYPE_CHECKING:
    from spoc_tui.core.traces.read import TraceSource

F = TypeVar("F", bound=Callable[..., Any])


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


def selected_trace(
    trace_path: str | None,
    speed_spec: str | None,
    users_spec: str | None,
    rate_spec: str | None,
    trace_format: str | None,
    trace_filters: Sequence[str],
    trace_window: str | None,
    trace_max_rows: int | None,
    trace_think: str = "recorded",
) -> TraceSource | None:
    """The trace ``--trace`` and :func:`trace_selection`'s options pick, or None without
    ``--trace`` (``spoc ramp``, ``spoc twin predict``).

    Raises:
        InputError: ``--trace`` with ``--users`` or ``--rate``; a trace option without ``--trace``;
            the trace's own errors (no such file, a bad window...).
    """
    if trace_path is not None:
        if rate_spec is not None or users_spec is not None:
            raise InputError("--trace replays at speed multiples (--speed), not at --users or --rate")
        from spoc_tui.core.traces.read import trace_source  # read only when a trace is given (start-up)

        return trace_source(trace_path, trace_format, trace_filters, trace_window, trace_max_rows, trace_think)
    if speed_spec is not None or trace_window is not None or trace_max_rows is not None or trace_filters:
        raise InputError("--speed, --trace-window, --trace-max-rows and --trace-filter go with --trace FILE")
    if trace_think != "recorded":
        raise InputError("--trace-think goes with --trace FILE")
    if trace_format is not None:
        raise InputError("--trace-format goes with --trace FILE")
    return None


def trace_think_option(f: F) -> F:
    """``--trace-think``: whether a replay's speed also scales the time a turn waits after the
    answer it follows (``spoc ramp``, ``spoc twin predict``)."""
    return click.option(
        "--trace-think",
        type=click.Choice(["recorded", "scaled"]),
        default="recorded",
        show_default=True,
        help="A turn's wait after the answer it follows (an agent's tool, a user's thinking): as recorded at "
        "every --speed, or divided by it too.",
    )(f)


def trace_selection(*, filters: bool = True) -> Callable[[F], F]:
    """The options that pick a trace's rows, the same wherever a trace is replayed (``ramp``,
    ``tune``, ``plan``): ``--trace-format``, ``--trace-filter`` (unless ``filters`` is false),
    ``--trace-window`` and ``--trace-max-rows``."""

    def wrap(f: F) -> F:
        rows = "Replay at most this many rows of the window."
        f = click.option("--trace-max-rows", type=int, help=rows)(f)
        window = "START:LENGTH of the trace to replay (seconds or 10m:5m)."
        f = click.option("--trace-window", help=window)(f)
        if filters:
            keep = 'Keep rows whose column equals, "Model=GPT-4".'
            f = click.option("--trace-filter", "trace_filters", multiple=True, help=keep)(f)
        fmt = "The trace's format [default: detected]."
        return click.option("--trace-format", type=click.Choice(TRACE_FORMATS), help=fmt)(f)

    return wrap
