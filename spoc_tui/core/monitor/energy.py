"""Energy and cost per token over the monitor's window.

Average GPU power over the window comes from the GPUs' total-energy counters (DCGM's
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` or NVML's ``nvmlDeviceGetTotalEnergyConsumption``, both
mJ since boot): the increase over the window divided by its length. Where a GPU has no counter,
its instantaneous power readings are averaged instead (and the figure says so). Tokens per
joule = output tokens per second / watts; with a price per GPU-hour, the cost per million
output tokens = GPUs x price / 3600 / (output tokens per second) x 1e6.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from spoc_tui.core.hardware.gpu import GpuSample


@dataclass(frozen=True, slots=True)
class Efficiency:
    watts: float
    gpus: int
    basis: str
    """``energy counters`` or ``power readings``."""
    tokens_per_joule: float | None
    cost_per_m_tokens: float | None

    def text(self, price: float | None) -> str:
        # three and two significant figures: a window's average moves in its last digits every
        # second, which read as noise (and repainted the line each second)
        w = self.watts
        shown_w = round(w, 2 - math.floor(math.log10(w))) if w > 0 else w
        parts = [f"{self.gpus} GPU(s) {shown_w:,.0f} W avg ({self.basis})"]
        parts.append(
            "n/a tok/J (no output tokens)"
            if self.tokens_per_joule is None
            else f"{self.tokens_per_joule:.2g} out tok/J"
        )
        if price is not None:
            c = self.cost_per_m_tokens
            parts.append(f"${c:,.2f} per M out tokens at ${price:g}/GPU-hour" if c is not None else "cost n/a")
        return " · ".join(parts)


class EnergyMeter:
    """GPU readings over time; :meth:`efficiency` over the last ``window_s`` seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._h: deque[tuple[float, dict[str, tuple[float | None, float | None]]]] = deque()

    def add(self, t: float, gpus: Sequence[GpuSample]) -> None:
        self._h.append((t, {g.key: (g.energy_j, g.power_w) for g in gpus}))
        while self._h and self._h[0][0] < t - self.window_s * 1.5:
            self._h.popleft()

    def watts(self) -> tuple[float, int, str] | None:
        """(mean total watts over the window, GPUs, basis), or None before two readings."""
        if len(self._h) < 2:
            return None
        t1, last = self._h[-1]
        first = next(((t, g) for t, g in self._h if t >= t1 - self.window_s), self._h[0])
        t0, start = first
        if t1 - t0 <= 0:
            return None
        total = 0.0
        basis = "energy counters"
        for key, (e1, _) in last.items():
            e0 = start.get(key, (None, None))[0]
            if e0 is not None and e1 is not None and e1 >= e0:
                total += (e1 - e0) / (t1 - t0)
                continue
            basis = "power readings"
            ps = [g[key][1] for t, g in self._h if t >= t0 and key in g and g[key][1] is not None]
            if not ps:
                return None
            total += sum(p for p in ps if p is not None) / len(ps)
        return total, len(last), basis

    def efficiency(self, out_tok_s: float | None, price_per_gpu_hour: float | None = None) -> Efficiency | None:
        w = self.watts()
        if w is None:
            return None
        watts, n, basis = w
        tpj = out_tok_s / watts if out_tok_s and watts > 0 else None
        cost = None
        if price_per_gpu_hour is not None and out_tok_s:
            cost = n * price_per_gpu_hour / 3600 / out_tok_s * 1e6
        return Efficiency(watts, n, basis, tpj, cost)
