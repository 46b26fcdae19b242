"""Public traffic traces, read as published, streamed, one typed row at a time.

Formats (``--trace-format``, or detected from the file's first line):

- ``mooncake`` JSONL: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
  (a block is 512 tokens; ``len(hash_ids) == ceil(input_length / 512)``).
- ``bailian`` JSONL (Alibaba Qwen usage traces): ``chat_id``, ``parent_chat_id`` (-1 for a
  first turn), ``timestamp`` (s), ``input_length``, ``output_length``, ``type``, ``turn``,
  ``hash_ids`` (16 tokens a block).
- ``burstgpt`` CSV: ``Timestamp`` (s), ``Model``, ``Request tokens``, ``Response tokens``,
  ``Total tokens``, ``Log Type``; rows with 0 response tokens failed in the original and are
  skipped (counted).
- ``azure`` CSV (Azure LLM inference 2023/2024): ``TIMESTAMP`` (a datetime), ``ContextTokens``,
  ``GeneratedTokens``.
- ``weka`` JSON (agentic, one conversation per object, a JSON array or one per line): ``id``,
  ``requests`` with ``t`` (s from the conversation's start), ``in``, ``out``, ``hash_ids`` (64
  tokens a block), ``type``, optional ``think_time``. Every conversation starts at 0, as the
  format's own replayers start them.
- ``otel``: agent traces as OpenTelemetry exports them (OTLP JSON, the collector's file exporter),
  read with the GenAI semantic conventions: one row per model call, each following the call
  before it in its agent after the tool's time (:mod:`spoc_tui.core.traces.otel`).
- ``spoc`` JSONL, our own (what ``spoc trace convert`` writes; docs/traces.md): an optional
  first line ``{"spoc_trace": 1}``, then rows ``t`` (s), ``input_tokens``, ``output_tokens``,
  and optionally ``hash_ids`` with ``block_tokens``, ``id``, ``conversation``, ``parent`` (the
  ``id`` of the turn it follows), ``turn``, ``think_s`` and ``scope`` (where hash ids are
  unique; absent: the whole trace).

A malformed row is an error naming the file, the line and the field; a row that is well formed
but not to be sent (a failed request in the original, one the filter leaves out) is skipped and
counted by reason.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from spoc_tui.core.durations import duration_s
from spoc_tui.core.files import JsonLineError, json_lines, not_a_file, parse_json

# the formats' names live in a light module (spoc --help lists them); re-exported here
from spoc_tui.core.traces.formats import BLOCK_TOKENS as BLOCK_TOKENS
from spoc_tui.core.traces.formats import FORMATS as FORMATS
from spoc_tui.core.traces.formats import TraceFormat as TraceFormat
from spoc_tui.core.traces.opening import MAX_LINE as MAX_LINE
from spoc_tui.core.traces.opening import TraceError as TraceError
from spoc_tui.core.traces.opening import bounded, open_trace
from spoc_tui.core.traces.otel import BLOCK as OTEL_BLOCK
from spoc_tui.core.traces.otel import OtelRead, hash_blocks, read_calls

SPOC_TRACE_VERSION = 1

MAX_TOKENS = 10_000_000
"""The longest input or output a row may ask for (the longest context any model serves today is
about 10M tokens): an output of 10^12 was read, then skipped as too long, and the step's verdict
blamed the step length."""
MAX_SPAN_S = 366 * 86_400.0
"""The furthest a row may lie after the trace's first (a year): a timestamp of 1e300 ran a
replay until it was killed."""
MAX_THINK_S = 86_400.0
"""The longest think time between a turn and the one it follows (a day)."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One request of a trace."""

    index: int
    """The row's index among the trace's data rows, 0-based (skipped rows keep theirs)."""
    t: float
    """Seconds from the trace's first row (WEKA: from the conversation's start)."""
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] = ()
    """Prefix blocks: rows sharing leading ids share that many blocks of identical leading text."""
    block_tokens: int = 0
    """Tokens a hash id stands for (0 without hash ids)."""
    conversation: str | None = None
    parent: str | None = None
    """The request this one follows up (Bailian ``parent_chat_id``); None for a first turn."""
    turn: int = 0
    think_s: float | None = None
    """Seconds the user thought after the previous turn's answer (WEKA ``think_time``)."""
    line: int = 0
    """Where the row is in the file (1-based), for messages."""
    id: str | None = None
    """The row's own name, which a later row's ``parent`` refers to (Bailian ``chat_id``; WEKA
    ``conversation#request``)."""
    scope: str | None = None
    """Where its hash ids are unique: None for the whole trace (Mooncake, Bailian); the
    conversation for WEKA, whose ids restart in every conversation."""
    last: bool | None = None
    """The session's last call (an agent trace's, whose sessions are read whole); None where the
    format does not say."""

    def as_spoc(self) -> dict[str, object]:
        """The row in our own JSONL form (what ``spoc trace convert`` writes)."""
        d: dict[str, object] = {"t": round(self.t, 6), "input_tokens": self.input_tokens}
        d["output_tokens"] = self.output_tokens
        if self.hash_ids:
            d["hash_ids"] = list(self.hash_ids)
            d["block_tokens"] = self.block_tokens
        for key in ("id", "conversation", "parent", "think_s", "scope"):
            if (v := getattr(self, key)) is not None:
                d[key] = v
        if self.turn:
            d["turn"] = self.turn
        if self.last is not None:
            d["last"] = self.last
        return d


