"""Reading a PyTorch profiler trace (Chrome trace JSON, optionally gzipped) as a stream.

Traces of real models run to gigabytes, so the file is never loaded whole: the top-level
object is walked key by key, and the ``traceEvents`` array one event at a time (the C JSON
decoder on a sliding buffer). What the analysis needs is kept in flat arrays (about 30 bytes an
event); a kernel's name is kept once per distinct name.

Event kinds read (the Kineto format torch writes and vLLM's profiler saves):

* ``cat`` ``kernel``, ``gpu_memcpy``, ``gpu_memset``: device activity (GPU traces);
* ``cat`` ``cpu_op``: operators on host threads (the vLLM CPU build's "kernels" are these, e.g.
  ``_C::onednn_mm``);
* ``cat`` ``user_annotation`` / ``gpu_user_annotation`` named ``execute_…``: vLLM's per-step
  annotation (``execute_context_N(T)_generation_M(G)``), on the host and, for GPU traces, on the
  device timeline.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from spoc_tui.core.errors import InputError
from spoc_tui.core.files import FileReadError, require_regular

CHUNK = 1 << 20
MAX_EVENT_BYTES = 64 << 20
DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
STEP_CATS = frozenset({"user_annotation", "gpu_user_annotation"})
_STEP = re.compile(r"^execute_(?:\d+_)?context_(\d+)\((?:sq)?(\d+).*?\)_generation_(\d+)\((?:sq)?(\d+)")


class TraceError(InputError):
    """An unreadable, partial or foreign trace file (exit code 2)."""


@dataclass
class Steps:
    """vLLM's step annotations on one timeline."""

    ts: array[float] = field(default_factory=lambda: array("d"))
    end: array[float] = field(default_factory=lambda: array("d"))
    ctx_reqs: array[int] = field(default_factory=lambda: array("q"))
    ctx_tokens: array[int] = field(default_factory=lambda: array("q"))
    gen_reqs: array[int] = field(default_factory=lambda: array("q"))
    gen_tokens: array[int] = field(default_factory=lambda: array("q"))
    thread: array[int] = field(default_factory=lambda: array("q"))

    def add(self, ts: float, dur: float, m: re.Match[str], thread: int) -> None:
        self.ts.append(ts)
        self.end.append(ts + dur)
        self.ctx_reqs.append(int(m.group(1)))
        self.ctx_tokens.append(int(m.group(2)))
        self.gen_reqs.append(int(m.group(3)))
        self.gen_tokens.append(int(m.group(4)))
        self.thread.append(thread)

    def __len__(self) -> int:
        return len(self.ts)


@dataclass
class Intervals:
    """Events on one kind of timeline: start, end (µs), lane (device/stream or thread), name id."""

    ts: array[float] = field(default_factory=lambda: array("d"))
    end: array[float] = field(default_factory=lambda: array("d"))
    lane: array[int] = field(default_factory=lambda: array("q"))
    name: array[int] = field(default_factory=lambda: array("q"))

    def add(self, ts: float, dur: float, lane: int, name: int) -> None:
        self.ts.append(ts)
        self.end.append(ts + dur)
        self.lane.append(lane)
        self.name.append(name)

    def __len__(self) -> int:
        return len(self.ts)


@dataclass
class TraceData:
    path: str
    names: list[str] = field(default_factory=list)
    """Distinct event names; ``Intervals.name`` indexes this list."""
    device: Intervals = field(default_factory=Intervals)
    """Kernels, copies and memsets; lane = device index."""
    host: Intervals = field(default_factory=Intervals)
    """``cpu_op`` events; lane = thread key (see :attr:`threads`)."""
    threads: list[tuple[Any, Any]] = field(default_factory=list)
    """(pid, tid) of each host lane."""
    host_steps: Steps = field(default_factory=Steps)
    device_steps: Steps = field(default_factory=Steps)
    events: int = 0
    bytes_read: int = 0
    device_names: dict[int, str] = field(default_factory=dict)
    """Device index -> name, from ``deviceProperties``."""
    _name_ids: dict[str, int] = field(default_factory=dict, repr=False)
    _thread_ids: dict[tuple[Any, Any], int] = field(default_factory=dict, repr=False)

    def name_id(self, name: str) -> int:
        i = self._name_ids.get(name)
        if i is None:
            i = self._name_ids[name] = len(self.names)
            self.names.append(name)
        return i

    def thread_id(self, key: tuple[Any, Any]) -> int:
        i = self._thread_ids.get(key)
        if i is None:
            i = self._thread_ids[key] = len(self.threads)
            self.threads.append(key)
        return i


def _open(path: Path) -> IO[str]:
    try:
        require_regular(path)
    except FileReadError as e:
        raise TraceError(f"{path}: {e}") from None
    try:
        raw = path.open("rb")
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror})") from None
    head = raw.read(2)
    raw.seek(0)
    stream: IO[bytes] = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw  # type: ignore[assignment]
    return io.TextIOWrapper(stream, encoding="utf-8", errors="strict")


