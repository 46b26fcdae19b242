"""Agent traces as OpenTelemetry exports them (issue 53, item 1): OTLP JSON, the collector's file
exporter (one ``ExportTraceServiceRequest`` a line: ``resourceSpans`` -> ``scopeSpans`` ->
``spans``; or one such object in a file), read with the GenAI semantic conventions.

What becomes a row: each **model call** (``gen_ai.operation.name`` ``chat``, ``text_completion`` or
``generate_content``; a span of an older release without the name is read by its token usage),
with its input and output tokens. The structure around it:

- an **agent** is the nearest ``invoke_agent`` span above a call (the trace's root where there is
  none); within an agent the calls form a chain in start order: each follows the one before it,
  after the time between them (the tool's, recorded as the row's ``think_s``);
- a **sub-agent**'s first call follows the call of the invoking agent that ended last before the
  ``invoke_agent`` span began, so branches run in parallel as they did;
- each call's prompt extends the call it follows: its hash ids repeat that call's prompt blocks
  (``BLOCK`` tokens each) and add fresh ones for the answer, the tool's result and what is new,
  so a replay shows the server the same shared prefix;
- the session is ``gen_ai.conversation.id`` where the file has it, else the trace id.

The conventions are in development and renamed attributes between releases; each name is read
as every release spelled it (:data:`NAMES`), and :class:`OtelRead` says which spellings a file used
and what it lacks. A malformed span (attributes that are not a list, times that are not
integers, an end before its start, a loop of parent ids) is an error naming the file, the line
and the span; a call that failed (status ``ERROR``) or carries no token usage is skipped and
counted.
"""

from __future__ import annotations

import bisect
import json
import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from spoc_tui.core.traces.formats import BLOCK_TOKENS

AttrValue = str | int | float | bool | None
"""A span attribute's value (an array reads as its JSON text)."""

BLOCK = BLOCK_TOKENS["otel"]
"""Tokens one synthesised hash id stands for."""
MAX_SPANS = 2_000_000
"""The most spans one file may hold (an agent trace is read whole to rebuild its sessions)."""
MAX_BLOCKS = 4_000_000
"""The most prompt blocks a file's calls may name in all (256 million tokens at :data:`BLOCK` a
block): each call's prompt is a tuple of its blocks' ids."""
MODEL_OPS = frozenset({"chat", "text_completion", "generate_content"})
NAMES: dict[str, tuple[str, ...]] = {
    "operation": ("gen_ai.operation.name",),
    "input_tokens": ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
    "output_tokens": ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
    "cache_read": (
        "gen_ai.usage.cache_read.input_tokens",
        "gen_ai.usage.cache_read_input_tokens",
        "gen_ai.usage.input_tokens.cached",
    ),
    "model": ("gen_ai.request.model", "gen_ai.response.model"),
    "provider": ("gen_ai.provider.name", "gen_ai.system"),
    "conversation": ("gen_ai.conversation.id",),
}
"""Each figure's attribute names, newest first (``gen_ai.system`` became ``gen_ai.provider.name``
in 1.37; ``prompt_tokens``/``completion_tokens`` became ``input_tokens``/``output_tokens`` after
1.26; the cache-read count has had three spellings)."""


@dataclass
class OtelRead:
    """What reading an OTLP file found, beyond its rows: the attribute spellings used, what the
    file lacks, and the session structure."""

    spans: int = 0
    calls: int = 0
    tools: int = 0
    agents: int = 0
    """``invoke_agent`` spans (sub-agents and top-level agents)."""
    names: Counter[str] = field(default_factory=Counter)
    """Attribute name -> model calls that used it."""
    skipped: Counter[str] = field(default_factory=Counter)
    left_out: dict[str, str] = field(default_factory=dict)
    """Each reason a model call was left out for, with the first call it left out (``span 'u1'
    (line 3)``)."""
    cache_read_tokens: int = 0

    def leave_out(self, why: str, s: _Span) -> None:
        self.skipped[why] += 1
        self.left_out.setdefault(why, f"span {s.id!r} (line {s.line})")

    def lacks(self) -> list[str]:
        """What the file does not hold that a replay or its figures could use."""
        out = []
        if self.calls and not any(self.names[n] for n in NAMES["conversation"]):
            out.append("gen_ai.conversation.id (sessions are its traces)")
        if self.calls and not self.tools:
            out.append("execute_tool spans (the time between calls is all the tools' and the agent's)")
        if self.calls and not any(self.names[n] for n in NAMES["cache_read"]):
            out.append("cache-read input tokens")
        if self.calls and not any(self.names[n] for n in NAMES["operation"]):
            out.append("gen_ai.operation.name (calls read by their token usage)")
        return out

    def spellings(self) -> list[str]:
        """The attribute names of older releases the file used."""
        return sorted(n for n in self.names if any(n in v[1:] for v in NAMES.values()))


