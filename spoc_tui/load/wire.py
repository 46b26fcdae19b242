"""The messages between a ramp and its Locust runner child, one JSON object per line.

Commands go to the child's stdin, events come back on its stdout. Each message is a frozen
dataclass defined here once; :func:`encode` and the two decoders are the only code that knows
the JSON shape:

- commands: ``{"cmd": "users", "n": 8, "step": 2, "spawn_rate": 4.0, "arrival_rate": null}`` (a trace
  replay's adds ``"speed": 2.0, "t0": <wall time>``), ``{"cmd": "stop"}``
- events: ``{"type": "ready", "workers": 0, "lengths": "exact: ..."}``,
  ``{"type": "sample", ...}`` (a request's fields),
  ``{"type": "users", "n": 8, "step": 2}``, ``{"type": "error", "message": ...}``,
  ``{"type": "stopped"}``, ``{"type": "trace_done", "step": 2, "rows": ..., "sent": ..., ...}``

This module is imported by the gevent-patched child too: standard library and the pure core only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from spoc_tui.core.errors import SpocError
from spoc_tui.core.ramp.steps import RequestSample


class WireError(SpocError):
    """A line that is not a message of this protocol."""


@dataclass(frozen=True, slots=True)
class SetUsers:
    """Run ``n`` users from now on, as step ``step``, adding (or stopping) ``spawn_rate`` a second."""

    n: int
    step: int
    spawn_rate: float = 0.0
    """Users per second; 0: all at once."""
    rate: float | None = None
    """Open loop: the ``n`` users together generate Poisson arrivals at this many requests/s."""
    speed: float | None = None
    """Trace replay: send the trace's rows at their timestamps divided by this."""
    t0: float | None = None
    """Trace replay: the wall time the trace's 0 is sent at (one clock for every process)."""


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop the users and exit."""


Command = SetUsers | Stop


@dataclass(frozen=True, slots=True)
class Ready:
    """The runner (and its ``workers`` Locust workers) can take commands."""

    workers: int = 0
    lengths: str = ""
    """How prompt lengths are made: exact (and from what) or approximate, and why."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One finished (or failed) request."""

    sample: RequestSample


@dataclass(frozen=True, slots=True)
class UsersSet:
    """The runner is ramping to ``n`` users for step ``step``."""

    n: int
    step: int


@dataclass(frozen=True, slots=True)
class RunnerFailed:
    """The runner could not do what it was told (a bad command, workers that never joined)."""

    message: str


@dataclass(frozen=True, slots=True)
class Stopped:
    """The users have stopped; the runner exits."""


@dataclass(frozen=True, slots=True)
class Exited:
    """The runner's output ended (it exited); made by the reading side, never sent."""


@dataclass(frozen=True, slots=True)
class Health:
    """A load-generator process watching itself over the last second: its CPU time so far
    (seconds, cumulative) and the lags of its event loop (ms: how late 50 ms sleeps woke)."""

    t: float
    """Wall time."""
    cpu_s: float
    lags_ms: tuple[float, ...]
    process: str = "main"
    stale: int = 0
    """Requests it has in flight that an earlier step sent (a step down waits for them to end)."""


@dataclass(frozen=True, slots=True)
class TraceDone:
    """A process finished replaying the trace for a step: every row of its share was sent (or
    skipped) and every request it sent has ended."""

    step: int
    rows: int
    sent: int
    skipped: dict[str, int]
    prefix_tokens: int = 0
    """Input tokens in blocks an earlier row of the step sent (what the trace implies is cached)."""
    input_tokens: int = 0
    """Input tokens of the rows with hash ids (the share's denominator)."""
    process: str = "main"


Event = Ready | Sample | UsersSet | RunnerFailed | Stopped | Exited | Health | TraceDone


def encode(msg: Command | Event) -> str:
    """One line of JSON (without the newline)."""
    d: dict[str, Any]
    if isinstance(msg, SetUsers):
        d = {"cmd": "users", "n": msg.n, "step": msg.step, "spawn_rate": msg.spawn_rate, "arrival_rate": msg.rate}
        if msg.speed is not None:
            d["speed"], d["t0"] = msg.speed, msg.t0
    elif isinstance(msg, Stop):
        d = {"cmd": "stop"}
    elif isinstance(msg, Ready):
        d = {"type": "ready", "workers": msg.workers, "lengths": msg.lengths}
    elif isinstance(msg, Sample):
        d = {"type": "sample", **msg.sample.as_dict()}
        # The gaps as whole microseconds: a third of the bytes and of the encoding time of float
        # seconds (the runner encodes on the loop that timestamps every stream)
        d["itl_us"] = [round(g * 1e6) for g in msg.sample.itl]
        del d["itl"]
    elif isinstance(msg, UsersSet):
        d = {"type": "users", "n": msg.n, "step": msg.step}
    elif isinstance(msg, RunnerFailed):
        d = {"type": "error", "message": msg.message}
    elif isinstance(msg, Stopped):
        d = {"type": "stopped"}
    elif isinstance(msg, TraceDone):
        d = {
            "type": "trace_done",
            "step": msg.step,
            "rows": msg.rows,
            "sent": msg.sent,
            "skipped": msg.skipped,
            "prefix_tokens": msg.prefix_tokens,
            "input_tokens": msg.input_tokens,
            "process": msg.process,
        }
    elif isinstance(msg, Health):
        d = {
            "type": "health",
            "t": msg.t,
            "cpu_s": msg.cpu_s,
            "lags_ms": list(msg.lags_ms),
            "process": msg.process,
            "stale": msg.stale,
        }
    else:
        raise WireError(f"{type(msg).__name__} is not sent over the wire")
    return json.dumps(d, separators=(",", ":"))


