"""Prometheus text-format (0.0.4) and OpenMetrics parsing.

The parser is line-oriented and never raises on bad input: a line it cannot read is
recorded in :attr:`Exposition.errors` and skipped, so one garbled line (or an excerpt with
gaps) costs only the figures that depend on it.

Samples are keyed by their *sample* name (``vllm:prompt_tokens_total``, not the family name)
and by their full, sorted label set.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from spoc_tui.core.textsafe import safe

Labels = tuple[tuple[str, str], ...]
"""A label set: ``(name, value)`` pairs sorted by name."""

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*+"
_QSTR = r'"(?:[^"\\\n]++|\\.)*+"'
# name, optional {labels}, value, optional timestamp.  The label part is a run of
# non-quote/non-brace characters and quoted strings, so `}` inside a value is fine.
# Every repeat is possessive (Python 3.11): no run of blanks or characters is ever re-split,
# so a line is matched in linear time whatever it holds (a name and 100 KB of blanks took 53 s
# with backtracking).
_LINE = re.compile(
    r"^(" + _NAME + r")?+(?:\s*+\{((?:[^\"}]++|" + _QSTR + r")*+)\})?+[ \t]++(\S++)(?:[ \t]++(\S++))?+[ \t]*+$"
)
_LABEL = re.compile(r"\s*+(" + _NAME + r"|" + _QSTR + r")\s*+(?:=\s*+(" + _QSTR + r"))?+\s*+(,|$)")
_ESC = re.compile(r"\\(.)")
_ESC_MAP = {"n": "\n", "\\": "\\", '"': '"'}

INT64_SENTINEL_MIN = 0x7FFFFFFFFFFFFFF0
"""DCGM INT64 blank/not-supported sentinels start here."""


def _unescape(s: str) -> str:
    if "\\" not in s:
        return s
    return _ESC.sub(lambda m: _ESC_MAP.get(m.group(1), "\\" + m.group(1)), s)


def parse_float(text: str) -> float:
    """Parse a sample value the way Prometheus does (NaN, +Inf, -Inf included).

    Raises:
        ValueError: for anything that is not a number.
    """
    if "_" in text:  # Python accepts 1_000, the exposition format does not
        raise ValueError(text)
    return float(text)


@dataclass(slots=True)
class Exposition:
    """The result of parsing one exposition body."""

    samples: dict[str, dict[Labels, float]] = field(default_factory=dict)
    """sample name -> label set -> value."""
    types: dict[str, str] = field(default_factory=dict)
    """name from ``# TYPE`` -> type (counter, gauge, histogram, summary, untyped, ...)."""
    helps: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    """Lines that could not be parsed, with their line numbers."""
    openmetrics: bool = False
    nonfinite: int = 0
    """Samples whose value was NaN or ±Inf: dropped here, so every figure built on them reads n/a
    (a server's NaN gauge must not reach a rate, a verdict or the screen as "inf")."""
    memo: dict[object, object] = field(default_factory=dict, init=False, repr=False, compare=False)
    """What was derived from these samples (a histogram's groups, the split by engine), kept
    for when this scrape is the baseline of a later window; an exposition is not changed once
    parsed."""

    def get(self, name: str) -> dict[Labels, float]:
        """All series of one sample name (empty when absent)."""
        return self.samples.get(name, {})

    def has(self, name: str) -> bool:
        return name in self.samples

    def names(self) -> list[str]:
        return list(self.samples)


_K = TypeVar("_K")
_V = TypeVar("_V")


class Bounded(dict[_K, _V]):
    """A memo of what was derived from a key (a line's text, a series' labels), at most ``limit``
    entries: emptied when full, so a source whose keys never repeat costs memory, not a leak."""

    def __init__(self, limit: int = 20000) -> None:
        super().__init__()
        self.limit = limit

    def keep(self, key: _K, value: _V) -> None:
        if len(self) >= self.limit:
            self.clear()
        self[key] = value


class _Bounded(Bounded[str, _V]):
    """Text -> what it parsed to."""

    LONGEST = 4096
    """Longer texts are parsed each time, never kept (a 10 MB label value is not cached)."""

    def keep(self, key: str, value: _V) -> None:
        if len(key) <= self.LONGEST:
            super().keep(key, value)


class _LabelCache(_Bounded[Labels | None]):
    """Raw label text -> parsed labels; label sets repeat a lot within and across scrapes."""

    def parse(self, raw: str) -> Labels | None:
        if len(raw) > self.LONGEST:
            return _parse_labels(raw)
        hit = self.get(raw)
        if hit is not None or raw in self:
            return hit
        parsed = _parse_labels(raw)
        self.keep(raw, parsed)
        return parsed


