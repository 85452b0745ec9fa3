"""The live fleet: the replica registry (replicas.py) and admission (admission.py), wired.

Each has one job and a typed contract: admission decides who runs where and when
(`LiveAdmission`: offer, acquire, requeue, release), the registry keeps the replicas, their
pools, health and caps and seats in admission the ones that may serve (`ReplicaRegistry`,
through admission's `Seats`). The relay and the slots talk to the one they need; what spans
both is here: a new configuration (admission's queue and key limits, the registry's replicas),
the published demand, the gauges, closing. So is what the shared store tells this gateway
(other gateways' requests in flight, whether the store answers), which only the gauges read.
"""

from __future__ import annotations

from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.fleet.admission import AdmissionController
from chatfleet.core.fleet.fairshare import Demand
from chatfleet.core.fleet.fleet import FleetTrace
from chatfleet.core.fleet.routing import Router
from chatfleet.gateway.admission import DecisionLog, LiveAdmission
from chatfleet.gateway.config import GatewayConfig
from chatfleet.gateway.metrics import GatewayMetrics, Gauges
from chatfleet.gateway.replicas import LiveReplica, ReplicaRegistry


class LiveFleet:
    """Admission and the replica registry of one gateway (see the module docstring)."""

    def __init__(self, cfg: GatewayConfig, step_time: StepTimeModel,
                 metrics: GatewayMetrics, log: DecisionLog | None = None,
                 trace: FleetTrace | None = None) -> None:
        self.cfg = cfg
        self.admission = LiveAdmission(cfg, step_time, metrics, log, trace)
        self.registry = ReplicaRegistry(self.admission, metrics)
        self.others: dict[str, int] = {}  # other gateways' requests in flight, per replica
        self.state_up = True  # the shared store answers (always, in memory)
        self.apply(cfg)

    # --- reads of the two (tests and the gateway's pages) -------------------------------------
    @property
    def replicas(self) -> dict[str, LiveReplica]:
        return self.registry.replicas

    @property
    def ac(self) -> AdmissionController:
        return self.admission.ac

    @property
    def router(self) -> Router | None:
        return self.admission.router

    def now(self) -> float:
        return self.admission.now()

    # --- what spans both ----------------------------------------------------------------------
    def apply(self, cfg: GatewayConfig) -> None:
        """Take a new configuration: the queue depth and key limits (admission), replicas
        joining or leaving, their caps and health thresholds (the registry). Running requests
        are never touched; a removed replica finishes its streams. Routing mode and the TTFT
        budget are fixed at start."""
        self.cfg = cfg
        self.admission.apply(cfg)
        self.registry.apply(cfg)

    def in_flight(self, name: str) -> int:
        return self.admission.in_flight(name)

    def set_shares(self, shares: dict[str, int]) -> None:
        self.registry.set_shares(shares)

    def demand(self) -> Demand:
        """What this gateway's clients ask for now: requests offered per second over the
        window, and requests queued or in flight."""
        return self.admission.demand(self.registry.replicas)

    def gauges(self) -> Gauges:
        ac, reps = self.admission.ac, self.registry.replicas
        routes = self.admission.core.num_routes
        sessions = session_bytes = 0
        if self.admission.router is not None:
            sessions = len(self.admission.router.sessions)
            session_bytes = self.admission.router.sessions.num_bytes
        return Gauges(
            queue_depth=ac.queue_depth(),
            in_flight={n: ac.in_flight(n) for n in reps},
            caps={n: r.cap for n, r in reps.items()},
            shares={n: self.registry.effective_cap(r) for n, r in reps.items()},
            healthy={n: r.serving for n, r in reps.items()},
            sessions=sessions, routes={str(k): v for k, v in routes.items()},
            state_up=int(self.state_up), others=dict(self.others),
            session_bytes=session_bytes,
            reserves={n: ac.reserve_s(n) for n in reps},
            reserve_samples={n: len(est) for n, est in ac.reserves().items() if n in reps})

    def close(self) -> None:
        self.admission.close()
        self.registry.close()
