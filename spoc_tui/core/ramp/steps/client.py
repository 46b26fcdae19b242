"""The load generator's own health during a step (is it the bottleneck?)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from spoc_tui.core.ramp.sla import Limit
from spoc_tui.core.ramp.steps.codec import Json, _obj, json_float, json_int
from spoc_tui.core.ramp.steps.sample import RequestSample


@dataclass(frozen=True, slots=True)
class ProcessHealth:
    """One load-generator process over a step's window."""

    name: str
    cpu_pct: float | None = None
    """CPU use in % of one core."""
    loop_lag_p99_ms: float | None = None
    loop_lag_max_ms: float | None = None


CLIENT_LAG_P99_MS = 1.0
CLIENT_LAG_SHARE = 0.02
CLIENT_CPU_PCT = 90.0
"""A load-generator process that used more than 90 % of a core (Locust's own warning), or whose
event loop woke late at the 99th percentile by more than 2 % of the smallest latency limit being
judged (at least 1 ms; 1 ms without a latency limit), timestamped chunks late enough to move a
verdict: its latencies are not trustworthy. A 1.5 ms lag against a 400 ms limit is not."""


def lag_allowed_ms(limits: Sequence[Limit]) -> float:
    """The loop lag (p99, ms) a load generator may have before its timing error matters against
    ``limits``: 2 % of the smallest latency limit, at least 1 ms."""
    latency = [lim.value for lim in limits if lim.metric != "error_rate"]
    return max(CLIENT_LAG_P99_MS, CLIENT_LAG_SHARE * min(latency) * 1000) if latency else CLIENT_LAG_P99_MS


@dataclass(frozen=True, slots=True)
class ClientHealth:
    """How the load generator's processes fared over a step's window (:func:`client_health`)."""

    processes: tuple[ProcessHealth, ...] = ()
    cpu_pct: float | None = None
    """The busiest process's CPU use."""
    loop_lag_p99_ms: float | None = None
    """The worst process's event-loop lag p99."""
    saturated: bool = False
    reason: str = ""
    sends: int = 0
    """Requests a closed-loop user sent after an answer of its own, in the step (the next figures' sample)."""
    next_send_p50_ms: float | None = None
    next_send_p99_ms: float | None = None
    """From the end of a user's answer to its next send (:attr:`RequestSample.since_answer`)."""
    send_delay_p50_ms: float | None = None
    send_delay_p99_ms: float | None = None
    """Of that, what the client added to the wait the profile asked (the next send's lateness):
    a slow client lowers the load a step of N users really holds (issue 77)."""

    @property
    def sends_text(self) -> str | None:
        """``next send after an answer: p50 3 ms, p99 41 ms (the client's own delay p50 0.4 ms,
        p99 2.1 ms; 118 sends)``, or None where no user sent after an answer."""
        if not self.sends or self.next_send_p50_ms is None or self.next_send_p99_ms is None:
            return None
        own = ""
        if self.send_delay_p50_ms is not None and self.send_delay_p99_ms is not None:
            own = f"the client's own delay p50 {_ms(self.send_delay_p50_ms)}, p99 {_ms(self.send_delay_p99_ms)}; "
        cpu = f"; client CPU {self.cpu_pct:.0f} % of a core" if self.cpu_pct is not None else ""
        return (
            f"next send after an answer: p50 {_ms(self.next_send_p50_ms)}, p99 {_ms(self.next_send_p99_ms)} "
            f"({own}{self.sends} sends){cpu}"
        )

    @property
    def saturated_text(self) -> str | None:
        """``client saturated: timings not trustworthy (...)`` with the remedy, or None."""
        if not self.saturated:
            return None
        return f"client saturated: timings not trustworthy ({self.reason}); add load-generator processes (--workers)"

    def as_dict(self) -> dict[str, object]:
        sends: dict[str, object] = (
            {
                "next_send": {
                    "n": self.sends,
                    "p50_ms": self.next_send_p50_ms,
                    "p99_ms": self.next_send_p99_ms,
                    "delay_p50_ms": self.send_delay_p50_ms,
                    "delay_p99_ms": self.send_delay_p99_ms,
                }
            }
            if self.sends
            else {}
        )
        if not self.processes:
            return sends
        return {
            "processes": {
                p.name: {
                    "cpu_pct": p.cpu_pct,
                    "loop_lag_p99_ms": p.loop_lag_p99_ms,
                    "loop_lag_max_ms": p.loop_lag_max_ms,
                }
                for p in self.processes
            },
            "cpu_pct": self.cpu_pct,
            "loop_lag_p99_ms": self.loop_lag_p99_ms,
            "saturated": self.saturated,
            "reason": self.reason,
            **sends,
        }

    @classmethod
    def from_dict(cls, d: Json) -> ClientHealth:
        procs = _obj(d.get("processes"))
        sends = _obj(d.get("next_send"))
        return cls(
            processes=tuple(
                ProcessHealth(
                    str(k),
                    json_float(_obj(v), "cpu_pct"),
                    json_float(_obj(v), "loop_lag_p99_ms"),
                    json_float(_obj(v), "loop_lag_max_ms"),
                )
                for k, v in procs.items()
            ),
            cpu_pct=json_float(d, "cpu_pct"),
            loop_lag_p99_ms=json_float(d, "loop_lag_p99_ms"),
            saturated=bool(d.get("saturated")),
            reason=str(d.get("reason") or ""),
            sends=json_int(sends, "n") or 0,
            next_send_p50_ms=json_float(sends, "p50_ms"),
            next_send_p99_ms=json_float(sends, "p99_ms"),
            send_delay_p50_ms=json_float(sends, "delay_p50_ms"),
            send_delay_p99_ms=json_float(sends, "delay_p99_ms"),
        )


