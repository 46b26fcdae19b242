"""How a ramp ended, and its status while it runs (below the codec that writes them)."""

from __future__ import annotations

from typing import Literal

RampEnd = Literal["complete", "stopped_early", "interrupted", "server_failed"]
"""How a ramp ended."""
RampStatus = RampEnd | Literal["running"]
"""A ramp's status in ramp.json (``running`` while it goes on)."""
