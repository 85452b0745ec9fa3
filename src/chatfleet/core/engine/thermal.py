"""A first-order thermal model of one card: power follows the work, temperature follows power,
the clock follows temperature and the recent work.

    P = idle + u * (P_phase - idle) * f / f_loaded     (u: share of time busy, f: SM clock;
                                                        P_phase: the cap for prefill, less for
                                                        decode, see ThermalProfile)
    dT/dt = (T_inlet + R * P - T) / tau
    f = f_loaded until T reaches the slowdown temperature; from there on (one clock for all
        work) the clock at which the recent work draws what the cooling sheds at that
        temperature, holding T there, until the recent work draws less than that at f_loaded

"Recent work": its power above idle at the loaded clock, averaged over the profile's
`mix_tau_s` (over the whole history while it is shorter), idle time counted as zero. An
interval runs at the clock the driver set when it began (the clock its step was timed with).

Compute-bound work (prefill) takes f_loaded / f times longer. Memory-bound work (decode) keeps
its speed while f stays above the card's `mem_bound_floor_mhz` and slows as floor / f below it.
The profile constants and their fit live in calibration.py. The model is off for steady
calibration runs (the twin and simserver take `--thermal` to switch it on).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, fields

from mypy_extensions import mypyc_attr

from chatfleet.core.calibration import ThermalProfile

PHASES = ("prefill", "decode", "mixed")


# a ThermalState's whole state (what `copy` duplicates, what tests compare)
STATE_FIELDS = ("_excess_sum", "_hold_w", "_next_mhz", "_phase_w", "_weight_sum", "holding",
                "mem_factor", "power_w", "profile", "slowdown", "sm_factor", "sm_mhz", "temp_c")


@mypyc_attr(allow_interpreted_subclasses=True)  # a test pins the clock with a subclass
class ThermalState:
    __slots__ = STATE_FIELDS

    def __init__(self, profile: ThermalProfile, temp_c: float | None = None) -> None:
        self.profile = profile
        p = profile
        self.temp_c = temp_c if temp_c is not None else p.ambient_c + p.r_c_per_w * p.idle_w
        self.sm_mhz = p.loaded_mhz  # the clock the last interval ran at
        self.power_w = p.idle_w
        self.slowdown = False  # the last interval ran throttled
        self.holding = False  # the driver holds the temperature at the slowdown point
        self._excess_sum = 0.0  # exponentially weighted power above idle at the loaded clock
        self._weight_sum = 0.0  # ... and the weight behind it (their ratio: the recent work)
        self._next_mhz = p.loaded_mhz  # what the next work runs at
        self.sm_factor = 1.0
        self.mem_factor = 1.0
        # the profile is frozen: what `advance` asks of it for every interval
        self._phase_w = {k: p.phase_power_w(k) for k in ("prefill", "decode")}
        self._hold_w = p.hold_w()

    def copy(self) -> ThermalState:
        """An independent state, equal to this one (a decode run looks ahead with it)."""
        twin = copy.copy(self)  # the phase powers are shared: they never change
        return twin

    @property
    def recent_excess_w(self) -> float:
        """The recent work's power above idle at the loaded clock."""
        return self._excess_sum / self._weight_sum if self._weight_sum > 0 else 0.0

    def advance(self, dt: float, utilization: float, kind: str = "prefill",
                prefill_share: float | None = None) -> None:
        """Move `dt` seconds at busy share `utilization` (0..1) of `kind` work (a `mixed`
        step gives the share of its tokens that are prefill). The arithmetic is the profile's
        (power_w, excess_w, hold_clock) written out: this runs once per engine step."""
        if dt <= 0:
            return
        p = self.profile
        phase = self._phase_w.get(kind)
        if phase is None:
            if kind not in PHASES:
                raise ValueError(f"unknown step kind {kind!r}")
            phase = p.phase_power_w(kind, prefill_share)
        idle = p.idle_w
        loaded = p.loaded_mhz
        busy = utilization > 0
        sm = self._next_mhz if busy else loaded
        self.sm_mhz = sm
        self.slowdown = busy and sm < loaded
        power = idle + utilization * (phase - idle) * (sm / loaded)  # p.power_w
        self.power_w = power
        keep = math.exp(-dt / p.mix_tau_s)
        excess_sum = keep * self._excess_sum + (1 - keep) * (utilization * (phase - idle))
        weight_sum = keep * self._weight_sum + (1 - keep)
        self._excess_sum = excess_sum
        self._weight_sum = weight_sum
        target = p.ambient_c + p.r_c_per_w * power
        temp = target + (self.temp_c - target) * math.exp(-dt / p.tau_s)
        if self.holding:
            temp = min(temp, max(p.slowdown_c, target))
        self.temp_c = temp
        recent = excess_sum / weight_sum if weight_sum > 0 else 0.0
        if recent <= 0:  # p.hold_clock(recent)
            hold_mhz = loaded
        else:
            hold_mhz = min(loaded, max(p.min_mhz, loaded * (self._hold_w - idle) / recent))
        if temp >= p.slowdown_c - 1e-9:
            self.holding = True
        if hold_mhz >= loaded:
            self.holding = False  # the recent work draws no more than the cooling sheds
        nxt = hold_mhz if self.holding else loaded
        self._next_mhz = nxt
        self.sm_factor = loaded / nxt
        self.mem_factor = max(1.0, p.mem_bound_floor_mhz / nxt)

    def snapshot(self) -> dict[str, float | bool]:
        return {"sm_clock_mhz": round(self.sm_mhz, 1), "temp_c": round(self.temp_c, 2),
                "power_w": round(self.power_w, 2), "thermal_slowdown": self.slowdown}


