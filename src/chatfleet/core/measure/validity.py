"""The one validity rule: the reasons a run is invalid, built in one place.

A run is valid only if the cache was flushed (when asked), the client kept up (send lag and
event-loop lag p99 under their bounds) and the GPU's median SM clock stayed at or above the
floor, and its window was not cut short. An invalid run stays in the results with its reasons
(joined by "; " in `invalid_reason`) and is left out of the knee, the peak and the cap. The
twin's runs are valid by construction: it flushes, has no client and models its clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chatfleet.core.documents.sweep import GpuBlock


def below_clock_floor(gpu: GpuBlock, floor_mhz: float | None) -> str | None:
    """The invalid reason when the median SM clock was under the floor, else None (no floor,
    or no clock reading)."""
    if floor_mhz is None:
        return None
    p50 = gpu.sm_clock_mhz.p50
    if p50 is None:
        return None
    if p50 < floor_mhz:
        return f"under the clock floor: median SM clock {p50:.0f} MHz < {floor_mhz:g} MHz"
    return None


def client_behind(send_lag_ms_p99: float, loop_lag_ms_p99: float, max_send_lag_ms: float,
                  max_loop_lag_ms: float) -> str | None:
    """The invalid reason when the client fell behind (either p99 over its bound)."""
    if send_lag_ms_p99 > max_send_lag_ms or loop_lag_ms_p99 > max_loop_lag_ms:
        return (f"client behind: send lag p99 {send_lag_ms_p99:.1f} ms, loop lag p99 "
                f"{loop_lag_ms_p99:.1f} ms (bounds {max_send_lag_ms:g} / "
                f"{max_loop_lag_ms:g} ms)")
    return None


INTERRUPTED = "interrupted: the window was cut short by Ctrl-C"


@dataclass(frozen=True, slots=True)
class RunChecks:
    """What a live run saw that decides its validity.

    `unflushed`: why a flush did not take, one entry per target (refused, not proven by the
    engine's counters, or the run's first request found a cached prefix); `gpu` and
    `clock_floor_mhz`: the card's clock against the floor; the client's lag p99 against its
    bounds; `interrupted`: the window was cut short.
    """

    unflushed: Sequence[str] = ()
    send_lag_ms_p99: float = 0.0
    loop_lag_ms_p99: float = 0.0
    max_send_lag_ms: float = float("inf")
    max_loop_lag_ms: float = float("inf")
    gpu: GpuBlock | None = None
    clock_floor_mhz: float | None = None
    interrupted: bool = False


def invalid_reasons(checks: RunChecks) -> list[str]:
    """The reasons, in this order: the flush, the client, the clock floor, the interruption."""
    reasons = [f"unflushed: {detail}" for detail in checks.unflushed]
    behind = client_behind(checks.send_lag_ms_p99, checks.loop_lag_ms_p99,
                           checks.max_send_lag_ms, checks.max_loop_lag_ms)
    if behind is not None:
        reasons.append(behind)
    if checks.gpu is not None:
        floor = below_clock_floor(checks.gpu, checks.clock_floor_mhz)
        if floor is not None:
            reasons.append(floor)
    if checks.interrupted:
        reasons.append(INTERRUPTED)
    return reasons
