"""The prefill reserve, learned: how long a replica takes from a request's admission to the
first byte of its answer, over a sliding window, as the part of the TTFT budget a queued
request must still have left when it is admitted.

A queued request is shed when its expected first token would miss the target:

    now + reserve(replica it would go to) > arrival + ttft_budget_s

`ReserveEstimator` keeps one replica's samples (admission -> first byte, seconds, each with the
`now` it was observed at) and gives the reserve:

- no sample yet: the configured reserve (`prefill_reserve_s`, the prior);
- fewer than `min_samples`: the higher of the prior and the samples' percentile (the prior is
  a floor while the data are thin);
- then: the `percentile` of the samples in the window, bounded to [`min_s`, `max_s`]
  (`max_s` unset: half the TTFT budget, so a queued request always has half of it to wait
  for a slot).

The learned value is rounded up to a whole `resolution_s` (10 ms): a percentile moves a
little with almost every sample, and each move of a reserve moves the deadlines of the
requests queued for its replica (a pass over the queue, a timer re-armed); rounded, it moves
when it crosses a step (measured in the twin's doubled-traffic hour: 132,725 events against
55,768 with the fixed reserve, before rounding).

The window holds the samples observed in the last `window_s` seconds before the newest one,
and at most `max_samples` of them (the oldest leave first). The reserve changes only when a
sample arrives, so a shell that arms a timer for the queue's next deadline after each call is
never early or late.

Pure and deterministic: time is the `now` argument, and `now` must not go backwards.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

from chatfleet.core.errors import ChatfleetError


@dataclass(frozen=True, slots=True)
class ReserveSettings:
    """How the reserve is learned (docs/fleet-core.md, rule 5). `learn=False`: the configured
    reserve always, as before the reserve was learned."""

    learn: bool = True
    window_s: float = 30.0
    max_samples: int = 200
    percentile: float = 99.0
    min_samples: int = 20
    min_s: float = 0.0
    max_s: float | None = None  # None: half the TTFT budget
    resolution_s: float = 0.01  # the learned value is rounded up to a whole one of these

    def ceiling_s(self, ttft_budget_s: float) -> float:
        """The highest reserve: `max_s`, or half the TTFT budget."""
        return ttft_budget_s / 2 if self.max_s is None else self.max_s

    def check(self, ttft_budget_s: float) -> None:
        """Refuse settings that cannot work with this TTFT budget (a one-line reason)."""
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ChatfleetError("reserve.window_s must be positive and finite")
        if self.max_samples < 1 or self.min_samples < 1:
            raise ChatfleetError("reserve.max_samples and reserve.min_samples must be at "
                                 "least 1")
        if not 0 < self.percentile <= 100:
            raise ChatfleetError("reserve.percentile must lie in (0, 100]")
        if not (math.isfinite(self.resolution_s) and 0 < self.resolution_s <= 0.1):
            raise ChatfleetError("reserve.resolution_s must lie in (0, 0.1]")
        ceiling = self.ceiling_s(ttft_budget_s)
        if not (math.isfinite(self.min_s) and math.isfinite(ceiling)
                and 0 <= self.min_s <= ceiling < ttft_budget_s):
            raise ChatfleetError(f"need 0 <= reserve.min_s <= reserve.max_s < ttft_budget_s "
                                 f"({ttft_budget_s:g} s; max_s unset is half of it)")

    def __reduce__(self) -> tuple[type[ReserveSettings], tuple[object, ...]]:
        """Pickled by its fields (the compiled form of a frozen dataclass refuses pickle's
        default way)."""
        return (ReserveSettings, (self.learn, self.window_s, self.max_samples, self.percentile,
                                  self.min_samples, self.min_s, self.max_s, self.resolution_s))


class ReserveEstimator:
    """One replica's admission -> first byte samples and the reserve they give (see the
    module docstring)."""

    __slots__ = ("_recent", "_sorted", "ceiling_s", "num_observed", "prior_s", "settings",
                 "value_s")

    def __init__(self, prior_s: float, settings: ReserveSettings, ceiling_s: float) -> None:
        self.prior_s = prior_s
        self.settings = settings
        self.ceiling_s = ceiling_s  # the highest reserve (settings.ceiling_s of the budget)
        self._recent: deque[tuple[float, float]] = deque()  # (observed at, sample), in order
        self._sorted: list[float] = []  # the window's samples, sorted
        self.num_observed = 0
        self.value_s = prior_s  # the reserve now: changes only in `observe`

    def __len__(self) -> int:
        """Samples in the window."""
        return len(self._sorted)

    def observe(self, sample_s: float, now: float) -> bool:
        """A request's admission -> first byte took `sample_s` (seen at `now`). True when the
        reserve changed."""
        s = self.settings
        sample_s = max(0.0, sample_s)
        self._recent.append((now, sample_s))
        bisect.insort(self._sorted, sample_s)
        self.num_observed += 1
        start = now - s.window_s
        while self._recent and (len(self._recent) > s.max_samples
                                or self._recent[0][0] <= start):
            _, old = self._recent.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        before = self.value_s
        self.value_s = self._value()
        return self.value_s != before

    def percentile_s(self) -> float | None:
        """The window's `percentile` (linear between the two nearest ranks); None if empty."""
        xs = self._sorted
        if not xs:
            return None
        pos = (len(xs) - 1) * self.settings.percentile / 100.0
        lo = math.floor(pos)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    def _value(self) -> float:
        s = self.settings
        p = self.percentile_s()
        if p is None:
            return self.prior_s
        step = s.resolution_s
        p = math.ceil(round(p / step, 9)) * step  # up to a whole step (9 places: 0.3 stays)
        bounded = min(self.ceiling_s, max(s.min_s, p))
        if len(self._sorted) < s.min_samples:
            return max(self.prior_s, bounded)
        return bounded
