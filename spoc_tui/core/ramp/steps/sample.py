"""One request as the load generator measured it."""

from __future__ import annotations

from dataclasses import dataclass

from spoc_tui.core.ramp.steps.codec import json_float, json_int


@dataclass(frozen=True, slots=True)
class RequestSample:
    """One request as the client saw it (seconds, wall clock for ``start``)."""

    start: float
    step: int
    users: int
    ok: bool
    ttft: float | None = None
    e2e: float | None = None
    itl: tuple[float, ...] = ()
    output_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None
    """Kind: timeout, connect, http_4xx, http_5xx, stream, ..."""
    conversation: str = ""
    turn: int = 0
    request_id: str | None = None
    """The server's response id (``chatcmpl-...``)."""
    end: float | None = None
    """Wall time the request finished (steps count requests by when they finished)."""
    trace_index: int | None = None
    """Trace replay: the row's index among the trace's rows (0-based)."""
    scheduled: float | None = None
    """Trace replay: the planned send time (wall clock, as ``start``)."""
    planned_input: int | None = None
    """Trace replay: the row's input tokens (what ``prompt_tokens`` should come to)."""
    held_s: float | None = None
    """Trace replay: how long the row waited past its time for its parent turn to finish."""
    last: bool | None = None
    """The session's (conversation's) last call as its profile planned it: True, or False for
    one with more to come; None where the request does not say (older files, a request log)."""
    cut: bool | None = None
    """The server stopped the answer at ``max_tokens`` (or the context's end) rather than ending it
    itself: its length is only a lower bound of the answer the model would have given (what
    learning the answers' lengths needs, :func:`spoc_tui.twin.answers.learned_lengths`); None
    where the request does not say (files before 2026-11-30, a stream without a finish reason)."""
    since_answer: float | None = None
    """A closed-loop user's turn: seconds from the end of its previous answer's stream to this
    request's send (the profile's think time and jitter, and the client's own delay); None for a
    user's first request, an open-loop arrival or a trace's row (issue 77)."""
    asked_wait: float | None = None
    """Of ``since_answer``, the wait the profile asked (think time and jitter); None where the
    users start together (``--arrivals lockstep``: they wait for each other, not for a time)."""

    @property
    def tpot(self) -> float | None:
        if self.e2e is None or self.ttft is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    def as_dict(self) -> dict[str, object]:
        return {
            "start": self.start,
            "step": self.step,
            "users": self.users,
            "ok": self.ok,
            "ttft": self.ttft,
            "e2e": self.e2e,
            "tpot": self.tpot,
            "itl": list(self.itl),
            "output_tokens": self.output_tokens,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "error": self.error,
            "conversation": self.conversation,
            "turn": self.turn,
            "request_id": self.request_id,
            "end": self.end,
            **({"last": self.last} if self.last is not None else {}),
            **({"cut": self.cut} if self.cut is not None else {}),
            **({"since_answer": self.since_answer} if self.since_answer is not None else {}),
            **({"asked_wait": self.asked_wait} if self.asked_wait is not None else {}),
            **(
                {
                    "trace_index": self.trace_index,
                    "scheduled": self.scheduled,
                    "planned_input": self.planned_input,
                    "held_s": self.held_s,
                }
                if self.trace_index is not None
                else {"scheduled": self.scheduled}
                if self.scheduled is not None  # an open-loop arrival: when its Poisson schedule sent it
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> RequestSample:
        itl = d.get("itl") or []
        return cls(
            start=json_float(d, "start") or 0.0,
            step=json_int(d, "step") or 0,
            users=json_int(d, "users") or 0,
            ok=bool(d.get("ok")),
            ttft=json_float(d, "ttft"),
            e2e=json_float(d, "e2e"),
            itl=tuple(float(x) for x in itl) if isinstance(itl, list) else (),
            output_tokens=json_int(d, "output_tokens"),
            prompt_tokens=json_int(d, "prompt_tokens"),
            cached_tokens=json_int(d, "cached_tokens"),
            error=str(d["error"]) if d.get("error") else None,
            conversation=str(d.get("conversation", "")),
            turn=json_int(d, "turn") or 0,
            request_id=str(d["request_id"]) if d.get("request_id") else None,
            end=json_float(d, "end"),
            trace_index=json_int(d, "trace_index"),
            scheduled=json_float(d, "scheduled"),
            planned_input=json_int(d, "planned_input"),
            held_s=json_float(d, "held_s"),
            last=bool(d["last"]) if isinstance(d.get("last"), bool) else None,
            cut=bool(d["cut"]) if isinstance(d.get("cut"), bool) else None,
            since_answer=json_float(d, "since_answer"),
            asked_wait=json_float(d, "asked_wait"),
        )
