"""How a test waits for something to happen: it polls a condition until it holds or a timeout
passes, never sleeps a fixed time and hopes. `wait_for` from a thread, `wait_for_async` inside
an event loop (it yields to the loop between checks). Both check once more at the timeout, and
return whether the condition held; a test asserts that.

A fixed sleep stays only where time itself must pass (a timeout being tested, a fault held for
its length) or to show that something does *not* happen within a span."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

POLL_S = 0.01


def wait_for(condition: Callable[[], bool], timeout: float = 10.0,
             every: float = POLL_S) -> bool:
    """Whether `condition()` became true within `timeout` seconds (checked every `every`)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(every)
    return condition()


async def wait_for_async(condition: Callable[[], bool], timeout: float = 10.0,
                         every: float = POLL_S) -> bool:
    """`wait_for` inside an event loop: the loop runs between checks."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        await asyncio.sleep(every)
    return condition()
