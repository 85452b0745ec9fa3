"""What a telemetry source reads: one GPU's `Reading` (SM clock, temperature, power, clock-event
reasons), a `TelemetrySample` (a reading at a harness time), NVML's clock-event reason bits,
and the two errors: a failed read (`TelemetryError`) and a source that cannot work here at all
(`TelemetryUnavailable`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# NVML's clocks-event (formerly "throttle") reasons, the bit values of nvmlClocksEventReason*
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
THERMAL_MASK = 0x20 | 0x40


class TelemetryError(Exception):
    """One reading failed (counted by the sampler, never fatal)."""


class TelemetryUnavailable(TelemetryError):
    """The source cannot work here at all: NVML missing, no GPU, a bad GPU index."""


def decode_reasons(mask: int) -> list[str]:
    """The names of the clock-event reason bits set in `mask`."""
    return [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


def is_thermal(mask: int) -> bool:
    return bool(mask & THERMAL_MASK)


@dataclass(frozen=True, slots=True)
class Reading:
    """One reading of one GPU; None where the source does not know."""

    sm_clock_mhz: float | None = None
    temp_c: float | None = None
    power_w: float | None = None
    thermal_slowdown: bool | None = None
    reasons: tuple[str, ...] = ()
    source_time: float | None = None  # the source's own clock (simserver: its model time)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Reading:
        """The JSON of the simserver's and the agent's /telemetry."""
        reasons = doc.get("clock_event_reasons")
        if not isinstance(reasons, list):
            reasons = []
        slow = doc.get("thermal_slowdown")
        if slow is None and reasons:
            slow = any("thermal" in str(r) for r in reasons)
        t = doc.get("time")
        return cls(_opt_float(doc.get("sm_clock_mhz")), _opt_float(doc.get("temp_c")),
                   _opt_float(doc.get("power_w")), None if slow is None else bool(slow),
                   tuple(str(r) for r in reasons), _opt_float(t))


def _opt_float(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class TelemetrySample:
    t: float  # harness model time
    wall: float  # monotonic seconds (for the sampling interval)
    reading: Reading

    def to_json(self) -> dict[str, Any]:
        r = self.reading
        row: dict[str, Any] = {"t": round(self.t, 6), "sm_clock_mhz": r.sm_clock_mhz,
                               "temp_c": r.temp_c, "power_w": r.power_w,
                               "thermal_slowdown": r.thermal_slowdown, "reasons": list(r.reasons)}
        if r.source_time is not None:
            row["source_time"] = r.source_time
        return row
