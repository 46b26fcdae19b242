"""What the monitor saw, recorded as JSON lines (``spoc monitor --record``), read back for
``spoc replay`` and exported as CSV or JSON.

The file is appendable and safe on a crash: each record is one line, written and flushed as it
comes (and synced to disk every few seconds), so a killed monitor loses at most the line it was
writing, which the reader skips. Each session opens with a header line; a file may hold several
sessions one after the other. Records hold the monitor's snapshots (the windowed views, not the
raw expositions: a few KB a second), sources by their redacted names, never an API key.

Line shapes::

    {"spoc_record": 1, "t": ..., "title": ..., "window_s": ..., "interval_s": ..., "sla": ...}
    {"t": ..., "kind": "servers", "tick": <VllmTick>}
    {"t": ..., "kind": "gpus", "tick": <GpuTick>, "groups": [[0, 1], ...], "note": ...}
    {"t": ..., "kind": "status", "status": <SourceStatus>}
    {"t": ..., "kind": "headroom", "headroom": {source: {"line": ..., "estimate": ..., "identified": ...}}}

The headroom records (each server's live headroom, every time it was worked out) came later in
the same format 1: a reader from before them skips those lines and plays the rest.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import time
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Union

from spoc_tui.core.errors import InputError
from spoc_tui.core.files import FileReadError, parse_json, require_regular
from spoc_tui.core.jsonsafe import json_safe
from spoc_tui.core.monitor.model import HeadroomShown
from spoc_tui.core.monitor.snapshots import GpuTick, SourceStatus, VllmTick

FORMAT = 1
NOT_A_RECORDING = "not a spoc recording (write one with spoc monitor --record FILE)"
SYNC_EVERY_S = 5.0


class RecordingError(InputError):
    """A file that is not a spoc recording, or cannot be read or written."""


# -- the codec: frozen dataclasses <-> JSON ---------------------------------------------------------------
def encode(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, frozenset, set)):
        items = sorted(obj) if isinstance(obj, (frozenset, set)) else obj
        return [encode(v) for v in items]
    return obj


_HINTS: dict[type, dict[str, Any]] = {}


class DecodeError(ValueError):
    """A record whose values are not of their fields' types (a file edited or written by
    something else): the reader skips its line, as it does a line cut short."""


_LEAVES: dict[type, Callable[[object], bool]] = {
    bool: lambda d: isinstance(d, bool),
    int: lambda d: isinstance(d, int) and not isinstance(d, bool),
    float: lambda d: isinstance(d, (int, float)) and not isinstance(d, bool),  # NaN is recorded as it was seen
    str: lambda d: isinstance(d, str),
}
"""Each plain type's check: a bool is not a number, an int is a float."""


def _leaf(tp: Any, data: Any) -> Any:
    """A plain value checked against its type (other types pass as they are)."""
    check = _LEAVES.get(tp)
    if check is not None and not check(data):
        raise DecodeError(f"{data!r} is not a {getattr(tp, '__name__', tp)}")
    return float(data) if tp is float else data


def decode(tp: Any, data: Any) -> Any:
    """``data`` (from :func:`encode`) as an instance of type ``tp``.

    Raises:
        DecodeError (a ValueError): a value not of its type, or None where the type has none.
    """
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        if data is None:
            return None
        return decode(inner[0], data) if len(inner) == 1 else data
    if data is None:
        raise DecodeError(f"no value where a {getattr(tp, '__name__', tp)} is wanted")
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(data, dict):
            raise DecodeError(f"{tp.__name__} is not an object")
        hints = _HINTS.get(tp)
        if hints is None:
            hints = _HINTS[tp] = typing.get_type_hints(tp)
        kwargs = {f.name: decode(hints[f.name], data[f.name]) for f in dataclasses.fields(tp) if f.name in data}
        return tp(**kwargs)
    if origin in (tuple, list, frozenset) and not isinstance(data, list):
        raise DecodeError(f"{data!r} is not a list")
    args = typing.get_args(tp)
    if origin is tuple:
        return tuple(decode(args[0], v) for v in data) if args else tuple(data)
    if origin is frozenset:
        return frozenset(decode(args[0], v) for v in data) if args else frozenset(data)
    if origin is list:
        return [decode(args[0], v) for v in data]
    if origin is dict:
        if not isinstance(data, dict):
            raise DecodeError(f"{data!r} is not an object")
        return {k: decode(args[1], v) for k, v in data.items()}
    if origin is typing.Literal:
        if data not in args:
            raise DecodeError(f"{data!r} is not one of {args}")
        return data
    return _leaf(tp, data)