def _object(line: str | bytes) -> dict[str, Any]:
    try:
        d = json.loads(line)
    except ValueError:
        raise WireError(f"not JSON: {line[:80]!r}") from None
    if not isinstance(d, dict):
        raise WireError(f"not a JSON object: {line[:80]!r}")
    return d


def _int(d: dict[str, Any], key: str, default: int = 0) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise WireError(f"{key} must be a number, got {v!r}")
    return int(v)


def decode_command(line: str | bytes) -> Command:
    """Raises: WireError for a line that is not a command."""
    d = _object(line)
    cmd = d.get("cmd")
    if cmd == "users":
        rate = d.get("spawn_rate", 0.0)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate < 0:
            raise WireError(f"spawn_rate must be a number of users per second, got {rate!r}")
        arrivals = d.get("arrival_rate")
        if arrivals is not None and (
            isinstance(arrivals, bool) or not isinstance(arrivals, (int, float)) or not arrivals > 0
        ):
            raise WireError(f"arrival_rate must be a positive number of requests per second, got {arrivals!r}")
        speed, t0 = d.get("speed"), d.get("t0")
        if speed is not None and (
            isinstance(speed, bool)
            or not isinstance(speed, (int, float))
            or not speed > 0
            or not isinstance(t0, (int, float))
        ):
            raise WireError(f"speed must be a positive number with a t0, got {speed!r}, {t0!r}")
        return SetUsers(
            _int(d, "n"),
            _int(d, "step"),
            float(rate),
            None if arrivals is None else float(arrivals),
            None if speed is None else float(speed),
            None if t0 is None else float(t0),
        )
    if cmd == "stop":
        return Stop()
    raise WireError(f"unknown command {cmd!r}")


def decode_event(line: str | bytes) -> Event:
    """Raises: WireError for a line that is not an event."""
    d = _object(line)
    kind = d.get("type")
    if kind == "sample":
        us = d.pop("itl_us", None)
        if us is not None:
            if not isinstance(us, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in us):
                raise WireError("sample: itl_us must be a list of whole microseconds")
            d["itl"] = [x / 1e6 for x in us]
        return Sample(RequestSample.from_dict(d))
    if kind == "ready":
        return Ready(_int(d, "workers"), str(d.get("lengths") or ""))
    if kind == "users":
        return UsersSet(_int(d, "n"), _int(d, "step"))
    if kind == "error":
        return RunnerFailed(str(d.get("message", "")))
    if kind == "stopped":
        return Stopped()
    if kind == "trace_done":
        skipped = d.get("skipped") or {}
        if not isinstance(skipped, dict) or not all(isinstance(v, int) for v in skipped.values()):
            raise WireError("trace_done: skipped must map reasons to counts")
        return TraceDone(
            _int(d, "step"),
            _int(d, "rows"),
            _int(d, "sent"),
            {str(k): int(v) for k, v in skipped.items()},
            _int(d, "prefix_tokens"),
            _int(d, "input_tokens"),
            str(d.get("process", "main")),
        )
    if kind == "health":
        lags = d.get("lags_ms")
        if not isinstance(lags, list) or not all(isinstance(x, (int, float)) for x in lags):
            raise WireError("health: lags_ms must be a list of numbers")
        t, cpu, stale = d.get("t"), d.get("cpu_s"), d.get("stale", 0)
        if not isinstance(t, (int, float)) or not isinstance(cpu, (int, float)):
            raise WireError("health: t and cpu_s must be numbers")
        if not isinstance(stale, int) or isinstance(stale, bool) or stale < 0:
            raise WireError("health: stale must be a count")
        return Health(float(t), float(cpu), tuple(float(x) for x in lags), str(d.get("process", "main")), stale)
    raise WireError(f"unknown event {kind!r}")
