"""Requests in flight at each replica, from the replicas' own traces (`chatfleet simserver
--trace`): every engine step writes its running and waiting counts, in model time; the
token rows give the wall clock of the replica's model time zero. So the counts are the
engines', whatever the gateways believed."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import orjson


@dataclass(frozen=True, slots=True)
class Series:
    """One replica's requests in flight (running + waiting) after each engine step, at the
    wall-clock time (unix seconds) of the step's end."""

    replica: str
    times: list[float]
    counts: list[int]

    def peak(self, start: float = float("-inf"), end: float = float("inf")) -> int:
        return max((n for t, n in zip(self.times, self.counts, strict=True)
                    if start <= t <= end), default=0)

    def at(self, t: float) -> int:
        """In flight at `t`: the last step's count (0 before the first)."""
        n = 0
        for ts, c in zip(self.times, self.counts, strict=True):
            if ts > t:
                break
            n = c
        return n


def read_series(trace: Path, time_scale: float) -> Series:
    rows = [orjson.loads(line) for line in trace.read_bytes().splitlines() if line]
    token = next((r for r in rows if r["type"] == "token"), None)
    if token is None:  # no request ever ran
        return Series("", [], [])
    t0_unix = token["planned_unix"] - token["planned"] / time_scale
    steps = [r for r in rows if r["type"] == "step"]
    steps.sort(key=lambda r: r["t"])
    return Series(steps[0]["replica"] if steps else "",
                  [t0_unix + r["t"] / time_scale for r in steps],
                  [int(r["running"]) + int(r["queue"]) for r in steps])


@dataclass(frozen=True, slots=True)
class Phase:
    """The fleet over one window: each replica's peak, the mean fraction of the fleet's slots
    in use (time-weighted), and the longest stretch with nothing in flight anywhere."""

    name: str
    start: float
    end: float
    peaks: list[int]
    used: float
    longest_idle_s: float


def phase(name: str, series: list[Series], start: float, end: float, cap: int,
          step_s: float = 0.01, hold_s: float = 0.05) -> Phase:
    """Sampled every `step_s` of wall clock between `start` and `end`. A step's count holds
    until the next step, or for `hold_s` at most: an engine with work steps back to back (a
    few ms apart at time scale 10), so no step for longer means it had nothing to run (a
    step's row counts the requests it ran, the ones it finished included)."""
    n = max(1, int((end - start) / step_s))
    used = 0
    idle = longest = 0.0
    cursors = [0] * len(series)
    values = [0] * len(series)
    last = [float("-inf")] * len(series)
    for i in range(n):
        t = start + i * step_s
        for k, s in enumerate(series):
            while cursors[k] < len(s.times) and s.times[cursors[k]] <= t:
                values[k] = s.counts[cursors[k]]
                last[k] = s.times[cursors[k]]
                cursors[k] += 1
            if t - last[k] > hold_s:
                values[k] = 0
        total = sum(values)
        used += total
        idle = idle + step_s if total == 0 else 0.0
        longest = max(longest, idle)
    return Phase(name, start, end, [s.peak(start, end) for s in series],
                 used / (n * cap * max(1, len(series))), longest)


def describe(phases: Iterable[Phase], cap: int) -> str:
    """One line per phase for the suite's report."""
    return "; ".join(f"{p.name} ({p.end - p.start:.0f} s): peaks {p.peaks} at cap {cap}, "
                     f"{100 * p.used:.0f}% of slots used, longest idle {p.longest_idle_s:.1f} s"
                     for p in phases)