def _ms(v: float) -> str:
    return f"{v:.1f} ms" if v < 10 else f"{v:,.0f} ms"


def with_sends(client: ClientHealth, samples: Sequence[RequestSample]) -> ClientHealth:
    """``client`` with the step's next sends after an answer (p50 and p99 of
    :attr:`RequestSample.since_answer`, and of what it exceeded the wait asked by)."""
    since = [s.since_answer for s in samples if s.since_answer is not None]
    if not since:
        return client
    late = [s.since_answer - s.asked_wait for s in samples if s.since_answer is not None and s.asked_wait is not None]
    p50, p99 = (round(float(v) * 1000, 3) + 0.0 for v in np.percentile(since, [50, 99]))
    d50 = d99 = None
    if late:  # to the microsecond: a virtual client's is its float arithmetic's, +-1e-12 ms
        d50, d99 = (round(float(v) * 1000, 3) + 0.0 for v in np.percentile(late, [50, 99]))
    return replace(client, sends=len(since), next_send_p50_ms=p50, next_send_p99_ms=p99, send_delay_p50_ms=d50,
                   send_delay_p99_ms=d99)  # fmt: skip


def client_health(
    points: Sequence[tuple[str, float, float, Sequence[float]]],
    limits: Sequence[Limit] = (),
    window: tuple[float, float] | None = None,
    processes: Sequence[str] = (),
    expected: int = 0,
) -> ClientHealth:
    """How the load generator's processes fared over a step's window, from their once-a-second
    reports ``(process, wall time, CPU seconds so far, loop lags in ms)``: CPU use in % of a core,
    loop lag p99 and max per process, and whether any was saturated for the ``limits`` judged
    (:func:`lag_allowed_ms`), and why. Given the ``window`` (the processes known so far, and how
    many are ``expected``: one still unheard of is counted too), a process that sent no report for
    :data:`STALL_S` of it was stalled: its lag shows only once it runs again, after the window (a
    worker stopped 6 s read as a step "too short")."""
    by: dict[str, list[tuple[float, float, Sequence[float]]]] = {}
    for proc, t, cpu, lags in points:
        by.setdefault(proc, []).append((t, cpu, lags))
    stalled = _stalled(by, window, processes, expected) if window is not None else []
    procs: list[ProcessHealth] = []
    for proc, pts in by.items():
        pts.sort(key=lambda p: p[0])
        span = pts[-1][0] - pts[0][0]
        cpu_pct = 100 * (pts[-1][1] - pts[0][1]) / span if len(pts) > 1 and span > 0 else None
        lags = [x for p in pts[1:] for x in p[2]] if len(pts) > 1 else [x for p in pts for x in p[2]]
        procs.append(
            ProcessHealth(
                proc,
                cpu_pct,
                float(np.percentile(lags, 99)) if lags else None,
                max(lags) if lags else None,
            )
        )
    if not procs and not stalled:
        return ClientHealth()
    worst_cpu = max((p.cpu_pct for p in procs if p.cpu_pct is not None), default=None)
    worst_lag = max((p.loop_lag_p99_ms for p in procs if p.loop_lag_p99_ms is not None), default=None)
    why = list(stalled)
    if worst_cpu is not None and worst_cpu > CLIENT_CPU_PCT:
        why.append(f"CPU {worst_cpu:.0f} % of a core")
    allowed = lag_allowed_ms(limits)
    if worst_lag is not None and worst_lag > allowed:
        why.append(f"event-loop lag p99 {worst_lag:.1f} ms, over the {allowed:.1f} ms that matters to the SLA")
    return ClientHealth(tuple(procs), worst_cpu, worst_lag, bool(why), ", ".join(why))


def _stalled(
    by: Mapping[str, Sequence[tuple[float, float, Sequence[float]]]],
    window: tuple[float, float],
    known: Sequence[str],
    expected: int,
) -> list[str]:
    """The processes that sent no report for :data:`STALL_S` or more of ``window``, each said."""
    start, end = window
    out = []
    procs = sorted({*by, *known})
    if (unheard := expected - len(procs)) > 0 and end - start >= STALL_S:
        out.append(f"{unheard} of {expected} load-generator processes sent no report yet: stalled, or never started")
    for proc in procs:
        ts = sorted(t for t, _, _ in by.get(proc, ()) if t >= start)
        seq = [start, *ts] if ts and ts[-1] >= end else [start, *ts, end]
        gap = max(b - a for a, b in zip(seq, seq[1:], strict=False))
        if gap >= STALL_S:
            out.append(f"{proc} sent no report for {gap:.0f} s of the step: stalled (a starved host, or stopped)")
    return out


STALL_S = 3.0
"""A load-generator process reports once a second: this long without a report inside a step's
window, it was stalled, and the step's timings with it."""
SILENT_S = 15.0
"""A load-generator process reports its health every second: silent this long, it is stopped
(SIGSTOP) or hung, and no step can be measured on it."""


def silent(heard: Mapping[str, float], now: float) -> str | None:
    """Why the ramp cannot go on when a load-generator process has gone silent (a stopped one made
    every step read "too short for this profile (raise --step-seconds)": issue 74), naming it;
    None while each has reported within :data:`SILENT_S`."""
    quiet = {proc: now - t for proc, t in heard.items() if now - t > SILENT_S}
    if not quiet:
        return None
    proc, secs = max(quiet.items(), key=lambda kv: kv[1])
    name = "its main process" if proc == "main" else proc
    return (
        f"the load generator ({name}) has reported nothing for {secs:.0f} s: stopped (SIGSTOP?) or hung, "
        "so no step can be measured; see runner.log in the output folder"
    )