def _parse_labels(raw: str) -> Labels | None:
    """Parse ``a="1",b="2"`` (trailing comma and blanks allowed). None when malformed.

    A bare quoted string without ``=`` is a UTF-8 metric name; it is returned as the label
    ``__name__``.
    """
    pairs: list[tuple[str, str]] = []
    pos = 0
    n = len(raw.rstrip())  # past this only blanks (checked once: slicing per label was quadratic)
    while pos < n:
        m = _LABEL.match(raw, pos)
        if m is None or m.end() == pos:
            return None
        key, val = m.group(1), m.group(2)
        if val is None:
            if not key.startswith('"'):
                return None
            pairs.append(("__name__", safe(_unescape(key[1:-1]))))
        else:
            if key.startswith('"'):
                key = safe(_unescape(key[1:-1]))
            pairs.append((key, safe(_unescape(val[1:-1]))))
        pos = m.end()
        if m.group(3) == "" and pos < n:
            return None
    pairs.sort()
    return tuple(pairs)


_CACHE = _LabelCache()

_SAMPLES: _Bounded[tuple[str, Labels, float]] = _Bounded()
"""A whole sample line -> its name, labels and value, as last parsed: between two scrapes most
of a DCGM exporter's lines (and a quiet server's) are the same text, and a dictionary look-up
costs a fraction of the match."""

_HEADS: _Bounded[tuple[str, Labels]] = _Bounded()
"""A sample line's text up to its value (``name{labels} ``) -> its name and labels: a series
whose value changed (most of a busy server's lines) is split at its last blank and its head
looked up; the match and the label parse are for a new series."""

_COMMENTS: _Bounded[tuple[str, str, str] | None] = _Bounded()
"""A comment line -> what it says (``TYPE``/``HELP``, the family, the text), or None (another
comment): HELP and TYPE lines repeat in every scrape."""


MAX_LINES = 200_000
"""Bodies with more lines are not parsed (as Prometheus' ``sample_limit`` refuses a scrape): a
full vLLM 0.32 /metrics is about 700 lines, 64 data-parallel engines about 45,000."""


class TooLarge(ValueError):
    """An exposition with more than :data:`MAX_LINES` lines."""


def check_size(text: str, limit: int = MAX_LINES) -> None:
    """Raises: TooLarge for a body with more than ``limit`` lines (counted in C, fast)."""
    n = text.count("\n")
    if n > limit:
        raise TooLarge(f"{n:,} lines, more than the {limit:,} a scrape may have (sample limit)")


def parse_text(text: str, content_type: str | None = None) -> Exposition:
    """Parse exposition text. Never raises (callers refuse oversized bodies with :func:`check_size`).

    Args:
        text: the body.
        content_type: the HTTP Content-Type when known; OpenMetrics is also recognised by a
            trailing ``# EOF`` line.
    """
    exp = Exposition()
    om = bool(content_type and "openmetrics" in content_type) or text.rstrip().endswith("# EOF")
    exp.openmetrics = om
    samples = exp.samples
    cache = _CACHE
    seen, keep_line = _SAMPLES.get, _SAMPLES.keep
    head_of, keep = _HEADS.get, _HEADS.keep
    match_line = _LINE.match
    # Only "\n" ends a line (str.splitlines would also split on \x85, \u2028, ...).
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.endswith("\r"):
            line = line[:-1]
        if not line or line.isspace():
            continue
        c0 = line[0]
        if c0 == "#" or (c0 in " \t" and line.lstrip().startswith("#")):
            _comment(line.strip(), exp)
            continue
        if om and " # " in line:
            line = _strip_exemplar(line)
        found = seen(line)
        if found is None:
            cut = line.rfind(" ") + 1
            found = _known_series(line, cut, head_of) if cut else None
        if found is None:
            m = match_line(line)
            if m is None:
                exp.errors.append(f"line {lineno}: cannot parse {line[:80]!r}")
                continue
            name, raw_labels, raw_value = m.group(1), m.group(2), m.group(3)
            if raw_labels:
                parsed = cache.parse(raw_labels)
                if parsed is None:
                    exp.errors.append(f"line {lineno}: bad label set {line[:80]!r}")
                    continue
                labels = parsed
                if "__name__" in raw_labels and any(k == "__name__" for k, _ in labels):
                    qname = [v for k, v in labels if k == "__name__"]
                    if name or len(qname) != 1:
                        exp.errors.append(f"line {lineno}: two metric names {line[:80]!r}")
                        continue
                    name = qname[0]
                    labels = tuple(p for p in labels if p[0] != "__name__")
            else:
                labels = ()
            if not name:
                exp.errors.append(f"line {lineno}: no metric name {line[:80]!r}")
                continue
            try:
                value = parse_float(raw_value)
            except ValueError:
                exp.errors.append(f"line {lineno}: bad value {raw_value[:40]!r}")
                continue
            if not math.isfinite(value):
                exp.nonfinite += 1
                continue
            if m.start(3) == cut and m.group(4) is None and m.end(3) == len(line):
                keep(line[:cut], (name, labels))  # a value after the last blank, no timestamp
            found = (name, labels, value)
            keep_line(line, found)
        name, labels, value = found
        series = samples.get(name)
        if series is None:
            series = samples[name] = {}
        series[labels] = value
    if om:
        _unmangle_openmetrics(exp)
    _drop_created(exp)
    return exp


