"""What one segment's replay counts (`ReplayTally`), and its result (`SegmentResult`).

A segment's counted turns are the lines sent in its window (each attempt a request, as a
sweep's point counts them); its lead-in's are replayed and not counted. A counted turn meets
the target as a sweep's request does (core/measure/request.meets_slo, its TTFT from its
arrival at the gateway); a shed one, or one the drain did not finish, misses it. A replay
that judges a fleet stops at the first counted turn shed, or at the first miss beyond what
the target attainment allows in the segment (`ReplayAborted`): the fleet fails there.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

from chatfleet.core.documents.sweep import GpuBlock
from chatfleet.core.measure.request import meets_slo, tpot, ttft
from chatfleet.core.records import RequestRecord
from chatfleet.core.slo import SLO


class ReplayAborted(Exception):
    """The fleet failed the segment: a counted turn was shed, or too many missed."""

    def __init__(self, at: float, why: str) -> None:
        super().__init__(why)
        self.at = at
        self.why = why


def allowed_misses(slo: SLO, counted: int) -> int:
    """The most counted turns that may miss the target while the share that meets it stays
    at least the target attainment."""
    return math.floor((1.0 - slo.attainment) * counted + 1e-9)


@dataclass(slots=True)
class ReplayTally:
    slo: SLO
    counted_total: int  # the segment's counted lines
    abort: bool  # stop at the first failure (a judgement) or count everything (a what-if)
    offered: int = 0
    completed: int = 0
    shed: int = 0
    failed: int = 0  # not finished when the drain ran out
    met: int = 0
    ttft_s: array[float] = field(default_factory=lambda: array("d"))
    tpot_s: array[float] = field(default_factory=lambda: array("d"))
    allowance: int = field(init=False)

    def __post_init__(self) -> None:
        self.allowance = allowed_misses(self.slo, self.counted_total)

    @property
    def missed(self) -> int:
        return self.offered - self.met

    def add(self, rec: RequestRecord, counted: bool) -> None:
        if not counted:
            return
        self.offered += 1
        if rec.outcome == "shed":
            self.shed += 1
            if self.abort:
                raise ReplayAborted(rec.send_time, f"a turn was shed at {rec.send_time:.0f} s "
                                    f"({rec.error})")
        elif rec.outcome == "ok":
            self.completed += 1
            first, mean = ttft(rec, "open"), tpot(rec, "open")
            if first is not None:
                self.ttft_s.append(first)
            if mean is not None:
                self.tpot_s.append(mean)
            if meets_slo(rec, self.slo, "open"):
                self.met += 1
        else:
            self.failed += 1
        if self.abort and self.missed > self.allowance:
            raise ReplayAborted(rec.send_time, f"{self.missed} of the window's "
                                f"{self.counted_total} turns missed the target by "
                                f"{rec.send_time:.0f} s (at most {self.allowance} may)")


@dataclass(frozen=True, slots=True)
class SegmentResult:
    """One segment replayed on `replicas` replicas: whether the fleet met the target in it
    (nothing shed, the target attainment met), where a judging replay stopped and why, and
    the counts and latencies of the counted turns (the latencies of the turns done so far,
    when it stopped)."""

    segment: int
    replicas: int
    passed: bool
    stopped_at: float | None
    why: str | None
    counted: int
    offered: int
    completed: int
    shed: int
    failed: int
    met: int
    ttft_s: array[float]
    tpot_s: array[float]
    peak_users: int  # sessions open at once in the counted window (between turns included)
    max_queue: int
    max_in_flight: int
    gpu: GpuBlock | None = None  # of the sampled replicas, for a thermal verdict
    groups: int = 1  # the groups of replicas replayed
    all_groups: bool = True  # ... every group of the fleet (else the busiest ones)

    @property
    def attainment(self) -> float:
        return self.met / self.offered if self.offered else 1.0

    @property
    def admitted_attainment(self) -> float | None:
        admitted = self.offered - self.shed
        return self.met / admitted if admitted else None
