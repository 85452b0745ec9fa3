"""The cool-down between runs: wait until the GPU is under a temperature, for a bounded time."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

from chatfleet.bench.telemetry.sources import (
    HTTP_TIMEOUT_S,
    NoneSource,
    TelemetrySource,
    make_source,
)
from chatfleet.bench.telemetry.spec import TelemetrySpec
from chatfleet.core.documents.sweep import Cooldown
from chatfleet.core.errors import ChatfleetError


async def cool_down(source: str | TelemetrySpec | TelemetrySource, below_c: float,
                    max_wait_s: float, poll_s: float = 1.0, *,
                    target: str | None = None) -> Cooldown:
    """Wait until the GPU is under `below_c`, at most `max_wait_s` (wall seconds): how long it
    waited, the start and end temperatures, whether it timed out (and a note when the source
    reports no temperature, which returns at once). Failed reads are retried until the
    bound."""
    if max_wait_s < 0 or poll_s <= 0:
        raise ChatfleetError("max_wait_s must be 0 or more and poll_s positive")
    src = make_source(source, target)
    result = Cooldown(below_c=below_c, source=src.label)
    no_temp = "the source reports no temperature: no cool-down"
    if isinstance(src, NoneSource) or not src.has_temperature:
        return replace(result, note=no_temp)
    t0 = time.monotonic()
    end = t0 + max_wait_s
    failures = 0
    last_error: str | None = None
    start_temp: float | None = None
    timed_out = False

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
        start_temp = current
        if current is None and failures == 0:
            return replace(result, note=no_temp)
        while current is None or current >= below_c:
            remaining = end - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            await asyncio.sleep(min(poll_s, remaining))
            t = await temp()
            if t is not None:
                current = t
                if start_temp is None:
                    start_temp = t
    finally:
        if src is not source:
            await src.aclose()
    return replace(result, waited_s=round(time.monotonic() - t0, 3), start_temp_c=start_temp,
                   end_temp_c=current, timed_out=timed_out, failures=failures or None,
                   last_error=last_error if failures else None)