def _known_series(
    line: str, cut: int, head_of: Callable[[str], tuple[str, Labels] | None]
) -> tuple[str, Labels, float] | None:
    """A sample line of a series seen before (its text up to ``cut``, the last blank, looked up)
    with a new, finite value; None for anything else, which is parsed in full (its error or its
    non-finite count included)."""
    hit = head_of(line[:cut])
    if hit is None:
        return None
    raw_value = line[cut:]
    # float() also takes "1_0" and blanks around the number, the format does not
    if not raw_value or "_" in raw_value or raw_value.strip() != raw_value:
        return None
    try:
        value = float(raw_value)
    except ValueError:
        return None
    return (hit[0], hit[1], value) if math.isfinite(value) else None


def _comment(line: str, exp: Exposition) -> None:
    said = _COMMENTS.get(line)
    if said is None and line not in _COMMENTS:
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[1] == "TYPE":
            said = ("TYPE", parts[2], parts[3].strip().lower() if len(parts) > 3 else "untyped")
        elif len(parts) >= 3 and parts[1] == "HELP":
            said = ("HELP", parts[2], safe(_unescape(parts[3])) if len(parts) > 3 else "")
        _COMMENTS.keep(line, said)
    if said is not None:
        kind, family, text = said
        (exp.types if kind == "TYPE" else exp.helps)[family] = text


def _strip_exemplar(line: str) -> str:
    """Drop an OpenMetrics exemplar (`` # {...} v [ts]``) outside quoted label values."""
    in_q = False
    esc = False
    for i, ch in enumerate(line):
        if esc:
            esc = False
        elif ch == "\\":
            esc = True
        elif ch == '"':
            in_q = not in_q
        elif ch == "#" and not in_q and i > 0 and line[i - 1] == " ":
            return line[: i - 1]
    return line


def _unmangle_openmetrics(exp: Exposition) -> None:
    """Undo prometheus_client's OpenMetrics escaping of ``:`` to ``_`` in sample names.

    With prometheus_client >= 0.23 a vLLM server asked for OpenMetrics writes
    ``# TYPE vllm:x counter`` but samples named ``vllm_x_total``.
    """
    fixes: dict[str, str] = {}
    for fam in exp.types:
        if ":" in fam:
            fixes[fam.replace(":", "_")] = fam
    if not fixes:
        return
    renamed: dict[str, dict[Labels, float]] = {}
    for name, series in exp.samples.items():
        new = name
        for mangled, real in fixes.items():
            if name.startswith(mangled) and name[len(mangled) :] in (
                "",
                "_total",
                "_bucket",
                "_sum",
                "_count",
                "_created",
                "_info",
                "_gcount",
                "_gsum",
            ):
                new = real + name[len(mangled) :]
                break
        renamed.setdefault(new, {}).update(series)
    exp.samples = renamed


_CREATED_PARENTS = ("counter", "histogram", "summary", "gaugehistogram")


def _drop_created(exp: Exposition) -> None:
    """Remove ``*_created`` series (creation timestamps, not measurements)."""
    drop = []
    for name in exp.samples:
        if not name.endswith("_created"):
            continue
        base = name[: -len("_created")]
        if (
            exp.openmetrics
            or exp.types.get(base) in _CREATED_PARENTS
            or exp.types.get(base + "_total") in _CREATED_PARENTS
            or base + "_total" in exp.samples
            or base + "_count" in exp.samples
            or base + "_bucket" in exp.samples
        ):
            drop.append(name)
    for name in drop:
        del exp.samples[name]


def is_sentinel(value: float) -> bool:
    """DCGM's blank / not-supported sentinels and non-finite values are 'no data'."""
    if math.isnan(value) or math.isinf(value):
        return True
    if value >= INT64_SENTINEL_MIN:
        return True
    if 0x7FFFFFF0 <= value <= 0x7FFFFFFF:  # INT32 sentinels
        return True
    return value >= 2.0**47  # FP64 sentinels
