"""The plan's units of work, as its worker processes receive them (jobs/workers.py): a
precision's twin sweep, one fleet run of the doubled-traffic hour, and one segment of a
trace replayed on R replicas. Each is its own seeded simulation, built from its own fields
alone, so it gives the same document in a worker as in the job's own process. This module
imports only the twin, to keep a worker's start short.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chatfleet.core.documents.sweep import Load, SweepDoc, SweepPoint
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.slo import SLO
from chatfleet.core.traffic.tally import SegmentResult
from chatfleet.core.workload import WorkloadConfig
from chatfleet.jobs.workers import Tick
from chatfleet.twin.fleet import FleetConfig, run_fleet_point
from chatfleet.twin.sweep import TwinSweep
from chatfleet.twin.trace_fleet import SegmentReplay

FLEET_WARMUP_S = 60.0


@dataclass(frozen=True, slots=True)
class SweepTask:
    """One precision's twin sweep: every load, then both knees refined; a tick per point."""

    sweeper: TwinSweep
    loads: tuple[Load, ...]

    def run(self, tick: Tick) -> SweepDoc:
        return self.sweeper.run(self.loads, refine=True, on_point=lambda _: tick())


@dataclass(frozen=True, slots=True)
class FleetRun:
    """One fleet run of the doubled-traffic hour."""

    spec: EngineSpec
    wcfg: WorkloadConfig
    load: Load
    fleet: FleetConfig
    duration_s: float = field(kw_only=True)
    seed: int = field(kw_only=True)
    slo: SLO = field(kw_only=True)

    def point(self) -> SweepPoint:
        return run_fleet_point(self.spec, self.wcfg, self.load, self.fleet,
                               duration_s=self.duration_s, warmup_s=FLEET_WARMUP_S,
                               seed=self.seed, slo=self.slo).point

    def run(self, tick: Tick) -> SweepPoint:
        point = self.point()
        tick()
        return point

    def longest_first(self) -> tuple[float, bool]:
        """A sort key, larger for the likely longer run: more users is more requests to
        simulate; at the same users the thermal model off runs longer, since the card never
        slows and so serves more tokens in the hour."""
        return (self.load.value, not self.spec.thermal)


@dataclass(frozen=True, slots=True)
class ReplayTask:
    """One segment of a trace replayed on R replicas (twin/trace_fleet.py); `key` says which
    search and which question it answers, for the job that asked."""

    replay: SegmentReplay
    key: tuple[str, int, int, int | None]  # (search, replicas, segment, groups replayed)

    def run(self, tick: Tick) -> SegmentResult:
        result = self.replay.run()
        tick()
        return result