# -- writing -----------------------------------------------------------------------------------------------
class Recorder:
    """Appends records to ``path``; every line flushed, synced to disk every few seconds."""

    def __init__(self, path: str | Path, header: dict[str, Any]) -> None:
        self.path = Path(path)
        try:
            require_regular(self.path)  # a device cannot be synced to disk, nor replayed
        except FileReadError as e:
            raise RecordingError(f"--record {path}: {e}") from None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._f: IO[str] = self.path.open("a", encoding="utf-8")
        except OSError as e:
            raise RecordingError(f"--record {path}: cannot write ({e.strerror or e})") from None
        self._synced = time.monotonic()
        self.lines = 0
        self._write({"spoc_record": FORMAT, "t": time.time(), **header})

    def _write(self, obj: dict[str, Any]) -> None:
        self._f.write(json.dumps(json_safe(obj), separators=(",", ":"), allow_nan=False) + "\n")
        self._f.flush()
        self.lines += 1
        now = time.monotonic()
        if now - self._synced >= SYNC_EVERY_S:
            os.fsync(self._f.fileno())
            self._synced = now

    def _record(self, kind: str, t: float | None, **fields: Any) -> None:
        """One record, stamped now unless ``t`` is given."""
        self._write({"t": time.time() if t is None else t, "kind": kind, **fields})

    def servers(self, tick: VllmTick, t: float | None = None) -> None:
        self._record("servers", t, tick=encode(tick))

    def gpus(self, tick: GpuTick, groups: Sequence[Sequence[int]], note: str | None, t: float | None = None) -> None:
        self._record("gpus", t, tick=encode(tick), groups=[list(g) for g in groups], note=note)

    def status(self, status: SourceStatus, t: float | None = None) -> None:
        self._record("status", t, status=encode(status))

    def headroom(self, results: dict[str, HeadroomShown], t: float | None = None) -> None:
        self._record("headroom", t, headroom={src: dataclasses.asdict(h) for src, h in results.items()})

    def close(self) -> None:
        if not self._f.closed:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()


# -- reading -----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Record:
    t: float
    kind: str
    """servers, gpus, status or headroom."""
    servers: VllmTick | None = None
    gpus: GpuTick | None = None
    groups: tuple[tuple[int, ...], ...] = ()
    note: str | None = None
    status: SourceStatus | None = None
    headroom: dict[str, HeadroomShown] | None = None


@dataclass
class Recording:
    path: Path
    headers: list[dict[str, Any]]
    records: list[Record]
    skipped: int = 0
    """Lines that could not be read (a torn last line after a crash)."""

    @property
    def start(self) -> float:
        return self.records[0].t if self.records else 0.0

    @property
    def end(self) -> float:
        return self.records[-1].t if self.records else 0.0


def read_recording(path: str | Path) -> Recording:
    """Every session in the file, in order.

    Raises:
        RecordingError: unreadable, not a recording, or no record in it.
    """
    p = Path(path)
    try:
        require_regular(p)
        f = p.open("rb")  # line by line: one line that is not UTF-8 (a torn write) is skipped, not fatal
    except FileReadError as e:
        raise RecordingError(f"{path}: cannot read ({e})") from None
    except OSError as e:
        raise RecordingError(f"{path}: cannot read ({e.strerror or e})") from None
    headers: list[dict[str, Any]] = []
    records: list[Record] = []
    skipped = 0
    with f:
        for i, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = parse_json(raw.decode("utf-8"))
                if not isinstance(obj, dict):
                    raise ValueError("not an object")
                if "spoc_record" in obj:
                    if obj["spoc_record"] != FORMAT:
                        raise RecordingError(
                            f"{path} line {i}: recording format {obj['spoc_record']}, this spoc reads {FORMAT}"
                        )
                    headers.append(obj)
                    continue
                if not headers:
                    raise RecordingError(f"{path}: {NOT_A_RECORDING}")
                records.append(_record(obj))
            except RecordingError:
                raise
            except (ValueError, KeyError, TypeError):
                if not headers:
                    raise RecordingError(f"{path}: {NOT_A_RECORDING}") from None
                skipped += 1
    if not headers:
        raise RecordingError(f"{path}: empty, not a spoc recording")
    if not records:
        raise RecordingError(f"{path}: a recording with no data in it yet")
    records.sort(key=lambda r: r.t)
    return Recording(p, headers, records, skipped)


