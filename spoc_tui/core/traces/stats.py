"""A trace's statistics (``spoc trace stats``, the Load screen's trace panel): its rate over
time, how bursty, its lengths and prefix share, an agent trace's sessions, read in one streamed
pass over its rows (:mod:`spoc_tui.core.traces.read` reads them)."""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from spoc_tui.core import fmt
from spoc_tui.core.textsafe import safe
from spoc_tui.core.traces.formats import TraceFormat
from spoc_tui.core.traces.read import TraceError, TraceRead, detect_format, read_trace
from spoc_tui.core.traces.replay import PREFIX_SEEN_CAP, _shared_tokens


@dataclass(frozen=True, slots=True)
class Lengths:
    p50: float
    p90: float
    p99: float
    mean: float
    max: int

    def as_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "mean": self.mean, "max": self.max}


@dataclass(frozen=True, slots=True)
class SessionStats:
    """An agent trace's structure (``otel``): its sessions, their calls, tools and branches."""

    sessions: int
    calls_p50: float
    calls_max: int
    tool_calls: int
    """``execute_tool`` spans in the file."""
    agents: int
    """``invoke_agent`` spans (a sub-agent's branch each, or a top-level agent)."""
    branches: int
    """Calls that start a branch beside another following the same call (sub-agents in parallel)."""
    gap_s_p50: float | None
    """Median time between a call's end and the next call of its agent (tools, the agent's own work)."""
    growth_p50: float | None
    """Median input tokens a call adds to the call it follows (the answer, the tool's result, more)."""
    cache_read_tokens: int
    spellings: tuple[str, ...]
    """Attribute names of older releases the file used."""
    lacks: tuple[str, ...]
    left_out: tuple[tuple[str, str], ...] = ()
    """(why, the first model call left out for it), as ``spoc trace stats`` names them."""

    def as_dict(self) -> dict[str, object]:
        return {
            "sessions": self.sessions,
            "calls_p50": self.calls_p50,
            "calls_max": self.calls_max,
            "tool_calls": self.tool_calls,
            "agents": self.agents,
            "branches": self.branches,
            "gap_s_p50": self.gap_s_p50,
            "growth_p50": self.growth_p50,
            "cache_read_tokens": self.cache_read_tokens,
            "older_attribute_names": list(self.spellings),
            "lacks": list(self.lacks),
            "left_out": dict(self.left_out),
        }

    def lines(self) -> list[str]:
        gap = "n/a" if self.gap_s_p50 is None else f"{self.gap_s_p50:.3g} s"
        growth = "n/a" if self.growth_p50 is None else f"{self.growth_p50:,.0f} tokens"
        out = [
            f"  sessions {self.sessions:,}: {self.calls_p50:.3g} model calls each (median; at most {self.calls_max}), "
            f"{self.tool_calls:,} tool calls, {self.agents:,} agent invocations, {self.branches:,} parallel branches",
            f"  between a call and the next of its agent {gap} (median); each call's context grows by {growth}",
        ]
        if self.cache_read_tokens:
            out.append(f"  cache-read input tokens {self.cache_read_tokens:,}")
        if self.spellings:
            out.append(f"  older attribute names read: {', '.join(self.spellings)}")
        out += [f"  left out: {why}, the first {first}" for why, first in self.left_out]
        if self.lacks:
            out.append(f"  the file lacks: {'; '.join(self.lacks)}")
        return out


@dataclass(frozen=True, slots=True)
class TraceStats:
    """What a trace holds (``spoc trace stats``)."""

    format: TraceFormat
    rows: int
    """Rows kept (to be sent)."""
    read: int
    """Data rows read."""
    skipped: tuple[tuple[str, int], ...]
    """Rows not to be sent, by reason."""
    span_s: float
    rate_per_s: float
    """Mean arrival rate over the span."""
    peak_to_mean: float
    """The busiest :attr:`bin_s` bin's rate over the mean."""
    bin_s: float
    arrivals: tuple[int, ...]
    """Rows per bin, over the span."""
    input_tokens: Lengths
    output_tokens: Lengths
    prefix_share: float | None
    """Share of input tokens in hash blocks an earlier row already had (what a prefix cache of
    unbounded size could serve); None without hash ids."""
    conversations: int | None
    sessions: SessionStats | None = None
    """An agent trace's structure (``otel``); None for the other formats."""

    def replay_s(self, speed: float) -> float:
        """How long a replay at ``speed`` takes."""
        return self.span_s / speed

    def as_dict(self) -> dict[str, object]:
        return {
            "format": self.format,
            "rows": self.rows,
            "read": self.read,
            "skipped": dict(self.skipped),
            "span_s": self.span_s,
            "rate_per_s": self.rate_per_s,
            "peak_to_mean": self.peak_to_mean,
            "bin_s": self.bin_s,
            "arrivals": list(self.arrivals),
            "input_tokens": self.input_tokens.as_dict(),
            "output_tokens": self.output_tokens.as_dict(),
            "prefix_share": self.prefix_share,
            "conversations": self.conversations,
            **({"sessions": self.sessions.as_dict()} if self.sessions is not None else {}),
        }