class _Reader:
    """A sliding text buffer over a stream, decoding one JSON value at a time."""

    def __init__(self, f: IO[str], path: Path) -> None:
        self.f = f
        self.path = path
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.consumed = 0
        self.decoder = json.JSONDecoder()

    def _more(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.f.read(CHUNK)
        except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile) as e:
            raise TraceError(f"{self.path}: unreadable trace ({e})") from None
        if not chunk:
            self.eof = True
            return False
        if self.pos > CHUNK:
            self.consumed += self.pos
            self.buf = self.buf[self.pos :]
            self.pos = 0
        self.buf += chunk
        return True

    def where(self) -> str:
        return f"character {self.consumed + self.pos:,}"

    def skip_ws(self) -> None:
        while True:
            n = len(self.buf)
            while self.pos < n and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < n or not self._more():
                return

    def peek(self) -> str:
        self.skip_ws()
        if self.pos >= len(self.buf):
            raise TraceError(f"{self.path}: the trace ends early ({self.where()}): partial or still being written")
        return self.buf[self.pos]

    def expect(self, ch: str) -> None:
        c = self.peek()
        if c != ch:
            raise TraceError(f"{self.path}: not a Chrome/PyTorch trace: {ch!r} expected at {self.where()}, got {c!r}")
        self.pos += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                v, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as e:
                if not self._truncated(e):
                    raise TraceError(f"{self.path}: malformed JSON at {self.where()}: {e.msg}") from None
                if len(self.buf) - self.pos > MAX_EVENT_BYTES:
                    raise TraceError(f"{self.path}: one JSON value is over 64 MB at {self.where()}") from None
                if not self._more():
                    raise TraceError(
                        f"{self.path}: the trace ends early ({self.where()}): partial or still being written"
                    ) from None
                continue
            if end >= len(self.buf) and not self.eof and self._more():
                continue  # a number at the buffer's end may go on in the next chunk
            self.pos = end
            return v

    def _truncated(self, e: json.JSONDecodeError) -> bool:
        """An error a longer buffer could cure (the value runs to the buffer's end)."""
        return e.pos >= len(self.buf) - 1 or "Unterminated string" in e.msg


def iter_events(path: Path) -> Iterator[dict[str, Any]]:
    """Each object of the trace's ``traceEvents`` array, in file order, plus one
    ``{"__deviceProperties__": [...]}`` pseudo-event when the trace has that key."""
    with _open(path) as f:
        r = _Reader(f, path)
        r.expect("{")
        seen = False
        if r.peek() == "}":
            raise TraceError(f"{path}: an empty JSON object, not a trace")
        while True:
            key = r.value()
            if not isinstance(key, str):
                raise TraceError(f"{path}: not a Chrome/PyTorch trace (a key expected at {r.where()})")
            r.expect(":")
            if key == "traceEvents":
                seen = True
                r.expect("[")
                if r.peek() == "]":
                    r.pos += 1
                else:
                    while True:
                        ev = r.value()
                        if isinstance(ev, dict):
                            yield ev
                        c = r.peek()
                        r.pos += 1
                        if c == "]":
                            break
                        if c != ",":
                            raise TraceError(f"{path}: malformed traceEvents array at {r.where()}")
            else:
                v = r.value()
                if key == "deviceProperties" and isinstance(v, list):
                    yield {"__deviceProperties__": v}
            c = r.peek()
            r.pos += 1
            if c == "}":
                break
            if c != ",":
                raise TraceError(f"{path}: malformed JSON object at {r.where()}")
        if not seen:
            raise TraceError(f"{path}: no traceEvents: not a Chrome/PyTorch trace")


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        try:
            return float(v) if isinstance(v, str) else None
        except ValueError:
            return None
    return float(v)


def _thread(ev: dict[str, Any]) -> tuple[Any, Any]:
    """An event's (process, thread), each a number or a name as the profiler wrote it (a value of
    another shape is its text: one lane, not an unhashable key)."""
    pid, tid = (v if isinstance(v, (int, float, str)) or v is None else str(v) for v in (ev.get("pid"), ev.get("tid")))
    return pid, tid


def read_trace(path: Path | str) -> TraceData:
    """Stream ``path`` into flat arrays (bounded memory: a few tens of bytes an event)."""
    p = Path(path)
    data = TraceData(str(p))
    for ev in iter_events(p):
        props = ev.get("__deviceProperties__")
        if props is not None:
            for d in props:
                if isinstance(d, dict) and isinstance(d.get("id"), int) and isinstance(d.get("name"), str):
                    data.device_names[d["id"]] = d["name"]
            continue
        data.events += 1
        if ev.get("ph") != "X":
            continue
        cat = ev.get("cat")
        if not isinstance(cat, str):
            continue
        ts, dur = _num(ev.get("ts")), _num(ev.get("dur"))
        if ts is None or dur is None or dur < 0:
            continue
        name = ev.get("name")
        if not isinstance(name, str):
            continue
        if cat in DEVICE_CATS:
            args = ev.get("args")
            dev = args.get("device") if isinstance(args, dict) else None
            pid = ev.get("pid")
            lane: int = dev if isinstance(dev, int) else (pid if isinstance(pid, int) else 0)
            data.device.add(ts, dur, lane, data.name_id(name))
        elif cat == "cpu_op":
            lane = data.thread_id(_thread(ev))
            data.host.add(ts, dur, lane, data.name_id(name))
        elif cat in STEP_CATS and name.startswith("execute_"):
            m = _STEP.match(name)
            if m is None:
                continue
            if cat == "gpu_user_annotation":
                data.device_steps.add(ts, dur, m, 0)
            else:
                data.host_steps.add(ts, dur, m, data.thread_id(_thread(ev)))
    return data
