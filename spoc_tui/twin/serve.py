"""``spoc sim --twin``: the twin's engine for the simulator to serve (composed by the CLI, so the
simulator knows no twin)."""

from __future__ import annotations

import math
from dataclasses import fields

from spoc_tui.core.hardware.capacity import CapacityError
from spoc_tui.core.tuning.engineflags import EngineFlags
from spoc_tui.sim.engine import SimEngine
from spoc_tui.sim.options import SimConfigError, SimOptions
from spoc_tui.twin.engine import TwinEngine
from spoc_tui.twin.model import WHAT_IF, TwinError, read_twin


def twin_engine(opts: SimOptions) -> SimEngine:
    """The twin's engine: its server's settings, what-ifs from the flags given.

    Raises:
        SimConfigError: a twin that cannot be read or used, a scenario other than steady.
    """
    if opts.scenario != "steady" or (opts.replicas or 1) != 1:
        raise SimConfigError("--twin serves one replica of the calibrated server (the steady scenario)")
    if not 0 < opts.speed < math.inf:
        raise SimConfigError("--speed must be a positive number")
    engine_flags = {f.name for f in fields(EngineFlags)}
    other = [g for g in opts.given if g in engine_flags and g not in WHAT_IF]
    if other:
        names = ", ".join("--" + g.replace("_", "-") for g in other)
        known = ", ".join("--" + g.replace("_", "-") for g in WHAT_IF)
        raise SimConfigError(f"the twin predicts {known}; not {names} (it was calibrated at the server's)")
    try:
        twin = read_twin(opts.twin or "")
        flags = {name: getattr(opts, name) for name in opts.given if name in WHAT_IF}
        return TwinEngine(twin, flags=flags, speed=opts.speed, seed=opts.seed)
    except (TwinError, CapacityError) as e:
        raise SimConfigError(str(e)) from None
