"""An experiment's step rules' defaults, declared once: the ramp (:mod:`spoc_tui.load.defaults`
re-exports them), the twin's prediction, and the result files' codec, which reads a ramp.json
header that lacks one as the ramp that wrote it ran (:class:`spoc_tui.core.results.RampHeader`)."""

from __future__ import annotations

from typing import Literal

STEP_S = 60.0
WARMUP_S = 10.0
ABORT_FACTOR = 3.0
SEED = 0
ArrivalMode = Literal["staggered", "lockstep"]
"""``--arrivals``: users staggered (the default) or started together."""
ARRIVALS: ArrivalMode = "staggered"
AUTO_SPAWN = "auto: within half the warm-up, 1-100 users/s"
"""ramp.json's ``spawn_rate`` where none was given (the ramp's own rule: ``load.defaults.spawn_rate``)."""
