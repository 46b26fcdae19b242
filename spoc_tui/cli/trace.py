"""``spoc trace stats|convert``: what a public traffic trace holds, and our own form of it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click

from spoc_tui.cli.options import default_option, file_option, json_option
from spoc_tui.core.traces.formats import FORMATS

F = TypeVar("F", bound=Callable[..., Any])


def _options(f: F) -> F:
    f = click.option(
        "--trace-filter",
        "filters",
        multiple=True,
        help='Keep rows whose column equals a value, e.g. "Model=GPT-4" (repeatable).',
    )(f)
    f = click.option("--trace-format", "fmt", type=click.Choice(FORMATS), help="The format [default: detected].")(f)
    return click.argument("path", type=click.Path(dir_okay=False))(f)


@click.group("trace")
def trace_cmd() -> None:
    """Public traffic traces (Mooncake, Bailian, BurstGPT, Azure, WEKA, or spoc's own JSONL)."""


@trace_cmd.command("stats")
@_options
@default_option("--speed", 1.0, "Say how long a replay at this speed takes.", type=float)
@json_option()
def stats_cmd(path: str, fmt: str | None, filters: tuple[str, ...], speed: float, as_json: bool) -> None:
    """Rows, span, arrival rate over time, burstiness, input and output lengths, prefix share,
    and how long a replay takes. Exit code 2 for a trace that cannot be read (the line is named)."""
    from spoc_tui.core.errors import InputError
    from spoc_tui.core.traces.read import parse_filters
    from spoc_tui.core.traces.stats import stats_lines, trace_stats

    if not 0 < speed < float("inf"):
        raise InputError("--speed must be a number above 0")
    st = trace_stats(Path(path), fmt, parse_filters(filters))  # type: ignore[arg-type]
    if as_json:
        click.echo(json.dumps({**st.as_dict(), "speed": speed, "replay_s": st.replay_s(speed)}, indent=2))
        return
    lines = stats_lines(Path(path).name, st, speed)
    click.echo("\n".join(lines))


@trace_cmd.command("convert")
@_options
@file_option("--out", "out", "The JSONL file to write.", required=True)
def convert_cmd(path: str, fmt: str | None, filters: tuple[str, ...], out: str) -> None:
    """Write the trace in spoc's own JSONL (docs/traces.md), the rows to send only; the file
    appears whole or not at all."""
    from spoc_tui.core.errors import InputError
    from spoc_tui.core.files import write_atomic
    from spoc_tui.core.traces.read import TraceRead, parse_filters, read_trace, write_spoc

    read = TraceRead()
    n = 0

    def rows(f: TextIO) -> None:
        nonlocal n
        n = write_spoc(read_trace(Path(path), fmt, parse_filters(filters), read), f)  # type: ignore[arg-type]

    try:
        write_atomic(out, rows)
    except OSError as e:
        raise InputError(f"--out {out}: cannot write there ({e.strerror or e})") from None
    skipped = "; ".join(f"{k} {why}" for why, k in sorted(read.skipped.items()))
    click.echo(f"wrote {n:,} rows to {out}" + (f" (skipped {skipped})" if skipped else ""))
