"""The fleet's decisions as one object: admission and routing wired together, exactly as the
live gateway and the twin both drive them.

Every change is a call with its `now`; every call returns the decisions it caused, and the
router has already noted the admitted ones (so a session's home follows it). A `FleetTrace`,
when given, records each call: replaying a trace through a fresh `Fleet` reproduces the same
decisions (the gateway's parity check uses this to show that its live decisions are the core's
and nothing else).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.fleet.admission import AdmissionController, Decision, FleetRequest
from chatfleet.core.fleet.reserve import ReserveSettings
from chatfleet.core.fleet.routing import RecomputeModel, Router, SpillRule, route_least_loaded
from chatfleet.core.fleet.session import DEFAULT_SESSION_TTL_S, SessionTable

RouteKind = Literal["hit", "spill", "least_loaded"]


@dataclass(frozen=True, slots=True)
class FleetSettings:
    queue_depth: int = 64
    ttft_budget_s: float = 1.0
    prefill_reserve_s: float = 0.0
    prioritize_returning: bool = True
    affinity: bool = True
    shared_prefix_tokens: int = 0
    session_ttl_s: float = DEFAULT_SESSION_TTL_S
    max_sessions: int | None = None
    key_limits: Mapping[str, int] = field(default_factory=dict)  # API key -> queued + in flight
    # the deadline's reserve: learned per replica from admission -> first byte (reserve.py),
    # prefill_reserve_s the prior; learn=False: prefill_reserve_s always
    reserve: ReserveSettings = field(default_factory=ReserveSettings)
    spill: SpillRule = "cost"  # when a session leaves a hot home (routing.py)


@dataclass(slots=True)
class FleetTrace:
    """The calls made on a Fleet, in order: (now, name, args, keyword args)."""

    calls: list[tuple[float, str, tuple[Any, ...], dict[str, Any]]] = field(
        default_factory=list)
    limit: int = 2_000_000

    def add(self, now: float, name: str, *args: Any, **kwargs: Any) -> None:
        if len(self.calls) < self.limit:
            self.calls.append((now, name, args, kwargs))


class Fleet:
    def __init__(self, caps: Mapping[str, int], settings: FleetSettings,
                 step_time: RecomputeModel, trace: FleetTrace | None = None) -> None:
        self.settings = settings
        self.trace = trace
        self.num_routes: Counter[RouteKind] = Counter()
        self.router: Router | None = None
        if settings.affinity:
            self.router = Router(step_time, SessionTable(settings.session_ttl_s,
                                                         settings.max_sessions),
                                 shared_prefix_tokens=settings.shared_prefix_tokens,
                                 spill=settings.spill)
            route = self.router.route
        else:
            route = route_least_loaded
        self.ac = AdmissionController(
            caps, settings.queue_depth, settings.ttft_budget_s, route=route,
            prefill_reserve_s=settings.prefill_reserve_s,
            prioritize_returning=settings.prioritize_returning,
            key_limits=settings.key_limits, reserve=settings.reserve)

    def _record(self, now: float, name: str, *args: Any, **kwargs: Any) -> None:
        if self.trace is not None:
            self.trace.add(now, name, *args, **kwargs)

    def _note(self, decisions: list[Decision], now: float) -> list[Decision]:
        """Count how each admission was routed (its session's home before this admission,
        or a spill, or least loaded), then let the router note where sessions went."""
        if not decisions:
            return decisions
        router = self.router
        for d in decisions:
            if d.outcome != "admitted":
                continue
            key = d.request.session_key
            if key is None or router is None:
                self.num_routes["least_loaded"] += 1
            else:
                home = router.home(key, self.ac.replicas(), now)
                self.num_routes["hit" if d.replica == home else "spill"] += 1
        if router is not None:
            router.note(decisions, now)
        return decisions

    # --- requests -----------------------------------------------------------------------------
    def is_returning(self, key: str | None, now: float) -> bool:
        """A session the fleet has placed before (its entry is live)."""
        return (key is not None and self.router is not None
                and self.router.sessions.get(key, now) is not None)

    def offer(self, request: FleetRequest, now: float) -> list[Decision]:
        self._record(now, "offer", request)
        return self._note(self.ac.offer(request, now), now)

    def release(self, replica: str, now: float, key: str | None = None) -> list[Decision]:
        """A request at `replica` (under API key `key`) finished or failed."""
        if key is None:
            self._record(now, "release", replica)
        else:
            self._record(now, "release", replica, key=key)
        return self._note(self.ac.release(replica, now, key), now)

    def expire(self, now: float) -> list[Decision]:
        self._record(now, "expire")
        return self._note(self.ac.expire(now), now)

    def first_byte(self, replica: str, admitted_at: float, now: float) -> list[Decision]:
        """The first byte of a request admitted to `replica` at `admitted_at` arrived: a
        sample of the replica's reserve (admission.py); the decisions a changed reserve
        caused (the requests queued past their new deadline, shed)."""
        self._record(now, "first_byte", replica, admitted_at)
        return self._note(self.ac.first_byte(replica, admitted_at, now), now)

    def cancel(self, request_id: str, now: float) -> bool:
        self._record(now, "cancel", request_id)
        return self.ac.cancel(request_id)

    def requeue(self, request: FleetRequest, failed: str, now: float) -> list[Decision]:
        """`request` failed at `failed` before its first byte (refused, reset, a 5xx or 429
        head): its slot frees and it is placed again, never at `failed`: admitted to the
        least loaded other replica with room, else queued with its original deadline, else
        shed (admission.py states the rule). The first decision is about `request`."""
        self._record(now, "requeue", request, failed)
        return self._note(self.ac.requeue(request, failed, now), now)

    def adopt_session(self, key: str, replica: str, now: float) -> None:
        """Another gateway placed this session on `replica` (the shared session map): make
        that its home here too, unless this gateway already knows a live entry for it."""
        self._record(now, "adopt_session", key, replica)
        if self.router is not None and self.router.sessions.get(key, now) is None:
            self.router.sessions.place(key, replica, now)

    def observe_usage(self, key: str | None, prompt_tokens: int | None,
                      cached_tokens: int | None, now: float) -> None:
        self._record(now, "observe_usage", key, prompt_tokens, cached_tokens)
        if self.router is not None and key is not None:
            self.router.observe_usage(key, prompt_tokens, cached_tokens, now)

    # --- the fleet itself ---------------------------------------------------------------------
    def add_replica(self, replica: str, cap: int, now: float) -> list[Decision]:
        self._record(now, "add_replica", replica, cap)
        return self._note(self.ac.add_replica(replica, cap, now), now)

    def remove_replica(self, replica: str, now: float) -> list[Decision]:
        self._record(now, "remove_replica", replica)
        return self._note(self.ac.remove_replica(replica, now), now)

    def set_cap(self, replica: str, cap: int, now: float) -> list[Decision]:
        self._record(now, "set_cap", replica, cap)
        return self._note(self.ac.set_cap(replica, cap, now), now)

    def set_key_limits(self, limits: Mapping[str, int], now: float) -> None:
        """Per-key limits (API key name -> requests queued or in flight), hot reloaded."""
        self._record(now, "set_key_limits", dict(limits))
        self.ac.set_key_limits(limits)

    def set_queue_depth(self, depth: int, now: float) -> list[Decision]:
        self._record(now, "set_queue_depth", depth)
        if depth < 0:
            raise ChatfleetError("queue_depth must not be negative")
        self.ac.max_queue_depth = depth
        return self._note(self.ac.expire(now), now)


def replay(trace: FleetTrace, caps: Mapping[str, int], settings: FleetSettings,
           step_time: RecomputeModel) -> list[Decision]:
    """Every decision a fresh Fleet makes when the traced calls are made again, in order."""
    fleet = Fleet(caps, settings, step_time)
    out: list[Decision] = []
    for now, name, args, kwargs in trace.calls:
        result = getattr(fleet, name)(*args, now, **kwargs)
        if isinstance(result, list):
            out.extend(result)
        elif isinstance(result, Decision):
            out.append(result)
    return out
