"""A twin sweep: load points through the engine model (or a fleet of them behind the gateway's
core), the chatfleet.sweep/1 document rebuilt after every point, and an optional refinement
that closes an open knee bracket (doubles the top load while it still meets; in open loop
halves the lowest rate while it fails) and then bisects it (closed loop to one user, open loop
to 10% of the rate), as the live sweep's `--refine` bisects."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.metrics import SLO, bisect_next, load_value, sweep_document
from chatfleet.core.workload import WorkloadConfig
from chatfleet.twin.fleet import FleetConfig, run_fleet_point
from chatfleet.twin.run import run_point, target_block

# Each bracket is bisected at most this many times (a closed bracket of 64 users needs 6).
REFINE_MAX_RUNS = 6
# An open bracket is first closed by doubling the top load (or halving the lowest rate), at
# most this many times and never beyond these loads.
EXTEND_MAX_RUNS = 5
MAX_EXTENDED = {"closed": 4096.0, "open": 1024.0}


@dataclass(frozen=True, slots=True)
class TwinSweep:
    spec: EngineSpec
    workload: WorkloadConfig
    slo: SLO
    duration_s: float = 300.0
    warmup_s: float = 30.0
    seed: int = 1
    fleet: FleetConfig | None = None
    cap_margin: int = 0

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
            for mode, knee_key in (("closed", "knee"), ("open", "knee_rate")):
                template = next((dict(x) for x in loads if x["mode"] == mode), None)
                if template is None:
                    continue
                key = "concurrency" if mode == "closed" else "rate_rps"
                # an open bracket first: the grid's top still meets (double it), or, in open
                # loop, its lowest rate already fails (halve it)
                for _ in range(EXTEND_MAX_RUNS):
                    tested = [load_value(p) for p in points if p["load"]["mode"] == mode]
                    knee = doc[knee_key]
                    if knee["fails"] is None and max(tested) * 2 <= MAX_EXTENDED[mode]:
                        nxt_load = max(tested) * 2
                    elif knee["meets"] is None and mode == "open":
                        nxt_load = min(tested) / 2
                    else:
                        break
                    add({**template, key: int(nxt_load) if mode == "closed" else nxt_load})
                for _ in range(REFINE_MAX_RUNS):
                    tested = [load_value(p) for p in points if p["load"]["mode"] == mode]
                    nxt = bisect_next(doc[knee_key], tested, mode)  # type: ignore[arg-type]
                    if nxt is None:
                        break
                    add({**template, key: int(nxt) if mode == "closed" else nxt})
        return doc
