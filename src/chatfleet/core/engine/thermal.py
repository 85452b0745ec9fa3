"""A first-order thermal model of one card: temperature follows power, clocks follow temperature.

    dT/dt = (T_ambient + R * P - T) / tau
    P = idle + u * (cap - idle) * f / f_loaded        (u: share of time busy, f: SM clock)

Below the slowdown temperature the card runs at `loaded_mhz` (the clock its power cap allows
under load). At or above it the driver lowers the SM clock to the clock whose power holds the
temperature at the slowdown point (HW thermal slowdown), never below `min_mhz`.

Compute-bound work (prefill) takes f_loaded / f times longer. Memory-bound work (decode) keeps
its speed while f stays above the card's `mem_bound_floor_mhz` and slows as floor / f below it.
The profile constants live in calibration.py. The model is off for steady calibration runs
(the twin and simserver take `--thermal` to switch it on).
"""

from __future__ import annotations

import math

from chatfleet.core.calibration import ThermalProfile


class ThermalState:
    def __init__(self, profile: ThermalProfile, temp_c: float | None = None) -> None:
        self.profile = profile
        p = profile
        self.temp_c = temp_c if temp_c is not None else p.ambient_c + p.r_c_per_w * p.idle_w
        self.sm_mhz = p.loaded_mhz
        self.power_w = p.idle_w
        self.slowdown = False
        self.sm_factor = 1.0
        self.mem_factor = 1.0

    def power_at(self, utilization: float, sm_mhz: float) -> float:
        p = self.profile
        return p.idle_w + utilization * (p.cap_w - p.idle_w) * sm_mhz / p.loaded_mhz

    def advance(self, dt: float, utilization: float) -> None:
        """Move `dt` seconds at busy share `utilization` (0..1)."""
        if dt <= 0:
            return
        p = self.profile
        self.slowdown = self.temp_c >= p.slowdown_c - 1e-9 and utilization > 0
        if self.slowdown:
            # the clock whose power holds T at the slowdown point
            hold_w = (p.slowdown_c - p.ambient_c) / p.r_c_per_w
            f = (hold_w - p.idle_w) / (utilization * (p.cap_w - p.idle_w)) * p.loaded_mhz
            self.sm_mhz = min(p.loaded_mhz, max(p.min_mhz, f))
        else:
            self.sm_mhz = p.loaded_mhz
        self.power_w = self.power_at(utilization, self.sm_mhz)
        target = p.ambient_c + p.r_c_per_w * self.power_w
        self.temp_c = target + (self.temp_c - target) * math.exp(-dt / p.tau_s)
        if self.slowdown:
            self.temp_c = min(self.temp_c, max(p.slowdown_c, target))
        self.sm_factor = p.loaded_mhz / self.sm_mhz
        self.mem_factor = max(1.0, p.mem_bound_floor_mhz / self.sm_mhz)

    def snapshot(self) -> dict[str, float | bool]:
        return {"sm_clock_mhz": round(self.sm_mhz, 1), "temp_c": round(self.temp_c, 2),
                "power_w": round(self.power_w, 2), "thermal_slowdown": self.slowdown}