def _record(obj: dict[str, Any]) -> Record:
    """One record; ValueError, KeyError or TypeError where it is not one (skipped and counted)."""
    t = float(obj["t"])
    if not math.isfinite(t):  # a record at an infinite time broke the replay's clock (issue 74)
        raise ValueError(f"a record at t={t}")
    kind = obj["kind"]
    if kind == "servers":
        return Record(t, kind, servers=decode(VllmTick, obj["tick"]))
    if kind == "gpus":
        groups = tuple(tuple(int(x) for x in g) for g in obj.get("groups") or ())
        return Record(t, kind, gpus=decode(GpuTick, obj["tick"]), groups=groups, note=obj.get("note"))
    if kind == "status":
        return Record(t, kind, status=decode(SourceStatus, obj["status"]))
    if kind == "headroom":
        if not isinstance(obj["headroom"], dict) or not all(isinstance(h, dict) for h in obj["headroom"].values()):
            raise TypeError("a headroom record's servers are not an object of objects")
        shown = {
            str(src): HeadroomShown(
                str(h["line"]),
                None if h.get("estimate") is None else float(h["estimate"]),
                bool(h["identified"]),
                str(h.get("ledger") or ""),
                bool(h.get("fresh", True)),
            )
            for src, h in obj["headroom"].items()
        }
        return Record(t, kind, headroom=shown)
    raise ValueError(f"unknown record kind {kind!r}")


# -- export ------------------------------------------------------------------------------------------------
SERVER_COLUMNS = (
    "running",
    "waiting",
    "kv_cache_usage",
    "prefix_cache_hit_rate",
    "preemptions_rate",
    "prompt_tokens_rate",
    "generation_tokens_rate",
    "shed_rate",
)
GPU_COLUMNS = ("temp_c", "sm_clock_mhz", "power_w", "power_limit_w", "util_pct", "fb_used_mib")


def rows(rec: Recording) -> Iterator[dict[str, Any]]:
    """One flat row per server or GPU per record: time, source, figures (latency p50/p90/p99 in s)."""
    for r in rec.records:
        if r.servers is not None:
            for s in r.servers.servers:
                v = s.total
                row: dict[str, Any] = {"t": round(r.t, 3), "kind": "server", "source": s.source, "gpu": ""}
                row["stale"] = s.source in r.servers.stale
                for c in SERVER_COLUMNS:
                    row[c] = getattr(v, c)
                for m in ("ttft", "itl", "tpot", "e2e"):
                    lat = v.latency.get(m)
                    for q in ("p50", "p90", "p99"):
                        row[f"{m}_{q}"] = getattr(lat, q) if lat else None
                yield row
        if r.gpus is not None:
            for g in r.gpus.gpus:
                row = {"t": round(r.t, 3), "kind": "gpu", "source": g.source, "gpu": g.gpu}
                row["stale"] = g.source in r.gpus.stale
                for c in GPU_COLUMNS:
                    row[c] = getattr(g, c)
                row["throttle"] = ",".join(g.throttle_reasons or [])
                yield row


def export(rec: Recording, fmt: str) -> str:
    """``csv`` (one row per server or GPU per record) or ``json`` (the records as decoded)."""
    if fmt == "json":
        out = {
            "sessions": rec.headers,
            "records": [
                {"t": r.t, "kind": r.kind, **({"servers": encode(r.servers)} if r.servers else {}),
                 **({"gpus": encode(r.gpus)} if r.gpus else {}), **({"status": encode(r.status)} if r.status else {}),
                 **({"headroom": {k: dataclasses.asdict(h) for k, h in r.headroom.items()}} if r.headroom else {})}
                for r in rec.records
            ],
        }  # fmt: skip
        return json.dumps(json_safe(out), indent=1, allow_nan=False)  # JSON has no NaN (issue 74)
    cols = ["t", "kind", "source", "gpu", "stale", *SERVER_COLUMNS]
    cols += [f"{m}_{q}" for m in ("ttft", "itl", "tpot", "e2e") for q in ("p50", "p90", "p99")]
    cols += [*GPU_COLUMNS, "throttle"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore")
    w.writeheader()
    for row in rows(rec):
        w.writerow(row)
    return buf.getvalue()