@dataclass(frozen=True, slots=True)
class _Span:
    trace: str
    id: str
    parent: str
    start_ns: int
    end_ns: int
    attrs: Mapping[str, AttrValue]
    line: int
    error: bool

    @property
    def op(self) -> str | None:
        v = self.attrs.get("gen_ai.operation.name")
        return str(v) if v is not None else None


@dataclass(frozen=True, slots=True)
class Call:
    """A model call with its place in the session."""

    span: str
    trace: str
    start_s: float
    end_s: float
    input_tokens: int
    output_tokens: int
    line: int
    session: str
    agent: str
    follows: str | None
    """The call it follows (its predecessor in the agent, or the call that invoked its sub-agent)."""
    gap_s: float | None
    """Seconds between the end of the call it follows and its own start (a tool's, an agent's)."""
    turn: int
    attrs: Mapping[str, AttrValue]
    end_ns: int = 0
    """The span's own end (Unix nanoseconds): what an invoking span's start is compared with."""


def _value(v: object) -> AttrValue:
    """An OTLP ``AnyValue`` as a Python value (an array or a key-value list as its JSON text)."""
    if not isinstance(v, dict):
        return None
    if "stringValue" in v:
        return str(v["stringValue"])
    if "intValue" in v:
        x = v["intValue"]
        try:
            return int(x)  # int64 travels as a string in OTLP JSON
        except (TypeError, ValueError):
            return None
    if "doubleValue" in v:
        x = v["doubleValue"]
        return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v and isinstance(v["arrayValue"], dict):
        return json.dumps([_value(x) for x in v["arrayValue"].get("values") or []])
    return None


NS_MOST = 2**64 - 1
"""OTLP's times are fixed64 nanoseconds: at most 20 digits (a longer string or a superscript digit
raised out of ``int()`` or the float conversion after it: issue 74)."""


def _ns(v: object) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, str) and v.isascii() and v.isdigit() and len(v) <= 20:
        v = int(v)
    if isinstance(v, int) and 0 <= v <= NS_MOST:
        return v
    return None


def _first(attrs: Mapping[str, AttrValue], figure: str, read: OtelRead | None = None) -> AttrValue:
    for name in NAMES[figure]:
        if name in attrs:
            if read is not None:
                read.names[name] += 1
            return attrs[name]
    return None


def _spans(path: Path, objects: Iterator[tuple[int, object]], bad: type[Exception]) -> list[_Span]:
    out: list[_Span] = []
    for line, obj in objects:
        if not isinstance(obj, dict) or not isinstance(obj.get("resourceSpans"), list):
            raise bad(f"{path.name} line {line}: not an OTLP export (no resourceSpans list)")
        for rs in obj["resourceSpans"]:
            scopes = rs.get("scopeSpans", rs.get("instrumentationLibrarySpans")) if isinstance(rs, dict) else None
            if not isinstance(scopes, list):
                raise bad(f"{path.name} line {line}: resourceSpans without a scopeSpans list")
            for ss in scopes:
                spans = ss.get("spans") if isinstance(ss, dict) else None
                if not isinstance(spans, list):
                    raise bad(f"{path.name} line {line}: scopeSpans without a spans list")
                for sp in spans:
                    out.append(_span(path, line, sp, bad))
                    if len(out) > MAX_SPANS:
                        raise bad(f"{path.name}: more than {MAX_SPANS:,} spans: export a shorter window")
    return out


