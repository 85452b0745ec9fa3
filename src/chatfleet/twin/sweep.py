"""A twin sweep: load points through the engine model (or a fleet of them behind the gateway's
core), the chatfleet.sweep/1 document rebuilt after every point, and an optional refinement
that closes an open knee bracket (doubles the top load while it still meets; in open loop
halves the lowest rate while it fails) and then bisects it (closed loop to one user, open loop
to 10% of the rate): `core.sweep`'s runner and `core.refine`'s policy, the live sweep's too."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from chatfleet.core.defaults import DURATION_S, SEED, WARMUP_S
from chatfleet.core.documents.sweep import Load, SweepDoc, SweepPoint
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.measure.knee import sweep_document
from chatfleet.core.provenance import Provenance
from chatfleet.core.refine import RefinePolicy
from chatfleet.core.slo import SLO
from chatfleet.core.sweep import Sweep
from chatfleet.core.workload import WorkloadConfig
from chatfleet.twin.fleet import FleetConfig, run_fleet_point
from chatfleet.twin.run import run_point, target_block


@dataclass(frozen=True, slots=True)
class TwinPoints:
    """The twin's point runner (`core.sweep.PointRunner`): point `index` runs with
    seed + index, on one engine or on `fleet`."""

    spec: EngineSpec
    workload: WorkloadConfig
    slo: SLO
    duration_s: float = 300.0
    warmup_s: float = 30.0
    seed: int = 1
    fleet: FleetConfig | None = None

    def run(self, load: Load, index: int) -> SweepPoint:
        if self.fleet is not None:
            return run_fleet_point(self.spec, self.workload, load, self.fleet,
                                   duration_s=self.duration_s, warmup_s=self.warmup_s,
                                   seed=self.seed + index, slo=self.slo).point
        return run_point(self.spec, self.workload, load, duration_s=self.duration_s,
                         warmup_s=self.warmup_s, seed=self.seed + index, slo=self.slo).point


@dataclass(frozen=True, slots=True)
class TwinSweep:
    spec: EngineSpec
    workload: WorkloadConfig
    slo: SLO
    duration_s: float = DURATION_S
    warmup_s: float = WARMUP_S
    seed: int = SEED
    fleet: FleetConfig | None = None
    cap_margin: int = 0
    refine_policy: RefinePolicy = field(default_factory=RefinePolicy)

    def workload_block(self) -> dict[str, Any]:
        return {**self.workload.to_json(), "duration_s": self.duration_s,
                "warmup_s": self.warmup_s, "seed": self.seed}

    def target(self) -> dict[str, Any]:
        target = target_block(self.spec)
        if self.fleet is not None:
            target["fleet"] = self.fleet.to_json()
        return target

    def runner(self) -> TwinPoints:
        return TwinPoints(self.spec, self.workload, self.slo, self.duration_s, self.warmup_s,
                          self.seed, self.fleet)

    def document(self, points: Sequence[SweepPoint]) -> SweepDoc:
        return sweep_document(self.target(), self.workload_block(), self.slo, points,
                              cap_margin=self.cap_margin)

    def run(self, loads: Sequence[Load], *, refine: bool = False,
            on_point: Callable[[SweepDoc], None] | None = None) -> SweepDoc:
        """Every load in order, then (with `refine`) each mode's knee bracket closed and
        bisected. `on_point` gets the whole document after every point (write it: nothing
        finished is lost if the run stops)."""
        sweep = Sweep(loads, attainment=self.slo.attainment, seed=self.seed, refine=refine,
                      policy=self.refine_policy)
        runner = self.runner()

        def done(_: SweepPoint) -> None:
            if on_point is not None:
                on_point(self.document(sweep.points))

        return self.document(sweep.run(runner, done))


def with_band(doc: SweepDoc, prov: Provenance, slower: SweepDoc, faster: SweepDoc) -> SweepDoc:
    """`doc` with the knees of the same sweep with every step (1 + band) and (1 - band) times
    as long (`knee_band`) and where the constants come from (`calibration`): keys added to
    chatfleet.sweep/1."""
    band = {"error_band": prov.band, "source": prov.band_source,
            "knee": {"slower": slower.knee.to_json(), "faster": faster.knee.to_json()},
            "knee_rate": {"slower": slower.knee_rate.to_json(),
                          "faster": faster.knee_rate.to_json()}}
    return replace(doc, extra={**doc.extra, "knee_band": band, "calibration": prov.to_json()})
