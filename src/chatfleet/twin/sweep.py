"""A twin sweep: load points through the engine model (or a fleet of them behind the gateway's
core), the chatfleet.sweep/1 document rebuilt after every point, and an optional refinement
that closes an open knee bracket (doubles the top load while it still meets; in open loop
halves the lowest rate while it fails) and then bisects it (closed loop to one user, open loop
to 10% of the rate): `core.refine`'s policy, the one the live sweep's `--refine` follows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chatfleet.core.defaults import DURATION_S, SEED, WARMUP_S
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.metrics import SLO, sweep_document
from chatfleet.core.refine import RefinePolicy, next_load
from chatfleet.core.workload import WorkloadConfig
from chatfleet.twin.fleet import FleetConfig, run_fleet_point
from chatfleet.twin.run import run_point, target_block


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

    def point(self, load: dict[str, Any], index: int) -> dict[str, Any]:
        """One load point; point `index` runs with seed + index."""
        if self.fleet is not None:
            return run_fleet_point(self.spec, self.workload, load, self.fleet,
                                   duration_s=self.duration_s, warmup_s=self.warmup_s,
                                   seed=self.seed + index, slo=self.slo).point
        return run_point(self.spec, self.workload, load, duration_s=self.duration_s,
                         warmup_s=self.warmup_s, seed=self.seed + index, slo=self.slo).point

    def document(self, points: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return sweep_document(self.target(), self.workload_block(), self.slo, points,
                              cap_margin=self.cap_margin)

    def run(self, loads: Sequence[dict[str, Any]], *, refine: bool = False,
            on_point: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Every load in order, then (with `refine`) the bisection of each mode's knee bracket.
        `on_point` gets the whole document after every point (write it: nothing finished is
        lost if the run stops)."""
        points: list[dict[str, Any]] = []
        doc = self.document(points)

        def add(load: dict[str, Any]) -> None:
            nonlocal doc
            points.append(self.point(load, len(points)))
            doc = self.document(points)
            if on_point is not None:
                on_point(doc)

        for load in loads:
            add(load)
        if refine:
            for mode in ("closed", "open"):
                template = next((dict(x) for x in loads if x["mode"] == mode), None)
                if template is None:
                    continue
                runs = {"extend": 0, "bisect": 0}
                while (nxt := next_load(points, template, self.slo.attainment,
                                        extended=runs["extend"], bisected=runs["bisect"],
                                        policy=self.refine_policy)) is not None:
                    runs[nxt.phase] += 1
                    add(nxt.load)
        return doc
