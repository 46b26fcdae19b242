"""A ramp's defaults, once: :class:`~spoc_tui.load.ramp.RampConfig` takes them, and ``spoc
ramp``'s options show them without loading the ramp's machinery (``spoc --help`` stays fast)."""

from __future__ import annotations

from typing import Literal

DEFAULT_USERS = "auto"
MAX_WORKERS = 64
"""The most load-generator processes a ramp starts on this machine."""
EXTEND_FACTOR = 4.0
"""Default --max-step-seconds, as a multiple of --step-seconds."""
DEFAULT_PROFILE = "chatbot"
DEFAULT_BUDGET_S = 600.0
"""The knee search's default time budget: 10 minutes of load (warm-ups included)."""
STEP_S = 60.0
WARMUP_S = 10.0
ABORT_FACTOR = 3.0
WORKERS = 0
SEED = 0
POLL_S = 5.0
ARRIVALS: Literal["staggered", "lockstep"] = "staggered"