BINS = 60
"""Arrival-rate bins over the span (the terminal plot's width)."""


def trace_stats(path: Path, fmt: TraceFormat | None = None, filters: Sequence[tuple[str, str]] = ()) -> TraceStats:
    """Read the whole trace once (streamed) and describe it.

    Raises:
        TraceError: as :func:`read_trace`; a trace with no row to send.
    """
    import numpy as np

    fmt = fmt or detect_format(path)
    read = TraceRead()
    # compact arrays, not lists of Python numbers: 16 bytes a row (a 5-million-row trace: 80 MB)
    times = array("d")
    n_in = array("l")
    n_out = array("l")
    seen: set[int] = set()
    shared = total = 0
    with_ids = False
    convs: set[str] = set()
    agent = fmt == "otel"
    calls: Counter[str] = Counter()
    children: Counter[str] = Counter()
    inputs: dict[str, int] = {}
    gaps: list[float] = []
    growth: list[float] = []
    for row in read_trace(path, fmt, filters, read):
        if agent:
            calls[row.conversation or ""] += 1
            if row.id is not None:
                inputs[row.id] = row.input_tokens
            if row.parent is not None:
                children[row.parent] += 1
                if row.think_s is not None:
                    gaps.append(row.think_s)
                if row.parent in inputs:
                    growth.append(row.input_tokens - inputs[row.parent])
        times.append(row.t)
        n_in.append(row.input_tokens)
        n_out.append(row.output_tokens)
        if row.conversation is not None:
            convs.add(row.conversation.split("#")[0])
        if row.hash_ids and len(seen) < PREFIX_SEEN_CAP:  # WEKA's ids are per conversation (its scope)
            with_ids = True
            shared += _shared_tokens(row, seen)
            total += row.input_tokens
    if not times:
        why = f" ({', '.join(f'{n} {k}' for k, n in read.skipped.items())})" if read.skipped else ""
        raise TraceError(f"{path.name}: no row to send{why}")
    span = max(times) - min(times)
    bin_s = span / BINS if span > 0 else 1.0
    counts = np.bincount(np.minimum((np.asarray(times) / bin_s).astype(int), BINS - 1), minlength=BINS if span else 1)
    mean_rate = len(times) / span if span > 0 else float(len(times))
    peak = float(counts.max()) / bin_s

    def lengths(v: array[int]) -> Lengths:
        a = np.asarray(v, dtype=float)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return Lengths(float(p50), float(p90), float(p99), float(a.mean()), int(a.max()))

    sessions = None
    if agent and read.otel is not None:
        o = read.otel
        sessions = SessionStats(
            len(calls),
            float(np.median(list(calls.values()))),
            max(calls.values()),
            o.tools,
            o.agents,
            sum(n - 1 for n in children.values() if n > 1),
            float(np.median(gaps)) if gaps else None,
            float(np.median(growth)) if growth else None,
            o.cache_read_tokens,
            tuple(o.spellings()),
            tuple(o.lacks()),
            tuple(sorted(o.left_out.items())),
        )
    return TraceStats(
        fmt,
        len(times),
        read.rows,
        tuple(sorted(read.skipped.items())),
        span,
        mean_rate,
        peak / mean_rate if mean_rate else 1.0,
        bin_s,
        tuple(int(c) for c in counts),
        lengths(n_in),
        lengths(n_out),
        shared / total if with_ids and total else None,
        len(convs) if convs else None,
        sessions,
    )


def stats_lines(name: str, st: TraceStats, speed: float = 1.0, ascii_only: bool = False) -> list[str]:
    """``spoc trace stats``'s description (the Load screen shows the same): rows, skips, span and
    burstiness, arrivals over time as a one-line plot, lengths, prefix share, replay time."""
    spark = fmt.sparkline(list(st.arrivals), marks=fmt.SPARK_ASCII if ascii_only else fmt.SPARK)
    lines = [
        f"{name}: {st.format} trace, {st.rows:,} rows to send of {st.read:,} read",
        *(f"  skipped {n:,}: {why}" for why, n in st.skipped),
        f"  span {st.span_s:,.1f} s; {st.rate_per_s:.3g} requests/s on average, the busiest "
        f"{st.bin_s:.3g} s at {st.peak_to_mean:.1f}x that",
        f"  arrivals |{spark}|",
        "  input tokens  p50 {p50:,.0f}  p90 {p90:,.0f}  p99 {p99:,.0f}  mean {mean:,.0f}  max {max:,}".format(
            **st.input_tokens.as_dict()
        ),
        "  output tokens p50 {p50:,.0f}  p90 {p90:,.0f}  p99 {p99:,.0f}  mean {mean:,.0f}  max {max:,}".format(
            **st.output_tokens.as_dict()
        ),
    ]
    if st.prefix_share is not None:
        lines.append(f"  prefix share {st.prefix_share:.0%} of input tokens (blocks an earlier row already sent)")
    if st.conversations is not None and st.sessions is None:
        lines.append(f"  conversations {st.conversations:,}")
    if st.sessions is not None:
        lines += [safe(line) for line in st.sessions.lines()]
    lines.append(f"  a replay at {speed:g}x takes {st.replay_s(speed):,.0f} s")
    return lines
