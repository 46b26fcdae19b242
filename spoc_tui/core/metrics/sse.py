"""Reading an OpenAI-compatible streamed completion, once: the load generator's requests
(:mod:`spoc_tui.load.runner`) and the twin's calibration probes (:mod:`spoc_tui.twin.calibrate`)
time their tokens with the same rule.

The rule is ``vllm bench serve``'s: every ``data:`` event with choices is a step of the stream,
text or not (a token whose text the detokenizer holds back still took its step): the time to first
token is at the first such event, a gap at each next one, the end-to-end time at the last one.
The usage event (``stream_options.include_usage``) says the server's token counts.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field


def _int(v: object) -> int | None:
    """A token count (a server that writes 12.0 means 12), or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return int(v)


@dataclass
class StreamTally:
    """What a stream's events said so far; :meth:`feed` each line as it arrives."""

    chat: bool = True
    """Chat completions carry text in ``delta.content``, completions in ``text``."""
    keep_text: bool = False
    times: list[float] = field(default_factory=list)
    """When each event with choices arrived (the caller's clock)."""
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    """The server's counts, from the usage event (the last one wins)."""
    request_id: str | None = None
    finish_reason: str | None = None
    """Why the server ended the answer (``stop``: it ended it itself, at EOS or a stop string;
    ``length``: at ``max_tokens`` or the context's end), from the last choice that said."""
    done: bool = False
    """``[DONE]`` arrived (a stream that ends without it broke)."""
    parts: list[str] = field(default_factory=list)

    def feed(self, line: bytes | str, now: float) -> None:
        """One line of the response body, read at ``now``."""
        if isinstance(line, bytes):  # (the load generator's lines: not decoded, json reads bytes)
            if not line.startswith(b"data:"):
                return
            data: bytes | str = line[5:].strip()
            if data == b"[DONE]":
                self.done = True
                return
        else:
            if not line.startswith("data:"):
                return
            data = line[5:].strip()
            if data == "[DONE]":
                self.done = True
                return
        try:
            ev = json.loads(data)
        except ValueError:
            return
        if not isinstance(ev, dict):
            return
        if self.request_id is None and isinstance(ev.get("id"), str):
            self.request_id = ev["id"]
        usage = ev.get("usage")
        if isinstance(usage, dict) and usage:
            self.prompt_tokens = _int(usage.get("prompt_tokens"))
            self.completion_tokens = _int(usage.get("completion_tokens"))
            details = usage.get("prompt_tokens_details")
            self.cached_tokens = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
        choices = ev.get("choices")
        if choices and isinstance(choices, list):
            self.times.append(now)
            for ch in choices:
                reason = ch.get("finish_reason") if isinstance(ch, dict) else None
                if isinstance(reason, str) and reason:
                    self.finish_reason = reason
            if self.keep_text:
                for ch in choices:
                    if not isinstance(ch, dict):
                        continue
                    piece = (ch.get("delta") or {}).get("content") if self.chat else ch.get("text")
                    if isinstance(piece, str) and piece:
                        self.parts.append(piece)

    @property
    def first(self) -> float | None:
        return self.times[0] if self.times else None

    @property
    def last(self) -> float | None:
        return self.times[-1] if self.times else None

    @property
    def gaps(self) -> tuple[float, ...]:
        t = self.times
        return tuple(b - a for a, b in zip(t, t[1:], strict=False))

    @property
    def text(self) -> str:
        return "".join(self.parts)