def _span(path: Path, line: int, sp: object, bad: type[Exception]) -> _Span:
    if not isinstance(sp, dict):
        raise bad(f"{path.name} line {line}: a span that is not an object")
    sid = sp.get("spanId")
    tid = sp.get("traceId")
    where = f"{path.name} line {line}: span {str(sid)[:40]!r}"
    if not isinstance(sid, str) or not sid or not isinstance(tid, str) or not tid:
        raise bad(f"{where}: traceId and spanId must be strings")
    start, end = _ns(sp.get("startTimeUnixNano")), _ns(sp.get("endTimeUnixNano"))
    if start is None or end is None:
        raise bad(f"{where}: startTimeUnixNano and endTimeUnixNano must be whole nanoseconds (at most 20 digits)")
    if end < start:
        raise bad(f"{where}: it ends ({end}) before it starts ({start})")
    raw = sp.get("attributes") or []
    if not isinstance(raw, list):
        raise bad(f"{where}: attributes must be a list of key/value pairs")
    attrs: dict[str, AttrValue] = {}
    for a in raw:
        if isinstance(a, dict) and isinstance(a.get("key"), str):
            attrs[a["key"]] = _value(a.get("value"))
    status = sp.get("status")
    error = isinstance(status, dict) and status.get("code") in (2, "STATUS_CODE_ERROR", "ERROR")
    parent = sp.get("parentSpanId") or ""
    return _Span(tid, sid, str(parent), start, end, attrs, line, error)


class _Tree:
    """A file's spans by (trace, id), each chain of parents checked to end at a root, and each
    span's agent remembered as it is found."""

    def __init__(self, path: Path, spans: list[_Span], read: OtelRead, bad: type[Exception]) -> None:
        by_id: dict[tuple[str, str], _Span] = {}
        for s in spans:  # a span exported twice (a retried export) is read once
            if by_id.setdefault((s.trace, s.id), s) is not s:
                read.leave_out("the same span exported twice", s)
        self.by_id = by_id
        self.spans = list(by_id.values()) if len(by_id) < len(spans) else spans
        # a call's id in the rows: its span id, or trace/span where another trace reuses the span
        # id (keyed by span id alone, reused ids linked the sessions of different traces: issue 74)
        traces_of = Counter(sid for _, sid in by_id)
        self.row_id = {k: (f"{k[0]}/{k[1]}" if traces_of[k[1]] > 1 else k[1]) for k in by_id}
        rooted: set[tuple[str, str]] = set()
        for s in self.spans:  # every chain of parents ends at a root (linear: a checked span is remembered)
            walked: set[tuple[str, str]] = set()
            cur: _Span | None = s
            while cur is not None and (cur.trace, cur.id) not in rooted:
                key = (cur.trace, cur.id)
                if key in walked:
                    raise bad(f"{path.name} line {cur.line}: span {cur.id!r}: its parentSpanId ids loop")
                walked.add(key)
                cur = by_id.get((cur.trace, cur.parent))
            rooted.update(walked)
        self._owners: dict[tuple[str, str], str] = {}
        """Each span walked: the nearest invoke_agent at or above it ("" for the trace's root)."""

    def agent_of(self, s: _Span) -> str:
        """The nearest invoke_agent above ``s`` (its own id), else the trace's root (every chain of
        parents ends, checked when built). Remembered on the way up: a 20,000-deep chain walked
        from each call took minutes (issue 74)."""
        cur = self.by_id.get((s.trace, s.parent))
        below: list[tuple[str, str]] = []
        found = ""
        while cur is not None:
            k = (cur.trace, cur.id)
            if k in self._owners:
                found = self._owners[k]
                break
            if cur.op == "invoke_agent":
                found = self._owners[k] = cur.id
                break
            below.append(k)
            cur = self.by_id.get((cur.trace, cur.parent))
        for k in below:
            self._owners[k] = found
        return found


def _model_calls(spans: list[_Span], read: OtelRead) -> list[_Span]:
    """The spans that are model calls to replay, in start order (failed ones and those without
    both token counts left out and counted); tools and agents counted."""
    calls: list[_Span] = []
    for s in spans:
        op = s.op
        if op == "execute_tool":
            read.tools += 1
        elif op == "invoke_agent":
            read.agents += 1
        has_in = any(n in s.attrs for n in NAMES["input_tokens"])
        has_out = any(n in s.attrs for n in NAMES["output_tokens"])
        if op in MODEL_OPS or (op is None and (has_in or has_out)):
            if s.error:
                read.leave_out("failed in the original (status ERROR)", s)
            elif not has_in and not has_out:
                read.leave_out("a model call with no token usage", s)
            elif not has_in or not has_out:
                read.leave_out(f"a model call without its {'input' if has_out else 'output'} tokens", s)
            else:
                calls.append(s)
    calls.sort(key=lambda s: (s.start_ns, s.end_ns))
    read.calls = len(calls)
    return calls


