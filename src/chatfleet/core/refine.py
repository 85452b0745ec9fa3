"""The one refinement policy of a sweep's knee brackets, for the twin and the live sweep alike.

A bracket is first closed, then narrowed:

1. extend: while the grid's top load still meets the target (no `fails`), test twice the top
   load; in open loop, while the lowest rate already fails (no `meets`), test half of it. At
   most `extend_max_runs` times, never above `max_concurrency` users or `max_rate_rps`.
2. bisect: `core.measure.knee.bisect_next` until the bracket is one user (or 10% of the rate)
   wide, at most `bisect_max_runs` times.

The policy is pure: it reads the points tested so far and how many runs each phase has taken,
and names the next load (the mode's template load at a new value, so an open-loop arrival
process carries over), or None when the bracket is done or a bound is reached. `core.sweep`
runs it for both sweeps; a live sweep adds its own time budget on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from chatfleet.core.documents.sweep import Load, SweepPoint
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.measure.knee import bisect_next, find_knee

Phase = Literal["extend", "bisect"]
EXTEND_MAX_RUNS = 5
BISECT_MAX_RUNS = 6  # a closed bracket of 64 users needs 6


@dataclass(frozen=True, slots=True)
class RefinePolicy:
    extend_max_runs: int = EXTEND_MAX_RUNS
    bisect_max_runs: int = BISECT_MAX_RUNS
    max_concurrency: int = 4096
    max_rate_rps: float = 1024.0

    def __post_init__(self) -> None:
        if self.extend_max_runs < 0 or self.bisect_max_runs < 0:
            raise ChatfleetError("refinement run bounds must not be negative")
        if self.max_concurrency < 1 or self.max_rate_rps <= 0:
            raise ChatfleetError("the refinement's load bounds must be positive")


DEFAULT_POLICY = RefinePolicy()


@dataclass(frozen=True, slots=True)
class Refinement:
    """The next load to run, and the phase whose run count it takes."""

    phase: Phase
    load: Load


def next_load(points: Sequence[SweepPoint], template: Load, attainment: float, *,
              extended: int = 0, bisected: int = 0,
              policy: RefinePolicy = DEFAULT_POLICY) -> Refinement | None:
    """The next refinement load of `template`'s mode, or None when its bracket is closed and
    narrow enough, or a bound stops it. `extended` and `bisected` count the runs each phase
    has taken so far."""
    mode = template.mode
    tested = [p.load.value for p in points if p.load.mode == mode]
    if not tested:
        return None
    knee = find_knee(points, mode, attainment)
    if extended < policy.extend_max_runs:
        value: float | None = None
        if knee.fails is None and knee.meets is not None:
            top = max(tested) * 2
            if top <= (policy.max_concurrency if mode == "closed" else policy.max_rate_rps):
                value = top
        elif knee.meets is None and knee.fails is not None and mode == "open":
            value = min(tested) / 2
        if value is not None:
            return Refinement("extend", template.at(value))
    if bisected >= policy.bisect_max_runs:
        return None
    nxt = bisect_next(knee, tested, mode)
    if nxt is None:
        return None
    return Refinement("bisect", template.at(nxt))
