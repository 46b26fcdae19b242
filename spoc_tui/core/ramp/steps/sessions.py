"""A step's sessions: agent sessions (chains of model calls with a tool's time between them) or
multi-turn conversations, as the calls in the step's window show them (issue 53)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spoc_tui.core.confidence import Interval, proportion_interval
from spoc_tui.core.ramp.steps.codec import Json, json_float, json_int, json_interval
from spoc_tui.core.ramp.steps.sample import RequestSample


@dataclass(frozen=True, slots=True)
class Sessions:
    """The sessions with a call in a step's window.

    A session is *whole* in the window when its first call was sent in it and its last call (the
    one its profile or trace planned last) answered in it: only those are judged on every call,
    and only those split their time between the engine and what came between the calls."""

    active: int
    """Sessions with a call answered in the window."""
    started: int
    """Of those, the sessions whose first call was among them."""
    finished: int | None
    """Of those, the sessions whose last call was among them (None: the calls do not say which
    is a session's last, as a request log's do not)."""
    whole: int
    all_met: int
    """Whole sessions whose every call met the SLA (the goodput rule, call by call)."""
    all_met_ci95: Interval
    """95 % interval of the share ``all_met / whole`` (Clopper-Pearson)."""
    calls: float | None
    """Calls in a whole session, on average."""
    engine_s: float
    """The whole sessions' time with a call of theirs in flight (overlapping calls, as parallel
    sub-agents' are, counted once)."""
    between_s: float
    """The whole sessions' time with none in flight: the tools', the agent's own."""

    @property
    def all_met_share(self) -> float | None:
        return self.all_met / self.whole if self.whole else None

    @property
    def engine_share(self) -> float | None:
        total = self.engine_s + self.between_s
        return self.engine_s / total if total > 0 else None

    def as_dict(self) -> dict[str, object]:
        return {
            "active": self.active,
            "started": self.started,
            "finished": self.finished,
            "whole": self.whole,
            "all_met": self.all_met,
            "all_met_share": self.all_met_share,
            "all_met_ci95": list(self.all_met_ci95),
            "calls": self.calls,
            "engine_s": self.engine_s,
            "between_s": self.between_s,
            "engine_share": self.engine_share,
        }

    @classmethod
    def from_dict(cls, d: Json) -> Sessions:
        return cls(
            active=json_int(d, "active") or 0,
            started=json_int(d, "started") or 0,
            finished=json_int(d, "finished"),
            whole=json_int(d, "whole") or 0,
            all_met=json_int(d, "all_met") or 0,
            all_met_ci95=json_interval(d.get("all_met_ci95")),
            calls=json_float(d, "calls"),
            engine_s=json_float(d, "engine_s") or 0.0,
            between_s=json_float(d, "between_s") or 0.0,
        )

    def line(self) -> str:
        """``sessions: 14 active, 9 started, 8 finished; 6 whole: every call met the SLA in 5 (83 %,
        95 %: 36-100 %); 5.2 calls each, 31 % of their time in the engine, 69 % between calls``."""
        fin = "" if self.finished is None else f", {self.finished} finished"
        head = f"sessions: {self.active} active, {self.started} started{fin}"
        if not self.whole:
            why = "" if self.finished is not None else " (the calls do not say which is a session's last)"
            return f"{head}; none whole in the step{why}: measure longer steps to judge whole sessions"
        lo, hi = self.all_met_ci95
        share = f"{self.all_met / self.whole * 100:.0f} %, 95 %: {share_text(lo)}-{share_text(hi)}"
        calls = f"{self.calls:.1f} calls each" if self.calls is not None else ""
        eng = self.engine_share
        time_split = (
            f", {eng * 100:.0f} % of their time in the engine, {100 - eng * 100:.0f} % between calls"
            if eng is not None
            else ""
        )
        return f"{head}; {self.whole} whole: every call met the SLA in {self.all_met} ({share}); {calls}{time_split}"


def share_text(v: float | None) -> str:
    """``83 %``, or ``?`` for a side the sample cannot bound (the line's and the report's)."""
    return "?" if v is None else f"{v * 100:.0f} %"


def _busy(spans: list[tuple[float, float]]) -> float:
    """The length of the union of ``spans``."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def sessions_of(samples: Sequence[RequestSample], meets: Callable[[RequestSample], bool]) -> Sessions | None:
    """The sessions of a step's window (``meets``: a call met the SLA); None when no session made
    more than one call here (single-shot requests have no sessions to speak of)."""
    named = [s for s in samples if s.conversation]
    # no conversation made two calls here and each call is a first one (a trace replay's rows):
    # told without grouping them
    if len({s.conversation for s in named}) == len(named) and all(s.turn == 0 and s.last is not False for s in named):
        return None
    by: dict[str, list[RequestSample]] = {}
    for s in named:
        by.setdefault(s.conversation, []).append(s)
    knows_last = any(s.last is not None for s in samples)
    started = finished = whole = all_met = 0
    n_calls = 0
    engine = between = 0.0
    for calls in by.values():
        first = any(c.turn == 0 for c in calls)
        # a session ends at its last call, or at a failed one (the load generator ends it there)
        last = any(c.last or not c.ok for c in calls)
        started += first
        finished += last
        if not (first and last):
            continue
        turns = {c.turn for c in calls}
        if len(turns) != max(turns) + 1:  # a call of it fell outside the window: not whole here
            continue
        whole += 1
        n_calls += len(calls)
        all_met += all(meets(c) for c in calls)
        spans = [(c.start, c.end if c.end is not None else c.start + (c.e2e or 0.0)) for c in calls]
        busy = _busy(spans)
        engine += busy
        between += max(0.0, max(b for _, b in spans) - min(a for a, _ in spans) - busy)
    return Sessions(
        active=len(by),
        started=started,
        finished=finished if knows_last else None,
        whole=whole,
        all_met=all_met,
        all_met_ci95=proportion_interval(all_met, whole) if whole else (None, None),
        calls=n_calls / whole if whole else None,
        engine_s=engine,
        between_s=between,
    )
