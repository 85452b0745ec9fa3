"""Fleet logic shared by the live gateway and the twin: admission (caps, one queue, deadlines,
shedding with Retry-After) and routing (session keys, rendezvous affinity with a load bound,
recompute-aware spill), replica health (eject, readmit) and the shared prompt (canonical
prefix, byte-identical). No HTTP here: a request is a `FleetRequest`. See docs/fleet-core.md."""

from chatfleet.core.fleet.admission import (
    AdmissionController,
    Decision,
    DrainRate,
    FleetRequest,
    FleetView,
    Route,
    retry_after,
)
from chatfleet.core.fleet.health import ReplicaHealth
from chatfleet.core.fleet.prompt import PrefixCheck, PrefixReport, SharedPrompt, canonicalize
from chatfleet.core.fleet.routing import (
    RouteChoice,
    Router,
    conversation_fingerprint,
    is_returning,
    least_loaded,
    rendezvous_order,
    rendezvous_top,
    rendezvous_weight,
    route_least_loaded,
    session_key,
)
from chatfleet.core.fleet.session import SessionEntry, SessionTable

__all__ = [
    "AdmissionController",
    "Decision",
    "DrainRate",
    "FleetRequest",
    "FleetView",
    "PrefixCheck",
    "PrefixReport",
    "ReplicaHealth",
    "Route",
    "RouteChoice",
    "Router",
    "SessionEntry",
    "SessionTable",
    "SharedPrompt",
    "canonicalize",
    "conversation_fingerprint",
    "is_returning",
    "least_loaded",
    "rendezvous_order",
    "rendezvous_top",
    "rendezvous_weight",
    "retry_after",
    "route_least_loaded",
    "session_key",
]
