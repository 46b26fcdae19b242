"""The simulator's truth log (``spoc sim --truth-log``), as the benchmarks that referee a client
read it: each line one request, with when it arrived (``arrival``), when each of its tokens left
the engine (``tokens``) and when each token's event was written to the socket (``sent``), on this
machine's clock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def sent_by(
    truth: list[dict[str, Any]], ids: set[str] | None, w0: float = 0.0, w1: float = 0.0
) -> list[dict[str, Any]]:
    """The requests a client sent: by response id where it has them (spoc), else by arrival
    inside the client's window ``w0``-``w1`` (vllm bench and AIPerf keep no ids we read)."""
    return [t for t in truth if (t["id"] in ids if ids is not None else w0 <= t["arrival"] <= w1)]


def ttft_ms(sel: list[dict[str, Any]], key: str = "tokens") -> Any:
    """Their TTFTs (ms) as the server saw them: to the first token leaving the engine
    (``tokens``) or its event going to the socket (``sent``); requests with none are left out."""
    return np.array([t[key][0] - t["arrival"] for t in sel if t.get(key)]) * 1000


def gaps_ms(sel: list[dict[str, Any]], key: str = "tokens") -> Any:
    """Their gaps between tokens (ms), the same way."""
    return np.concatenate([np.diff(t[key]) for t in sel if t.get(key)]) * 1000
