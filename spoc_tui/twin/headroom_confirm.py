"""A live headroom set beside the ramp that confirms it: the trace of the traffic it replayed,
the speeds around it, and what the ramp then measured (the monitor's Load form, issue 52)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from spoc_tui.core.ramp.inference import KneeEstimate
from spoc_tui.twin.headroom import Headroom, _x
from spoc_tui.twin.traffic import synth_rows


@dataclass(frozen=True, slots=True)
class HeadroomClaim:
    """A live headroom a ramp is set to confirm: the trace of its traffic, and what it said."""

    trace: str
    estimate: float
    ci95: tuple[float | None, float | None]

    @classmethod
    def of(cls, h: Headroom, trace: str) -> HeadroomClaim | None:
        return cls(trace, h.estimate, h.ci95) if h.identified and h.estimate is not None else None

    def beside(self, measured: KneeEstimate | None) -> str:
        """``the live headroom predicted x5.9 (95 %: 4-8); this ramp measured x5.0 (95 %:
        4.6-5.4): inside the prediction's interval, the point 18 % high``."""
        lo, hi = self.ci95
        said = f"the live headroom predicted x{self.estimate:.2g}" + (
            f" (95 %: {_x(lo)}-{_x(hi)})" if hi is not None else " (a bound: every speed it replayed met the SLA)"
        )
        if measured is None or measured.estimate is None:
            return f"{said}; this ramp measured no knee to set beside it"
        m, (mlo, mhi) = measured.estimate, measured.ci95
        if measured.boundary == "bound":
            return f"{said}; this ramp measured {measured.short} (a bound: no point to set beside it)"
        inside = (lo is None or lo <= m) and (hi is None or m <= hi)
        err = (self.estimate - m) / m * 100
        return (
            f"{said}; this ramp measured x{m:.2g} (95 %: {_x(mlo)}-{_x(mhi)}): "
            f"{'inside' if inside else 'OUTSIDE'} the prediction's interval, the point {abs(err):.0f} % "
            f"{'high' if err >= 0 else 'low'}"
        )


def confirm_speeds(estimate: float) -> str:
    """Speeds around a headroom for a ramp that confirms it (``--speed`` / the Load form's speeds):
    below, at and past the estimate."""
    picks = sorted({max(0.1, round(estimate * k, 2)) for k in (0.6, 0.85, 1.0, 1.2)})
    return ",".join(f"{v:g}" for v in picks)


def write_traffic_trace(h: Headroom, path: Path, seed: int = 0) -> int:
    """The traffic a headroom replayed, as a spoc trace file a ramp replays against the server
    (the arrivals, lengths and prefix share estimated from its counters and histograms, as the
    headroom says); how many rows.

    Raises: ValueError when the headroom has no traffic."""
    from spoc_tui.core.traces.read import write_spoc

    if h.traffic is None:
        raise ValueError("the headroom has no traffic to write")
    rows = synth_rows(h.traffic, h.traffic.seconds, seed, as_it_moved=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        return write_spoc(iter(rows), f)
