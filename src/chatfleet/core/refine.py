"""The one refinement policy of a sweep's knee brackets, for the twin and the live sweep alike.

A bracket is first closed, then narrowed:

1. extend: while the grid's top load still meets the target (no `fails`), test twice the top
   load; in open loop, while the lowest rate already fails (no `meets`), test half of it. At
   most `extend_max_runs` times, never above `max_concurrency` users or `max_rate_rps`.
2. bisect: `core.metrics.bisect_next` until the bracket is one user (or 10% of the rate) wide,
   at most `bisect_max_runs` times.

The policy is pure: it reads the points tested so far and how many runs each phase has taken,
and names the next load (a copy of the mode's template load with a new value, so an open-loop
arrival process carries over), or None when the bracket is done or a bound is reached. The
caller runs the load and counts the run; a live sweep adds its own time budget on top.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.metrics import Mode, bisect_next, find_knee, load_value

Phase = Literal["extend", "bisect"]
LOAD_KEYS: dict[str, str] = {"closed": "concurrency", "open": "rate_rps"}
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
    load: dict[str, Any]


def next_load(points: Sequence[Mapping[str, Any]], template: Mapping[str, Any],
              attainment: float, *, extended: int = 0, bisected: int = 0,
              policy: RefinePolicy = DEFAULT_POLICY) -> Refinement | None:
    """The next refinement load of `template`'s mode, or None when its bracket is closed and
    narrow enough, or a bound stops it. `extended` and `bisected` count the runs each phase
    has taken so far."""
    mode: Mode = template["mode"]
    key = LOAD_KEYS[mode]
    tested = [load_value(p) for p in points if p["load"]["mode"] == mode]
    if not tested:
        return None
    knee = find_knee(points, mode, attainment)
    if extended < policy.extend_max_runs:
        value: float | None = None
        if knee["fails"] is None and knee["meets"] is not None:
            top = max(tested) * 2
            if top <= (policy.max_concurrency if mode == "closed" else policy.max_rate_rps):
                value = top
        elif knee["meets"] is None and knee["fails"] is not None and mode == "open":
            value = min(tested) / 2
        if value is not None:
            return Refinement("extend", _with(template, key, value, mode))
    if bisected >= policy.bisect_max_runs:
        return None
    nxt = bisect_next(knee, tested, mode)
    if nxt is None:
        return None
    return Refinement("bisect", _with(template, key, nxt, mode))


def _with(template: Mapping[str, Any], key: str, value: float, mode: Mode) -> dict[str, Any]:
    return {**template, key: int(value) if mode == "closed" else float(value)}