class TraceRead:
    """What reading skipped, by reason, and how many data rows it read (filled as rows stream)."""

    def __init__(self) -> None:
        self.skipped: Counter[str] = Counter()
        self.rows = 0
        self.otel: OtelRead | None = None
        """An OTLP file's attribute spellings, what it lacks, its spans (``otel`` only)."""

    def admit(self, row: _Row, filters: Sequence[tuple[str, str]]) -> int | None:
        """Count a data row and give its index, or None (counted as skipped) when the filters
        leave it out."""
        index = self.rows
        self.rows += 1
        if not row.keep(filters):
            self.skipped["filtered out"] += 1
            return None
        return index


# -- detection --------------------------------------------------------------------------------


def _head_says(path: Path, needle: str) -> bool:
    """Whether the file's first 64 KB hold ``needle`` (a pretty-printed object's keys)."""
    try:
        with open_trace(path) as f:
            return needle in f.read(65_536)
    except (OSError, UnicodeDecodeError, EOFError, zlib.error):
        return False


def detect_format(path: Path) -> TraceFormat:
    """The format from the file's first non-empty line.

    Raises:
        TraceError: unreadable, empty, or like none of :data:`FORMATS`.
    """
    try:
        with open_trace(path) as f:
            first = next((line for line in bounded(f, path) if line.strip()), "")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, EOFError, zlib.error) as e:
        raise TraceError(f"{path}: cannot read ({e})") from None
    text = first.strip()
    if not text:
        raise TraceError(f"{path}: empty")
    if text.startswith("{") and ('"resourceSpans"' in text or _head_says(path, '"resourceSpans"')):
        return "otel"
    if text.startswith("["):
        return "weka"
    if text.startswith("{"):
        try:
            obj = parse_json(text)
        except json.JSONDecodeError:
            # a pretty-printed conversation object spans lines
            return "weka"
        if isinstance(obj, dict):
            keys = set(obj)
            if "spoc_trace" in keys or "input_tokens" in keys:
                return "spoc"
            if "requests" in keys:
                return "weka"
            if "chat_id" in keys or "parent_chat_id" in keys:
                return "bailian"
            if "input_length" in keys:
                return "mooncake"
        raise TraceError(f"{path} line 1: a JSON row like no known trace format; give --trace-format")
    header = {h.strip() for h in next(csv.reader([text]))}
    if {"Timestamp", "Request tokens", "Response tokens"} <= header:
        return "burstgpt"
    if {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} <= header:
        return "azure"
    raise TraceError(
        f"{path} line 1: a header like no known trace format ({', '.join(sorted(header))[:80]}); give --trace-format"
    )


# -- reading ----------------------------------------------------------------------------------


