"""The compiled replay warmed up (:mod:`~spoc_tui.twin.replaykernel`): ``python -m spoc_tui.twin.warm``
compiles it into numba's cache (:func:`~spoc_tui.twin.fastreplay.cache_folder`), so that no later
process (a test, the monitor's first headroom) waits on the compiler, and lets go of the caches
of the kernel's earlier sources."""

from __future__ import annotations

import os
import shutil

from spoc_tui.core.traces.read import TraceRow
from spoc_tui.twin.fastreplay import ENV, cache_folder
from spoc_tui.twin.lengths import Lengths


def warm() -> float:
    """A small replay played compiled, so that numba compiles the kernel now and keeps it for later
    processes (``make test`` and ``make demo`` call this once; it takes a few seconds the first
    time, then a tenth of one). Returns the seconds it took."""
    import time

    from spoc_tui.twin.fleet import FleetSim
    from spoc_tui.twin.model import ServerConfig, StepModel, Twin

    t0 = time.perf_counter()
    fit = StepModel(0.005, 1e-4, 1e-3, 1e-4, 1e-5, 1e-3, 0.01, 1e-3, ridge=64.0, ridge_moves=True)
    server = ServerConfig("warm-up", 4096, 16, 64, True, 0.9, 4, 2048, True)
    twin = Twin(fit, fit, (), 0.1, server, calibrated_at=0.0)
    rows = [TraceRow(i, i * 0.01, 100 + 40 * i, 20, (1, 2), 16, line=i + 1) for i in range(8)]
    sim = FleetSim(twin, rows, replicas=1, poll_s=0.05)
    sim.run()
    if sim._fast is None:
        raise RuntimeError(f"the compiled replay is off ({ENV}=python, numba missing, or it could not be built)")
    Lengths(((1.0, 2.0), (2.0, 5.0)), (0.5, 1.0), (0.0, 0.0), 0.0).at_many([k / 64 for k in range(64)])
    if not os.environ.get("NUMBA_CACHE_DIR"):
        here = cache_folder()
        for old in here.parent.iterdir() if here.parent.is_dir() else ():
            if old != here and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    return time.perf_counter() - t0


if __name__ == "__main__":  # make test, make demo
    try:
        print(f"the compiled replay: ready in {warm():.1f} s")
    except RuntimeError as e:  # off, or numba could not build it: the replays play in Python
        print(f"{e}: the twin's replays play in Python")
