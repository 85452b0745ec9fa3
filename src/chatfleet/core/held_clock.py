"""The engine at the clock a card holds under its cooling (`at_clock`): what the thermal model
does to every step once the card has throttled to a clock f and stays there, as constants.

The thermal model (core/engine/thermal.py) slows compute-bound work by loaded_mhz / f and
memory-bound work by max(1, mem_bound_floor_mhz / f); the fixed, per-sequence and launch
costs are the host's and keep their time. The same engine with the efficiencies of the GEMMs
and of attention divided by the first factor and the memory bandwidth's by the second gives
those step times from the first step on, with the thermal model off: a sweep at the held
clock, where the thermal model itself would spend the first minutes at the loaded clock.
"""

from __future__ import annotations

from dataclasses import replace

from chatfleet.core.calibration import calibration_for
from chatfleet.core.engine.build import EngineSpec, calibration_of, thermal_profile_of
from chatfleet.core.errors import ChatfleetError


def clock_factors(spec: EngineSpec, mhz: float) -> tuple[float, float]:
    """(compute slow-down, memory slow-down) at SM clock `mhz`, as the thermal model has them."""
    profile = thermal_profile_of(spec)
    if not 0 < mhz <= profile.loaded_mhz:
        raise ChatfleetError(f"a held clock must lie in (0, {profile.loaded_mhz:g}] MHz, "
                             f"got {mhz:g}")
    return profile.loaded_mhz / mhz, max(1.0, profile.mem_bound_floor_mhz / mhz)


def at_clock(spec: EngineSpec, mhz: float) -> EngineSpec:
    """The engine with every step as long as at a held SM clock of `mhz` (thermal model off)."""
    sm, mem = clock_factors(spec, mhz)
    cal = calibration_of(spec) or calibration_for(spec.gpu)
    held = replace(cal, bandwidth_eff=cal.bandwidth_eff / mem, attn_eff=cal.attn_eff / sm,
                   gemm_eff={w: e / sm for w, e in cal.gemm_eff.items()})
    return replace(spec, calibration=held, thermal=False)