def parse_filters(specs: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``--trace-filter "Model=GPT-4"`` (repeatable, or comma-separated): rows whose column equals
    the value are kept.

    Raises:
        TraceError: a filter that is not COLUMN=VALUE.
    """
    out = []
    for spec in specs:
        for part in spec.split(","):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise TraceError(f"bad --trace-filter {part!r}: write COLUMN=VALUE, e.g. Model=GPT-4")
            out.append((key.strip(), value.strip()))
    return tuple(out)


def read_trace(
    path: Path,
    fmt: TraceFormat | None = None,
    filters: Sequence[tuple[str, str]] = (),
    read: TraceRead | None = None,
) -> Iterator[TraceRow]:
    """The trace's rows in file order, streamed (a file of any size in little memory); ``t`` is
    rebased so the first row is at 0 (WEKA: each conversation at 0). Skips are counted in
    ``read``.

    Raises:
        TraceError: a malformed row (file, line, field), a filter naming no column, timestamps
            that go back.
    """
    fmt = fmt or detect_format(path)
    if fmt not in FORMATS:
        raise TraceError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    read = read if read is not None else TraceRead()
    try:
        with open_trace(path) as whole:
            f = bounded(whole, path)
            if fmt in ("burstgpt", "azure"):
                yield from _csv_rows(path, f, fmt, filters, read)
            elif fmt == "weka":
                yield from _weka_rows(path, f, filters, read)
            elif fmt == "otel":
                yield from _otel_rows(path, f, filters, read)
            else:
                yield from _jsonl_rows(path, f, fmt, filters, read)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"{path}: not UTF-8 text ({e.reason})") from None
    except (EOFError, zlib.error) as e:
        raise TraceError(f"{path}: a damaged gzip file ({e})") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None


class _Row:
    """Typed access to one raw row's fields, with errors that name the line and the field."""

    def __init__(self, path: Path, line: int, raw: dict[str, object]) -> None:
        self.path, self.line, self.raw = path, line, raw

    def bad(self, msg: str) -> TraceError:
        return TraceError(f"{self.path.name} line {self.line}: {msg}")

    def num(self, key: str, *, whole: bool = True, minimum: float = 0, maximum: float = math.inf) -> float:
        if key not in self.raw:
            raise self.bad(f"missing {key!r}")
        v = self.raw[key]
        if isinstance(v, str):
            try:
                v = float(v.strip())
            except ValueError:
                raise self.bad(f"{key} is {self.raw[key]!r}, not a number") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.bad(f"{key} is {v!r}, not a number")
        if whole and v != int(v):
            raise self.bad(f"{key} is {v!r}, not a whole number")
        if v < minimum:
            raise self.bad(f"{key} is {v!r}: it must be at least {minimum:g}")
        if v > maximum:
            raw = self.raw[key]
            shown = raw.strip()[:40] if isinstance(raw, str) else repr(raw)
            raise self.bad(f"{key} is {shown}: it must be at most {maximum:,.0f}")
        return float(v)

    def tokens(self, key: str, minimum: float = 1) -> int:
        """A length in tokens, at least ``minimum`` and at most :data:`MAX_TOKENS`."""
        return int(self.num(key, minimum=minimum, maximum=MAX_TOKENS))

    def ids(self, key: str) -> tuple[int, ...]:
        v = self.raw.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise self.bad(f"{key} must be a list of whole numbers")
        return tuple(v)

    def text(self, key: str) -> str | None:
        v = self.raw.get(key)
        return None if v is None else str(v)

    def keep(self, filters: Sequence[tuple[str, str]]) -> bool:
        for key, value in filters:
            if key not in self.raw:
                raise self.bad(f"--trace-filter names {key!r}, a column the row does not have")
            if str(self.raw[key]).strip() != value:
                return False
        return True


def _jsonl_rows(
    path: Path, f: IO[str], fmt: TraceFormat, filters: Sequence[tuple[str, str]], read: TraceRead
) -> Iterator[TraceRow]:
    t0: float | None = None
    last = -math.inf
    links = _Links()
    for lineno, obj in _json_lines(path, f):
        if not isinstance(obj, dict):
            raise TraceError(f"{path.name} line {lineno}: expected a JSON object")
        if fmt == "spoc" and "spoc_trace" in obj:
            version = obj["spoc_trace"]
            if not isinstance(version, int) or version > SPOC_TRACE_VERSION:
                raise TraceError(
                    f"{path.name} line {lineno}: a spoc trace of version {version!r}; this spoc-tui reads "
                    f"version {SPOC_TRACE_VERSION}: upgrade"
                )
            continue
        r = _Row(path, lineno, obj)
        if (index := read.admit(r, filters)) is None:
            continue
        row = _jsonl_row(r, fmt, index)
        if row.t < last:
            raise r.bad(f"its timestamp goes back ({row.t:g} s after {last:g} s): sort the trace by time")
        last = row.t
        if t0 is None:
            t0 = row.t
        _within_span(r, "timestamp" if fmt != "spoc" else "t", row.t, t0)
        links.check(r, row)
        yield _rebased(row, t0)


def _jsonl_row(r: _Row, fmt: TraceFormat, index: int) -> TraceRow:
    if fmt == "mooncake":
        n_in = r.tokens("input_length")
        ids = r.ids("hash_ids")
        block = BLOCK_TOKENS["mooncake"]
        if ids and len(ids) != math.ceil(n_in / block):
            raise r.bad(
                f"{len(ids)} hash_ids for {n_in} input tokens: a Mooncake block is {block} tokens, so it takes "
                f"{math.ceil(n_in / block)}"
            )
        return TraceRow(index, r.num("timestamp") / 1000.0, n_in, r.tokens("output_length"), ids, block, line=r.line)
    if fmt == "bailian":
        parent = r.raw.get("parent_chat_id", -1)
        chat = r.text("chat_id")
        if chat is None:
            raise r.bad("missing 'chat_id'")
        return TraceRow(
            index,
            r.num("timestamp", whole=False),
            r.tokens("input_length"),
            r.tokens("output_length"),
            r.ids("hash_ids"),
            BLOCK_TOKENS["bailian"],
            conversation=chat,
            parent=None if parent in (-1, "-1", None) else str(parent),
            turn=int(r.num("turn")) if "turn" in r.raw else 0,
            line=r.line,
            id=chat,
        )
    # our own
    ids = r.ids("hash_ids")
    block = int(r.num("block_tokens", minimum=1)) if ids else 0
    think = r.num("think_s", whole=False, maximum=MAX_THINK_S) if "think_s" in r.raw else None
    return TraceRow(
        index,
        r.num("t", whole=False),
        r.tokens("input_tokens"),
        r.tokens("output_tokens"),
        ids,
        block,
        conversation=r.text("conversation"),
        parent=r.text("parent"),
        turn=int(r.num("turn")) if "turn" in r.raw else 0,
        think_s=think,
        line=r.line,
        id=r.text("id"),
        scope=r.text("scope"),
        last=bool(r.raw["last"]) if isinstance(r.raw.get("last"), bool) else None,
    )


def _within_span(r: _Row, key: str, t: float, t0: float) -> float:
    """``t``, refused when it lies more than :data:`MAX_SPAN_S` after the trace's first row."""
    if t - t0 > MAX_SPAN_S:
        raise r.bad(f"{key} lies {(t - t0) / 86_400:,.0f} days after the first row: a trace spans at most 366 days")
    return t


class _Links:
    """Checks each row's parent as rows stream: not itself, and not a row that comes later (a turn
    follows one already sent; a loop of parents needs one that comes later). A parent the trace
    never holds (cut off before its start) is allowed: the turn then starts as a first one. Holds
    one integer per row that has an id, and per parent not yet seen."""

    def __init__(self) -> None:
        self._seen: set[int] = set()
        self._pending: dict[int, int] = {}
        """A parent named before any row had its id -> the line of the first row that named it."""

    def check(self, r: _Row, row: TraceRow) -> None:
        if row.parent is not None:
            if row.parent == row.id:
                raise r.bad(f"the row is its own parent ({row.parent!r:.80})")
            key = hash(row.parent)
            if key not in self._seen:
                self._pending.setdefault(key, r.line)
        if row.id is not None:
            key = hash(row.id)
            child = self._pending.pop(key, None)
            if child is not None:
                raise r.bad(
                    f"row {row.id!r:.80} is the parent of line {child}, which comes before it: a turn must follow "
                    "the one it answers (a loop of parents, or a trace not sorted by time)"
                )
            self._seen.add(key)


def _rebased(row: TraceRow, t0: float) -> TraceRow:
    return replace(row, t=row.t - t0)


_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_timestamp(text: str) -> float:
    """An Azure trace's datetime (``2023-11-16 18:17:03.9799600``, 7 fractional digits, no zone;
    or ``2024-05-10 00:00:00.009930+00:00``) as Unix seconds (no zone: read as UTC).

    Raises:
        ValueError: not a datetime.
    """
    s = _FRACTION.sub(r"\1", text.strip())
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _csv_rows(
    path: Path, f: IO[str], fmt: TraceFormat, filters: Sequence[tuple[str, str]], read: TraceRead
) -> Iterator[TraceRow]:
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{path}: empty")
    names = [h.strip() for h in header]
    need = (
        ("Timestamp", "Request tokens", "Response tokens")
        if fmt == "burstgpt"
        else (
            "TIMESTAMP",
            "ContextTokens",
            "GeneratedTokens",
        )
    )
    missing = [n for n in need if n not in names]
    if missing:
        raise TraceError(f"{path.name} line 1: the {fmt} format needs the column(s) {', '.join(missing)}")
    t0: float | None = None
    last = -math.inf
    for values in reader:
        lineno = reader.line_num
        if not values or not any(v.strip() for v in values):
            continue
        if len(values) != len(names):
            raise TraceError(f"{path.name} line {lineno}: {len(values)} fields, the header has {len(names)}")
        r = _Row(path, lineno, dict(zip(names, values, strict=True)))
        if (index := read.admit(r, filters)) is None:
            continue
        if fmt == "burstgpt":
            t = r.num("Timestamp", whole=False)
            n_in = r.tokens("Request tokens", minimum=0)
            n_out = r.tokens("Response tokens", minimum=0)
            if n_out == 0:
                read.skipped["failed in the original (0 response tokens)"] += 1
                continue
            if n_in == 0:
                read.skipped["no request tokens"] += 1
                continue
        else:
            stamp = str(r.raw["TIMESTAMP"])
            try:
                t = parse_timestamp(stamp)
            except ValueError:
                raise r.bad(f"TIMESTAMP is {stamp!r}, not a date and time") from None
            n_in = r.tokens("ContextTokens", minimum=0)
            n_out = r.tokens("GeneratedTokens", minimum=0)
            if n_in == 0 or n_out == 0:
                read.skipped["no context or generated tokens"] += 1
                continue
        if t < last:
            raise r.bad(f"its timestamp goes back ({t:g} s after {last:g} s): sort the trace by time")
        last = t
        if t0 is None:
            t0 = t
        _within_span(r, "Timestamp" if fmt == "burstgpt" else "TIMESTAMP", t, t0)
        yield TraceRow(index, t - t0, n_in, n_out, line=lineno)


def _weka_rows(path: Path, f: IO[str], filters: Sequence[tuple[str, str]], read: TraceRead) -> Iterator[TraceRow]:
    head = f.read(1)
    while head and head.isspace():
        head = f.read(1)
    if head == "[":  # one JSON array of conversations (read whole: such files are small)
        try:
            convs = parse_json(head + f.read())
        except json.JSONDecodeError as e:
            raise TraceError(f"{path.name} line {e.lineno}: not JSON ({e.msg})") from None
        if not isinstance(convs, list):
            raise TraceError(f"{path.name}: expected a JSON array of conversations")
        for i, conv in enumerate(convs):
            yield from _weka_conversation(path, i + 1, conv, filters, read, f"conversation {i + 1}")
        return
    f.seek(0)
    hint = "; a WEKA trace is one conversation per line, or one JSON array of them"
    for lineno, conv in _json_lines(path, f, hint):
        yield from _weka_conversation(path, lineno, conv, filters, read, f"line {lineno}")


def _json_lines(path: Path, f: Iterable[str], hint: str = "") -> Iterator[tuple[int, object]]:
    """(line number, value) of each non-empty line; a line that is not JSON is named."""
    try:
        yield from json_lines(f)
    except JsonLineError as e:
        raise TraceError(f"{path.name} line {e.lineno}: not JSON ({e.msg}){hint}") from None


def _weka_conversation(
    path: Path, lineno: int, conv: object, filters: Sequence[tuple[str, str]], read: TraceRead, where: str
) -> Iterator[TraceRow]:
    if not isinstance(conv, dict) or not isinstance(conv.get("requests"), list):
        raise TraceError(f"{path.name} {where}: a WEKA conversation needs a 'requests' list")
    cid = str(conv.get("id", f"conversation-{lineno}"))
    block = conv.get("block_size", BLOCK_TOKENS["weka"])
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise TraceError(f"{path.name} {where}: block_size must be a whole number of tokens")
    previous: str | None = None
    last = -math.inf
    for k, req in enumerate(conv["requests"]):
        if not isinstance(req, dict):
            raise TraceError(f"{path.name} {where}: request {k + 1} is not an object")
        r = _Row(path, lineno, req)
        if (index := read.admit(r, filters)) is None:
            continue
        try:
            t = r.num("t", whole=False)
            t = _within_span(r, "t", t, 0.0)
            n_in, n_out = r.tokens("in"), r.tokens("out")
            ids = r.ids("hash_ids")
            think = r.num("think_time", whole=False, maximum=MAX_THINK_S) if req.get("think_time") is not None else None
        except TraceError as e:
            raise TraceError(f"{e} (conversation {cid}, request {k + 1})") from None
        if t < last:
            raise r.bad(f"request {k + 1} of conversation {cid} goes back in time ({t:g} s after {last:g} s)")
        last = t
        row_id = f"{cid}#{k}"
        yield TraceRow(index, t, n_in, n_out, ids, block, cid, previous, k, think, lineno, row_id, cid)
        previous = row_id


def _otel_rows(path: Path, f: IO[str], filters: Sequence[tuple[str, str]], read: TraceRead) -> Iterator[TraceRow]:
    text = f.read()
    lines = io.StringIO(text)
    skipped = 0
    first_line = ""
    for first_line in lines:  # the first line with something on it (no copy of the whole text)
        if first_line.strip():
            break
        skipped += 1
    try:
        first = parse_json(first_line)
    except json.JSONDecodeError:
        first = None
    objects: Iterator[tuple[int, object]]
    if isinstance(first, dict):  # the file exporter: one export request a line (the first read once)
        rest = itertools.chain(["\n"] * (skipped + 1), lines)
        objects = itertools.chain(
            [(skipped + 1, first)], _json_lines(path, rest, "; an OTLP file holds one export a line")
        )
    else:  # one object, pretty-printed
        try:
            objects = iter([(1, parse_json(text))])
        except json.JSONDecodeError as e:
            raise TraceError(f"{path.name} line {e.lineno}: not JSON ({e.msg})") from None
    read.otel = OtelRead()
    # each call follows one that started before it (its agent's last, or its invoker): no link to check
    calls = read_calls(path, objects, read.otel, TraceError, MAX_TOKENS, MAX_THINK_S)
    read.skipped.update(read.otel.skipped)
    blocks = hash_blocks(calls)
    # each call's turn in its session (not in its agent's chain: a sub-agent's first call is not a
    # session's start), and each session's last call that is sent (the latest to start)
    final: dict[str, str] = {}
    turn: dict[str, int] = {}
    count: Counter[str] = Counter()
    for c in calls:  # in start order
        if c.input_tokens and c.output_tokens:
            final[c.session] = c.span
            turn[c.span] = count[c.session]
            count[c.session] += 1
    for c in calls:
        r = _Row(path, c.line, {k: "" if v is None else v for k, v in c.attrs.items()})
        if (index := read.admit(r, filters)) is None:
            continue
        if c.input_tokens == 0 or c.output_tokens == 0:
            read.skipped["no input or output tokens"] += 1
            continue
        _within_span(r, "startTimeUnixNano", c.start_s, 0.0)
        yield TraceRow(
            index, c.start_s, c.input_tokens, c.output_tokens, blocks[c.span], OTEL_BLOCK, c.session, c.follows,
            turn[c.span], c.gap_s, c.line, c.span, last=final.get(c.session) == c.span,
        )  # fmt: skip


# -- what a replay sends ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceSource:
    """The rows a replay sends: a trace file, its format, filters, a time window and a row cap
    (``--trace``, ``--trace-format``, ``--trace-filter``, ``--trace-window``,
    ``--trace-max-rows``)."""

    path: Path
    fmt: TraceFormat
    filters: tuple[tuple[str, str], ...] = ()
    start_s: float = 0.0
    """The window's start, seconds after the trace's first row."""
    length_s: float | None = None
    """The window's length (None: to the end)."""
    max_rows: int | None = None
    think_scaled: bool = False
    """``--trace-think scaled``: a turn's wait after the answer it follows (a tool's time, a
    user's) is divided by the replay's speed, as its start is; recorded (False) by default."""

    def think_s(self, row: TraceRow, speed: float) -> float:
        """How long ``row`` waits after the answer it follows, at ``speed``."""
        think = row.think_s or 0.0
        return think / speed if self.think_scaled else think

    def rows(self, read: TraceRead | None = None) -> Iterator[TraceRow]:
        """The window's rows, streamed, ``t`` rebased to the window's start (WEKA: every
        conversation starts at 0, and the window applies to its own clock)."""
        end = math.inf if self.length_s is None else self.start_s + self.length_s
        n = 0
        for row in read_trace(self.path, self.fmt, self.filters, read):
            if row.t < self.start_s:
                continue
            if row.t >= end:
                if self.fmt == "weka":
                    continue
                return
            yield replace(row, t=row.t - self.start_s)
            n += 1
            if self.max_rows is not None and n >= self.max_rows:
                return

    def header(self, rows: int, skipped: Mapping[str, int], span_s: float | None = None) -> dict[str, object]:
        """What a result file says of the replayed trace: its selection, the file's name only (a
        path can say more than the trace), the rows read, their span and what reading skipped."""
        out: dict[str, object] = {**self.as_dict(), "path": self.path.name, "rows": rows}
        if span_s is not None:
            out["span_s"] = round(span_s, 3)
        out["skipped_reading"] = dict(skipped)
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "format": self.fmt,
            "filters": [f"{k}={v}" for k, v in self.filters],
            "window": [self.start_s, self.length_s],
            "max_rows": self.max_rows,
            **({"think": "scaled"} if self.think_scaled else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> TraceSource:
        """Raises: TraceError for a description this code did not write."""
        try:
            fmt = str(d["format"])
            if fmt not in FORMATS:
                raise TraceError(f"unknown trace format {fmt!r}")
            window = d.get("window") or [0.0, None]
            assert isinstance(window, list) and len(window) == 2
            filters = d.get("filters") or []
            assert isinstance(filters, list)
            max_rows = d.get("max_rows")
            return cls(
                Path(str(d["path"])),
                fmt,  # checked against FORMATS above
                parse_filters([str(f) for f in filters]),
                float(window[0]),
                None if window[1] is None else float(window[1]),
                None if max_rows is None else int(str(max_rows)),
                d.get("think") == "scaled",
            )
        except (KeyError, AssertionError, ValueError, TypeError) as e:
            raise TraceError(f"not a trace description: {e}") from None


def trace_source(
    path: str,
    fmt: str | None = None,
    filters: Sequence[str] = (),
    window: str | None = None,
    max_rows: int | None = None,
    think: str = "recorded",
) -> TraceSource:
    """What ``--trace`` and its options select, checked (the rows are read later).

    Raises:
        TraceError: no such file, an unknown format, a bad filter, window or row cap.
    """
    p = Path(path)
    if (why := not_a_file(p)) is not None:
        raise TraceError(f"--trace {path}: {why}")
    if fmt is not None and fmt not in FORMATS:
        raise TraceError(f"--trace-format {fmt!r}: one of {', '.join(FORMATS)}")
    if max_rows is not None and max_rows < 1:
        raise TraceError("--trace-max-rows must be at least 1")
    if think not in ("recorded", "scaled"):
        raise TraceError(f"--trace-think {think!r}: recorded or scaled")
    start, length = parse_window(window) if window else (0.0, None)
    return TraceSource(
        p,
        fmt or detect_format(p),  # checked against FORMATS above
        parse_filters(filters),
        start,
        length,
        max_rows,
        think == "scaled",
    )


def parse_window(text: str) -> tuple[float, float | None]:
    """``--trace-window START:LENGTH`` (seconds, or durations like 10m; LENGTH may be empty for
    the rest of the trace).

    Raises:
        TraceError: naming the accepted form.
    """
    head, sep, tail = text.partition(":")
    form = f"bad --trace-window {text!r}: give START:LENGTH in seconds or durations, e.g. 600:300 or 10m:5m"
    if not sep:
        raise TraceError(form)
    try:
        start = duration_s(head) if head.strip() else 0.0
        length = duration_s(tail) if tail.strip() else None
    except ValueError:
        raise TraceError(form) from None
    if length is not None and length <= 0:
        raise TraceError(f"bad --trace-window {text!r}: the length must be above 0")
    return start, length


def write_spoc(rows: Iterator[TraceRow], out: IO[str]) -> int:
    """Rows in our own JSONL form (a version line first); returns how many were written."""
    out.write(json.dumps({"spoc_trace": SPOC_TRACE_VERSION}) + "\n")
    n = 0
    for row in rows:
        out.write(json.dumps(row.as_spoc(), separators=(",", ":")) + "\n")
        n += 1
    return n