@dataclass(frozen=True, slots=True)
class CoolingNeed:
    """What a steady load asks of the cooling, from its mix at the loaded clock: whether the
    card holds its clock under it, and the inlet temperature or thermal resistance at which
    it would (with the profile's other figures unchanged)."""

    loaded_power_w: float  # mean power of the load at the loaded clock
    decode_power_w: float  # decode alone, busy throughout, at the loaded clock
    hold_w: float  # what the cooling sheds at the slowdown temperature
    steady_temp_c: float  # where the load would settle at the loaded clock
    holds_clock: bool
    max_inlet_c: float
    max_r_c_per_w: float
    cooling_factor: float  # how many times lower R must be (1 or less: it holds)
    max_busy_share: float  # the busy share at which this mix holds the clock (1: any)

    def to_json(self) -> dict[str, float | bool]:
        return {k: (round(v, 3) if isinstance(v, float) else v)
                for k, v in ((f.name, getattr(self, f.name)) for f in fields(self))}


def cooling_need(profile: ThermalProfile, busy_share: float,
                 prefill_share: float) -> CoolingNeed:
    """For a card busy `busy_share` of the time, `prefill_share` of that in prefill."""
    if not (0.0 <= busy_share <= 1.0 and 0.0 <= prefill_share <= 1.0):
        raise ValueError("shares must lie in [0, 1]")
    p = profile
    loaded = p.idle_w + busy_share * (p.busy_power_w(prefill_share, p.loaded_mhz) - p.idle_w)
    steady = p.ambient_c + p.r_c_per_w * loaded
    max_r = (p.slowdown_c - p.ambient_c) / loaded
    busy_excess = p.busy_power_w(prefill_share, p.loaded_mhz) - p.idle_w
    max_busy = min(1.0, max(0.0, (p.hold_w() - p.idle_w) / busy_excess))
    return CoolingNeed(
        loaded_power_w=loaded, decode_power_w=p.phase_power_w("decode"), hold_w=p.hold_w(),
        steady_temp_c=steady, holds_clock=steady < p.slowdown_c,
        max_inlet_c=p.slowdown_c - p.r_c_per_w * loaded, max_r_c_per_w=max_r,
        cooling_factor=p.r_c_per_w / max_r, max_busy_share=max_busy)