def read_calls(
    path: Path,
    objects: Iterator[tuple[int, object]],
    read: OtelRead,
    bad: type[Exception],
    max_tokens: int,
    max_gap_s: float,
) -> list[Call]:
    """The model calls of an OTLP file in start order, each with the call it follows.

    Raises:
        ``bad``: a malformed span or attribute, or a loop of parent ids (file, line, span named).
    """
    spans = _spans(path, objects, bad)
    read.spans = len(spans)
    tree = _Tree(path, spans, read, bad)
    by_id, agent_of = tree.by_id, tree.agent_of
    calls = _model_calls(tree.spans, read)
    chains: dict[tuple[str, str], list[Call]] = {}
    ends: dict[tuple[str, str], list[tuple[int, int]]] = {}
    """Each chain's calls by their end, (end_ns, -place): the last that ended before a sub-agent
    was invoked, found by bisection (a list scan per sub-agent took a minute for 20,000)."""
    out: list[Call] = []
    t0 = calls[0].start_ns if calls else 0
    for s in calls:
        where = f"{path.name} line {s.line}: span {s.id!r}"
        n_in = _tokens(_first(s.attrs, "input_tokens", read), "input tokens", where, bad, max_tokens)
        n_out = _tokens(_first(s.attrs, "output_tokens", read), "output tokens", where, bad, max_tokens)
        for figure in ("operation", "model", "provider"):
            _first(s.attrs, figure, read)
        cached = _first(s.attrs, "cache_read", read)
        if isinstance(cached, int) and cached > 0:
            read.cache_read_tokens += cached
        conv = _first(s.attrs, "conversation", read)
        agent = agent_of(s)
        chain = chains.setdefault((s.trace, agent), [])
        follows: Call | None = chain[-1] if chain else None
        if follows is None and agent:  # a sub-agent's first call: after the call that invoked it
            invoke = by_id[(s.trace, agent)]
            above = (s.trace, agent_of(invoke))
            ended = ends.get(above, [])
            i = bisect.bisect_right(ended, (invoke.start_ns, 1))  # the latest end, the first of a tie
            follows = chains[above][-ended[i - 1][1]] if i else None
        start_s, end_s = (s.start_ns - t0) / 1e9, (s.end_ns - t0) / 1e9
        gap = None if follows is None else max(0.0, start_s - follows.end_s)
        if gap is not None and gap > max_gap_s:
            raise bad(f"{where}: {gap:,.0f} s after the call it follows: at most {max_gap_s:,.0f}")
        session = str(conv) if conv is not None else (follows.session if follows else s.trace)
        call = Call(
            tree.row_id[(s.trace, s.id)],
            s.trace,
            start_s,
            end_s,
            n_in,
            n_out,
            s.line,
            session,
            agent,
            follows.span if follows else None,
            gap,
            len(chain),
            s.attrs,
            s.end_ns,
        )
        bisect.insort(ends.setdefault((s.trace, agent), []), (s.end_ns, -len(chain)))
        chain.append(call)
        out.append(call)
    blocks = sum(max(1, -(-c.input_tokens // BLOCK)) for c in out)
    if blocks > MAX_BLOCKS:  # each call's prompt is its blocks' ids: 2,000 of 10M tokens took minutes
        tokens = sum(c.input_tokens for c in out)
        raise bad(
            f"{path.name}: its {len(out):,} calls' prompts come to {tokens:,} tokens, more than a replay "
            f"holds ({MAX_BLOCKS * BLOCK:,}): export a shorter window"
        )
    return out


def _tokens(v: object, what: str, where: str, bad: type[Exception], most: int) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v):
        raise bad(f"{where}: its {what} are {v!r}, not a whole number")
    if not 0 <= v <= most:
        raise bad(f"{where}: its {what} are {int(v):,}: between 0 and {most:,}")
    return int(v)


def hash_blocks(calls: Sequence[Call]) -> dict[str, tuple[int, ...]]:
    """Synthesised prefix blocks: a call repeats the prompt blocks of the call it follows in the
    same agent (its context grew from it), then fresh ids for the rest of its prompt. A
    sub-agent's first call starts fresh (its own instructions)."""
    ids: dict[str, tuple[int, ...]] = {}
    by_span = {c.span: c for c in calls}
    fresh = 0
    for c in calls:
        n = max(1, math.ceil(c.input_tokens / BLOCK))
        prev = by_span.get(c.follows) if c.follows else None
        keep: tuple[int, ...] = ()
        if prev is not None and prev.agent == c.agent:
            keep = ids[prev.span][: min(prev.input_tokens // BLOCK, n)]
        new = tuple(range(fresh, fresh + n - len(keep)))
        fresh += len(new)
        ids[c.span] = keep + new
    return ids
