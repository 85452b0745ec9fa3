"""The cool-down between runs: wait until the GPU is under a temperature, for a bounded time."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from chatfleet.bench.telemetry.sources import (
    HTTP_TIMEOUT_S,
    NoneSource,
    TelemetrySource,
    make_source,
)
from chatfleet.bench.telemetry.spec import TelemetrySpec
from chatfleet.core.errors import ChatfleetError


async def cool_down(source: str | TelemetrySpec | TelemetrySource, below_c: float,
                    max_wait_s: float, poll_s: float = 1.0, *,
                    target: str | None = None) -> dict[str, Any]:
    """Wait until the GPU is under `below_c`, at most `max_wait_s` (wall seconds). Returns
    {"waited_s", "start_temp_c", "end_temp_c", "timed_out"} (and "note" when the source
    reports no temperature, which returns at once). Failed reads are retried until the bound."""
    if max_wait_s < 0 or poll_s <= 0:
        raise ChatfleetError("max_wait_s must be 0 or more and poll_s positive")
    src = make_source(source, target)
    out: dict[str, Any] = {"waited_s": 0.0, "start_temp_c": None, "end_temp_c": None,
                           "timed_out": False, "below_c": below_c, "source": src.label}
    if isinstance(src, NoneSource) or not src.has_temperature:
        out["note"] = "the source reports no temperature: no cool-down"
        return out
    t0 = time.monotonic()
    end = t0 + max_wait_s
    failures = 0
    last_error: str | None = None

    async def temp() -> float | None:
        nonlocal failures, last_error
        try:
            async with asyncio.timeout(max(0.1, min(HTTP_TIMEOUT_S, end - time.monotonic()))):
                return (await src.read()).temp_c
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures += 1
            last_error = f"{type(exc).__name__}: {exc}"[:300]
            return None

    try:
        current = await temp()
        out["start_temp_c"] = current
        if current is None and failures == 0:
            out["note"] = "the source reports no temperature: no cool-down"
            return out
        while current is None or current >= below_c:
            remaining = end - time.monotonic()
            if remaining <= 0:
                out["timed_out"] = True
                break
            await asyncio.sleep(min(poll_s, remaining))
            t = await temp()
            if t is not None:
                current = t
                if out["start_temp_c"] is None:
                    out["start_temp_c"] = t
        out["end_temp_c"] = current
    finally:
        if src is not source:
            await src.aclose()
    out["waited_s"] = round(time.monotonic() - t0, 3)
    if failures:
        out["failures"] = failures
        out["last_error"] = last_error
    return out
