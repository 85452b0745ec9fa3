"""Fleet logic shared by the live gateway and the twin: admission (caps, one queue, deadlines,
shedding with Retry-After) and routing (session keys, rendezvous affinity with a load bound,
recompute-aware spill). No HTTP here: a request is a `FleetRequest`. See docs/fleet-core.md."""

from chatfleet.core.fleet.admission import (
    AdmissionController,
    Decision,
    DrainRate,
    FleetRequest,
    FleetView,
    Route,
    retry_after,
)
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
    "Route",
    "RouteChoice",
    "Router",
    "SessionEntry",
    "SessionTable",
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
