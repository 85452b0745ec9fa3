"""How fast the fleet drains, and what a shed client is told: Retry-After.

- `DrainRate`: completions per second over a sliding window (per replica and for the fleet;
  the router weighs a session's wait at home with it), and, until the first completion is a
  window old, over the time since that first completion (what Retry-After divides by).
- `retry_after`: (requests ahead + 1) / drain rate, bounded, as whole seconds and as
  milliseconds.

Rules and examples: docs/fleet-core.md, rules 7 and 8. Pure: time is the `now` argument.
"""

from __future__ import annotations

import math
from collections import deque

from chatfleet.core.errors import ChatfleetError

RETRY_MIN_S = 1.0
# openai-python honours retry-after-ms / retry-after only up to 60 s (beyond, it falls back to
# its own backoff), so a larger figure would be ignored by the main client anyway.
RETRY_MAX_S = 60.0
DRAIN_WINDOW_S = 10.0


def retry_after(ahead: int, drain_rps: float, min_s: float = RETRY_MIN_S,
                max_s: float = RETRY_MAX_S) -> tuple[int, int]:
    """(seconds, milliseconds) to tell a shed client: (ahead + 1) / drain_rps, bounded to
    [min_s, max_s], milliseconds rounded up, and seconds the milliseconds rounded up to a whole
    second (so seconds x 1000 >= milliseconds).

    When nothing has drained in the window there is no rate to divide by: the answer is the
    floor, min_s, so that the client asks again as soon as the gateway may know more. (The
    ceiling was tried first: on a cold start every user of the first burst was told 60 s,
    measured in the gateway's parity run, docs/gateway.md.)"""
    raw = (ahead + 1) / drain_rps if drain_rps > 0 else min_s
    bounded = min(max_s, max(min_s, raw))
    ms = max(1, math.ceil(round(bounded * 1000.0, 6)))
    return max(1, -(-ms // 1000)), ms


class DrainRate:
    """Completions per second: those observed in the window (now - window_s, now], over
    window_s. Early in a run (less than a window observed) this reads low, so Retry-After
    reads long: the safe side."""

    def __init__(self, window_s: float = DRAIN_WINDOW_S) -> None:
        if window_s <= 0:
            raise ChatfleetError("the drain window must be positive")
        self.window_s = window_s
        self._times: deque[float] = deque()
        self.first: float | None = None  # the first completion ever observed

    def observe(self, now: float) -> None:
        if self.first is None:
            self.first = now
        self._times.append(now)
        self._prune(now)

    def count(self, now: float) -> int:
        self._prune(now)
        return len(self._times)

    def rate(self, now: float) -> float:
        return self.count(now) / self.window_s

    def rate_since_first(self, now: float) -> float:
        """Completions per second counted from the first one while it is less than a window
        old: those in (max(first, now - window_s), now] over that span (the first itself is
        the start of the span, not counted in it); 0.0 with one completion or none. Once the
        first is a window old this is `rate`. Early in a run `rate` reads low (a window's
        time for what a second saw); this reads what was seen."""
        first = self.first
        if first is None or now - first >= self.window_s:
            return self.rate(now)
        span = now - first
        count = self.count(now) - 1  # the first is in the window: it opens the span
        return count / span if count > 0 and span > 0 else 0.0

    def _prune(self, now: float) -> None:
        start = now - self.window_s
        while self._times and self._times[0] <= start:
            self._times.popleft()
