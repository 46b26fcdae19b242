"""A GPU power/thermal/clock model for the simulator.

Power follows load, temperature follows power through a first-order thermal time constant,
and the SM clock is pulled down with the matching clock-event reason when the board power
cap (0x4 sw_power_cap) or the slowdown temperature (0x20 sw_thermal, 0x40 hw_thermal at
the shutdown margin) is reached. Idle reads 0x1, which is not throttling.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field

from spoc_tui.core.hardware.presets import GpuSpec

AMBIENT_C = 30.0


@dataclass
class SimGpu:
    index: int
    spec: GpuSpec
    thermal_resistance: float = 0.060
    """C per W at steady state above ambient (0.06: ~72 C at 700 W)."""
    tau_s: float = 20.0
    seed: int = 0
    temp_c: float = 35.0
    power_w: float = 0.0
    sm_clock_mhz: float = 0.0
    util_pct: float = 0.0
    reasons: int = 0x1
    energy_mj: float = 0.0
    power_violation_ns: float = 0.0
    thermal_violation_ns: float = 0.0
    fb_used_mib: float = 0.0
    uuid: str = field(default="")

    def __post_init__(self) -> None:
        if not self.uuid:
            self.uuid = "GPU-" + str(
                uuidlib.UUID(int=(self.seed * 1_000_003 + self.index * 7919 + 0x5C0C) % (1 << 128))
            )
        self.power_w = self.spec.idle_power_w
        self.sm_clock_mhz = self.spec.sm_clock_idle_mhz

    _thermal_throttle: bool = False

    @property
    def clock_ratio(self) -> float:
        """The clock the GPU runs kernels at, against its maximum. An idle GPU boosts at
        once when work arrives, so idle reads as full speed."""
        if self.reasons & 0x1:
            return 1.0
        return self.sm_clock_mhz / self.spec.sm_clock_max_mhz

    def step(self, dt: float, busy: float, intensity: float) -> None:
        """Advance the model by ``dt`` seconds.

        Args:
            busy: fraction of ``dt`` the GPU was executing kernels (0..1).
            intensity: how power-hungry those kernels are (0..1; decode ~0.7, prefill ~1).
        """
        if dt <= 0:
            return
        spec = self.spec
        busy = max(0.0, min(1.0, busy))
        demand_w = spec.idle_power_w + (spec.power_limit_w * 1.08 - spec.idle_power_w) * busy * intensity
        reasons = 0
        clock = spec.sm_clock_max_mhz
        if busy < 0.02:
            reasons |= 0x1
            clock = spec.sm_clock_idle_mhz
            demand_w = spec.idle_power_w
        power = demand_w
        if demand_w > spec.power_limit_w:
            # Power capping: the clock scales down until board power meets the limit.
            clock *= max(0.55, (spec.power_limit_w / demand_w) ** 1.6)
            power = spec.power_limit_w * 0.998
            reasons |= 0x4
            self.power_violation_ns += dt * 1e9
        slowdown = spec.slowdown_temp_c
        # Hysteresis: slowdown engages at the threshold and releases 3 C below it.
        if self.temp_c >= slowdown:
            self._thermal_throttle = True
        elif self.temp_c < slowdown - 3:
            self._thermal_throttle = False
        if self._thermal_throttle and busy >= 0.02:
            over = max(0.0, self.temp_c - slowdown)
            clock = min(clock, spec.sm_clock_max_mhz * max(0.35, 0.78 - 0.06 * over))
            power = min(power, spec.idle_power_w + (power - spec.idle_power_w) * (clock / spec.sm_clock_max_mhz))
            reasons |= 0x20
            if self.temp_c >= spec.shutdown_temp_c - 3:
                reasons |= 0x40
            self.thermal_violation_ns += dt * 1e9
        # First-order thermal response towards the steady-state temperature.
        target = AMBIENT_C + self.thermal_resistance * power
        alpha = min(1.0, dt / self.tau_s)
        self.temp_c += (target - self.temp_c) * alpha
        self.power_w = power
        self.sm_clock_mhz = clock
        self.util_pct = 100.0 * busy
        self.reasons = reasons
        self.energy_mj += power * dt * 1000.0

    @property
    def mem_temp_c(self) -> float:
        return self.temp_c + 4.0
