"""Admission: a cap on requests in flight per replica, one bounded queue with deadlines, and
shedding with a Retry-After computed from the observed drain rate.

Rules (docs/fleet-core.md states them with examples):

- A request is admitted to the replica its route names when that replica has fewer requests in
  flight than its cap. Otherwise it waits in the one queue, ordered by class (returning sessions
  first when `prioritize_returning`), then by arrival order (FCFS within a class).
- Deadline = arrival + ttft_budget_s - reserve, the reserve being the time the replica the
  request would go to takes from admission to the first byte: the configured
  `prefill_reserve_s`, or with `reserve.learn` that replica's learned value (reserve.py; the
  configured one until it has data). A request still queued after its deadline
  (now > deadline) is shed, never admitted: its first token would miss the target.
- The queue holds at most `queue_depth` requests. Above it the arriving request is shed at once;
  a returning session (with priority on) instead displaces the newest new-session request, which
  is shed in its place.
- A request under an API key whose limit is set (`key_limits`) is shed at once (reason
  `key_limit`) when that key already has `limit` requests queued or in flight; otherwise it
  counts against its key from the offer until it leaves (released, shed from the queue, or
  cancelled; a requeue keeps it counted). Retry-After counts the requests over the limit.
- While the fleet has no replica that takes requests (none added yet, all removed or ejected),
  no slot can ever free for a request: it is shed at once (reason `no_replica`, the gateway's
  503), and so is every queued request when the last replica leaves.
- A request that fails at its replica before the first byte (`requeue`) frees its slot (not
  counted as drained: nothing finished) and is placed again, never at the replica it failed on:
  shed if no other replica is in the fleet (`no_replica`) or its original deadline has passed;
  else admitted at once to the least loaded other replica with room; else queued again with
  its original deadline, ahead of every request of its class that was not requeued (it was let
  in once and lost its turn to the fleet's fault, not its own); a full queue sheds its last
  request in its place if that one ranks below it (`displaced`), else sheds it (`queue_full`).
  Queued again, it takes the first slot that frees on any replica but the one it failed on.
- Every shed carries Retry-After = (requests ahead of it + 1) / fleet drain rate, bounded to
  [retry_min_s, retry_max_s], as whole seconds (rounded up) and as milliseconds; retry_min_s
  while nothing has drained in the window. Until the first release is a window old, the
  rate is counted over the time since that release, not over the whole window (which read
  a tenth of the truth in the first second, and told clients 20 s).
- Whenever capacity may have changed (a release, a cap change, a replica added or removed, an
  offer), queued requests are routed again in queue order and admitted where their route now has
  room. Lowering a cap never cancels running requests.

Pure and deterministic: time is the `now` argument of every call, and `now` must not go
backwards between calls.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Final, Literal, Protocol

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.fleet.drain import DRAIN_WINDOW_S as DRAIN_WINDOW_S
from chatfleet.core.fleet.drain import RETRY_MAX_S as RETRY_MAX_S
from chatfleet.core.fleet.drain import RETRY_MIN_S as RETRY_MIN_S
from chatfleet.core.fleet.drain import DrainRate as DrainRate
from chatfleet.core.fleet.drain import retry_after as retry_after
from chatfleet.core.fleet.request import FleetRequest as FleetRequest
from chatfleet.core.fleet.reserve import ReserveEstimator, ReserveSettings
from chatfleet.core.fleet.waiting import Waiting, WaitQueue

Outcome = Literal["admitted", "queued", "shed"]
ShedReason = Literal["queue_full", "deadline", "displaced", "no_replica", "key_limit"]

RETURNING, NEW = 0, 1  # queue classes: lower goes first


class Decision:
    """What happened to one request at `at`.

    admitted: `replica` is where it runs. queued: `replica` is the route's current choice (it
    may change before admission), `deadline` when it will be shed. shed: `reason`, and the
    Retry-After as whole seconds (the HTTP header) and milliseconds (`retry-after-ms`).

    A value that never changes: its attributes are Final, which mypy enforces. A plain class,
    not a frozen dataclass (the fleet twin's overloaded hour makes some 100,000):
    chatfleet/_native.py says why.
    """

    __slots__ = ("at", "deadline", "outcome", "reason", "replica", "request", "retry_after_ms",
                 "retry_after_s")

    def __init__(self, request: FleetRequest, outcome: Outcome, at: float, *,
                 replica: str | None = None, deadline: float | None = None,
                 reason: ShedReason | None = None, retry_after_s: int | None = None,
                 retry_after_ms: int | None = None) -> None:
        self.request: Final = request
        self.outcome: Final = outcome
        self.at: Final = at
        self.replica: Final = replica
        self.deadline: Final = deadline
        self.reason: Final = reason
        self.retry_after_s: Final = retry_after_s
        self.retry_after_ms: Final = retry_after_ms

    def __repr__(self) -> str:
        return (f"Decision({self.request.request_id!r}, {self.outcome!r}, at={self.at}, "
                f"replica={self.replica!r}, deadline={self.deadline}, reason={self.reason!r}, "
                f"retry_after_s={self.retry_after_s}, retry_after_ms={self.retry_after_ms})")

    @property
    def admitted(self) -> bool:
        return self.outcome == "admitted"

    @property
    def queued(self) -> bool:
        return self.outcome == "queued"

    @property
    def shed(self) -> bool:
        return self.outcome == "shed"


class FleetView(Protocol):
    """What a route may read about the fleet (AdmissionController provides it)."""

    def replicas(self) -> list[str]: ...

    def cap(self, replica: str) -> int: ...

    def in_flight(self, replica: str) -> int: ...

    def can_admit(self, replica: str) -> bool: ...

    def drain_rate(self, replica: str | None, now: float) -> float: ...

    def queued_ahead(self, replica: str, request: FleetRequest) -> int: ...


# Where a request should run now, given the fleet; None when there is no replica to name.
Route = Callable[[FleetRequest, FleetView, float], "str | None"]


class AdmissionController:
    """Caps per replica, one queue, deadlines, shedding. See the module docstring."""

    def __init__(
        self,
        caps: Mapping[str, int],
        queue_depth: int,
        ttft_budget_s: float,
        *,
        route: Route,
        prefill_reserve_s: float = 0.0,
        prioritize_returning: bool = True,
        drain_window_s: float = DRAIN_WINDOW_S,
        retry_min_s: float = RETRY_MIN_S,
        retry_max_s: float = RETRY_MAX_S,
        key_limits: Mapping[str, int] | None = None,
        reserve: ReserveSettings | None = None,
    ) -> None:
        if queue_depth < 0:
            raise ChatfleetError("queue_depth must not be negative")
        if not 0 <= prefill_reserve_s < ttft_budget_s:
            raise ChatfleetError("need 0 <= prefill_reserve_s < ttft_budget_s")
        self.reserve_settings = reserve if reserve is not None else ReserveSettings(learn=False)
        self.learning = self.reserve_settings.learn
        if self.learning:
            self.reserve_settings.check(ttft_budget_s)
        if not 1.0 <= retry_min_s <= retry_max_s:
            raise ChatfleetError("need 1 <= retry_min_s <= retry_max_s")
        for replica, cap in caps.items():
            _check_cap(replica, cap)
        self.max_queue_depth = queue_depth
        self.ttft_budget_s = ttft_budget_s
        self.prefill_reserve_s = prefill_reserve_s
        self.prioritize_returning = prioritize_returning
        self.drain_window_s = drain_window_s
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s
        self._route = route
        self._caps: dict[str, int] = dict(caps)
        self._in_flight: dict[str, int] = dict.fromkeys(caps, 0)
        # kept with every change of a cap or an in-flight count: read on every call
        self._names = sorted(self._caps)  # replicas(), sorted
        self._room = {r for r, cap in self._caps.items() if cap > 0}  # the can_admit replicas
        self._drain: dict[str, DrainRate] = {r: DrainRate(drain_window_s) for r in caps}
        # per replica: admission -> first byte, learned (kept while the gateway runs: an
        # ejected replica that comes back is the same engine)
        self._reserves: dict[str, ReserveEstimator] = {r: self._estimator() for r in caps}
        self._fleet_drain = DrainRate(drain_window_s)
        self._queue = WaitQueue()
        self._seq = 0
        self.num_offered = 0
        self.num_admitted = 0
        self.num_released = 0
        self.num_cancelled = 0
        self.num_requeued = 0
        self.num_shed: dict[ShedReason, int] = {"queue_full": 0, "deadline": 0, "displaced": 0,
                                                "no_replica": 0, "key_limit": 0}
        self._key_limits: dict[str, int] = {}
        self._key_count: dict[str, int] = {}
        self.set_key_limits(key_limits or {})

    # --- reads (the FleetView) ---------------------------------------------------------------
    def replicas(self) -> list[str]:
        """Replicas that take new requests, sorted by name."""
        return self._names.copy()

    def cap(self, replica: str) -> int:
        return self._caps[replica]

    def in_flight(self, replica: str) -> int:
        """Requests admitted to `replica` and not yet released (a removed replica keeps its
        count until its requests finish)."""
        return self._in_flight.get(replica, 0)

    def can_admit(self, replica: str) -> bool:
        """`replica` is in the fleet and has fewer requests in flight than its cap."""
        return replica in self._room

    def drain_rate(self, replica: str | None, now: float) -> float:
        """Releases per second over the drain window, at one replica or (None) the fleet."""
        if replica is None:
            return self._fleet_drain.rate(now)
        drain = self._drain.get(replica)
        return 0.0 if drain is None else drain.rate(now)

    def queued_ahead(self, replica: str, request: FleetRequest) -> int:
        """Queued requests ahead of `request` (queued or about to be) whose route last named
        `replica`."""
        key = self._key_of(request)
        return sum(1 for w in self._queue if w.key < key and w.target == replica)

    def key_count(self, key: str) -> int:
        """Requests under `key` queued or in flight."""
        return self._key_count.get(key, 0)

    def queue_depth(self) -> int:
        """Requests waiting now."""
        return len(self._queue)

    def queued_requests(self) -> list[FleetRequest]:
        """Waiting requests in the order they will be considered."""
        return [w.request for w in self._queue]

    def avoids(self, request_id: str) -> str | None:
        """The replica a queued, requeued request failed on and will not go back to."""
        waiting = self._queue.get(request_id)
        return None if waiting is None else waiting.avoid

    def reserve_s(self, replica: str | None) -> float:
        """The part of the TTFT budget kept for admission -> first byte at `replica`: the
        configured `prefill_reserve_s`, or (learning) the replica's learned reserve. None, a
        request with no replica named yet: the largest over the fleet's replicas."""
        if not self.learning:
            return self.prefill_reserve_s
        if replica is None:
            return max((self._reserves[r].value_s for r in self._names),
                       default=self.prefill_reserve_s)
        est = self._reserves.get(replica)
        return self.prefill_reserve_s if est is None else est.value_s

    def reserves(self) -> dict[str, ReserveEstimator]:
        """Every replica's estimator (learned or not), by name."""
        return dict(self._reserves)

    def deadline(self, request: FleetRequest, replica: str | None = None) -> float:
        """When `request`, going to `replica`, must be admitted at the latest: arrival +
        budget - the replica's reserve."""
        return request.arrival + self.ttft_budget_s - self.reserve_s(replica)

    def next_deadline(self) -> float | None:
        """The earliest deadline in the queue: when a shell should call `expire` next."""
        return self._queue.earliest_deadline()

    # --- changes ------------------------------------------------------------------------------
    def offer(self, request: FleetRequest, now: float) -> list[Decision]:
        """A request arrives. The first decision is about `request`; any others are what the
        queue did first (expired requests shed, waiting ones admitted)."""
        if request.request_id in self._queue:
            raise ValueError(f"request {request.request_id!r} is already queued")
        self.num_offered += 1
        earlier = self._dispatch(now)
        klass = self._klass(request)
        over = None if request.key is None else self._over_key_limit(request)
        if over is not None:
            return [self._shed(request, "key_limit", over, now), *earlier]
        decisions = self._offer(request, klass, now)
        if request.key is not None and decisions[0].outcome != "shed":
            self._count_key(request, +1)
        return [*decisions, *earlier] if earlier else decisions

    def _offer(self, request: FleetRequest, klass: int, now: float) -> list[Decision]:
        """`offer` once the key limit let the request in: its decision (and a displaced
        request's shed). A request shed here had the queue's requests of its class and above
        ahead of it."""
        if not self._caps:
            return [self._shed(request, "no_replica", self._queue.num_up_to_class(klass), now)]
        target = self._route(request, self, now)
        deadline = self.deadline(request, target)
        if now > deadline:
            return [self._shed(request, "deadline", self._queue.num_up_to_class(klass), now)]
        if target is not None and self.can_admit(target):
            return [self.admit(request, target, now)]
        if len(self._queue) < self.max_queue_depth:
            return [self._enqueue(request, klass, deadline, target, now)]
        last = self._queue.last()
        if klass == RETURNING and last is not None and last.klass == NEW:
            displaced = self._queue.pop_last()
            decision = self._enqueue(request, klass, deadline, target, now)
            shed = self._shed(displaced.request, "displaced", len(self._queue), now)
            self._count_key(displaced.request, -1)
            return [decision, shed]
        return [self._shed(request, "queue_full", self._queue.num_up_to_class(klass), now)]

    def admit(self, request: FleetRequest, replica: str, now: float) -> Decision:
        """Admit `request` to `replica` (which must have room): what `offer` does when it can."""
        if not self.can_admit(replica):
            raise ValueError(f"replica {replica!r} has no room")
        self._add_in_flight(replica, +1)
        self.num_admitted += 1
        return Decision(request, "admitted", now, replica=replica)

    def release(self, replica: str, now: float, key: str | None = None) -> list[Decision]:
        """A request at `replica` (under API key `key`, if any) finished (or failed): its slot
        frees, the drain rate counts it, and whoever can go now is admitted, in queue order,
        expired ones shed."""
        count = self._in_flight.get(replica, 0)
        if count == 0:
            raise ValueError(f"replica {replica!r} has nothing in flight to release")
        if key is not None and self._key_count.get(key, 0) == 0:
            raise ValueError(f"key {key!r} has nothing queued or in flight to release")
        self._add_in_flight(replica, -1)
        if key is not None:
            self._key_count[key] -= 1
        self.num_released += 1
        drain = self._drain.get(replica)
        if drain is None:  # (kept while it has requests in flight: never, in practice)
            drain = self._drain[replica] = DrainRate(self.drain_window_s)
        drain.observe(now)
        self._fleet_drain.observe(now)
        self._forget_if_gone(replica)
        return self._dispatch(now)

    def requeue(self, request: FleetRequest, failed: str, now: float) -> list[Decision]:
        """`request`, admitted to `failed`, failed there before its first byte: free its slot
        (not counted as drained) and place it again, never at `failed` (the module docstring
        states the rule). The first decision is about `request` (and a request it displaced);
        any others are what the queue did first (expired requests shed, a waiting one admitted
        to the freed slot)."""
        count = self._in_flight.get(failed, 0)
        if count == 0:
            raise ValueError(f"replica {failed!r} has nothing in flight to requeue")
        if request.request_id in self._queue:
            raise ValueError(f"request {request.request_id!r} is already queued")
        self._add_in_flight(failed, -1)
        self._forget_if_gone(failed)
        self.num_requeued += 1
        earlier = self._dispatch(now)  # the freed slot first: it is not for `request`
        return [*self._place_again(request, failed, now), *earlier]

    def expire(self, now: float) -> list[Decision]:
        """Shed every queued request past its deadline (and admit any that can go)."""
        return self._dispatch(now)

    def first_byte(self, replica: str, admitted_at: float, now: float) -> list[Decision]:
        """The first byte of a request admitted to `replica` at `admitted_at` came back at
        `now`: with `reserve.learn`, a sample of that replica's reserve. A changed reserve
        moves the deadlines of the requests queued for it; those now past theirs are shed.
        Without learning, nothing happens."""
        if not self.learning:
            return []
        est = self._reserves.get(replica)
        if est is None:
            est = self._reserves[replica] = self._estimator()
        if not est.observe(now - admitted_at, now):
            return []
        for waiting in self._queue:
            self._queue.set_deadline(waiting, self.deadline(waiting.request, waiting.target))
        return self._dispatch(now)

    def cancel(self, request_id: str) -> bool:
        """The client of a queued request went away: drop it. False if it was not queued."""
        waiting = self._queue.pop(request_id)
        if waiting is None:
            return False
        self.num_cancelled += 1
        self._count_key(waiting.request, -1)
        return True

    def set_cap(self, replica: str, cap: int, now: float) -> list[Decision]:
        """Hot reload. Lowering a cap cancels nothing: it stops admissions at `replica` until
        its in-flight count falls under the new cap. Raising one admits waiting requests."""
        if replica not in self._caps:
            raise KeyError(replica)
        _check_cap(replica, cap)
        self._caps[replica] = cap
        self._refresh_room(replica)
        return self._dispatch(now)

    def set_key_limits(self, limits: Mapping[str, int]) -> None:
        """Hot reload of the per-key limits (key name -> requests queued or in flight). A
        lower limit cancels nothing: the key's new requests are shed until it is under it."""
        for key, limit in limits.items():
            if limit < 1:
                raise ValueError(f"the limit of key {key!r} must be at least 1")
        self._key_limits = dict(limits)

    def add_replica(self, replica: str, cap: int, now: float) -> list[Decision]:
        if replica in self._caps:
            raise ValueError(f"replica {replica!r} is already in the fleet")
        _check_cap(replica, cap)
        self._caps[replica] = cap
        self._in_flight.setdefault(replica, 0)
        self._names = sorted(self._caps)
        self._refresh_room(replica)
        self._drain.setdefault(replica, DrainRate(self.drain_window_s))
        self._reserves.setdefault(replica, self._estimator())
        return self._dispatch(now)

    def remove_replica(self, replica: str, now: float) -> list[Decision]:
        """Stop admitting to `replica`. Its running requests finish (release them as usual);
        requests waiting for it are routed again."""
        del self._caps[replica]
        self._names.remove(replica)
        self._refresh_room(replica)
        self._forget_if_gone(replica)
        return self._dispatch(now)

    # --- internals ----------------------------------------------------------------------------
    def _estimator(self) -> ReserveEstimator:
        return ReserveEstimator(self.prefill_reserve_s, self.reserve_settings,
                                self.reserve_settings.ceiling_s(self.ttft_budget_s))

    def _klass(self, request: FleetRequest) -> int:
        return RETURNING if self.prioritize_returning and request.returning else NEW

    def _key_of(self, request: FleetRequest) -> tuple[int, int, float]:
        waiting = self._queue.get(request.request_id)
        if waiting is not None:
            return waiting.key
        return (self._klass(request), 1, math.inf)

    def _over_key_limit(self, request: FleetRequest) -> int | None:
        """How many requests its key holds over its limit (0: exactly at it), or None when the
        request may come in."""
        key = request.key
        if key is None or key not in self._key_limits:
            return None
        over = self._key_count.get(key, 0) - self._key_limits[key]
        return over if over >= 0 else None

    def _count_key(self, request: FleetRequest, delta: int) -> None:
        key = request.key
        if key is None:
            return
        count = self._key_count.get(key, 0) + delta
        if count:
            self._key_count[key] = count
        else:
            self._key_count.pop(key, None)

    def _roomiest(self, avoid: str) -> str | None:
        """The replica other than `avoid` with room, lowest in-flight / cap first (then
        name): where a requeued request goes."""
        room = [r for r in self._caps if r != avoid and self.can_admit(r)]
        return min(room, key=lambda r: (self.in_flight(r) / max(1, self._caps[r]), r),
                   default=None)

    def _place_again(self, request: FleetRequest, failed: str, now: float) -> list[Decision]:
        klass = self._klass(request)
        key = (klass, 0, math.inf)  # behind the requeued of its class, ahead of the rest
        ahead = self._queue.num_before(key)
        if not any(r != failed for r in self._caps):
            return [self._leave(self._shed(request, "no_replica", ahead, now))]
        target = self._roomiest(failed)
        deadline = self.deadline(request, target)
        if now > deadline:  # as in `offer`: never admitted past its deadline
            return [self._leave(self._shed(request, "deadline", ahead, now))]
        if target is not None:
            return [self.admit(request, target, now)]
        if len(self._queue) < self.max_queue_depth:
            return [self._enqueue(request, klass, deadline, None, now, avoid=failed)]
        last = self._queue.last()
        if last is None or last.key < key:
            return [self._leave(self._shed(request, "queue_full", ahead, now))]
        displaced = self._queue.pop_last()  # the last in line ranks below it
        decision = self._enqueue(request, klass, deadline, None, now, avoid=failed)
        return [decision, self._leave(self._shed(displaced.request, "displaced",
                                                 len(self._queue), now))]

    def _enqueue(self, request: FleetRequest, klass: int, deadline: float, target: str | None,
                 now: float, avoid: str | None = None) -> Decision:
        waiting = Waiting(request, klass, self._seq, deadline, target, avoid)
        self._seq += 1
        self._queue.insert(waiting)
        return Decision(request, "queued", now, replica=target, deadline=deadline)

    def _shed(self, request: FleetRequest, reason: ShedReason, ahead: int,
              now: float) -> Decision:
        seconds, ms = retry_after(ahead, self._fleet_drain.rate_since_first(now),
                                  self.retry_min_s, self.retry_max_s)
        self.num_shed[reason] += 1
        return Decision(request, "shed", now, reason=reason, retry_after_s=seconds,
                        retry_after_ms=ms)

    def _leave(self, shed: Decision) -> Decision:
        """A request that counted against its key (queued, or requeued) was shed."""
        self._count_key(shed.request, -1)
        return shed

    def _shed_hopeless(self, now: float) -> list[Decision]:
        """Shed every queued request past its deadline, or left with no replica it may go to
        (the fleet is empty, or holds only the replica a requeued request failed on)."""
        caps = self._caps
        # a request has no replica it may go to when every replica is the one it avoids
        lone = next(iter(caps)) if len(caps) == 1 else None
        out: list[Decision] = []
        kept: list[Waiting] = []
        for waiting in self._queue:
            if now > waiting.deadline:
                reason: ShedReason = "deadline"
            elif not caps or (lone is not None and waiting.avoid == lone):
                reason = "no_replica"
            else:
                kept.append(waiting)
                continue
            out.append(self._leave(self._shed(waiting.request, reason, len(kept), now)))
        if out:
            self._queue.keep_only(kept)
        return out

    def _dispatch(self, now: float) -> list[Decision]:
        """Shed the hopeless, then admit waiting requests in queue order while their route
        names a replica with room (a requeued request: any other replica with room). Each
        admission changes the fleet, so the scan restarts."""
        queue = self._queue
        earliest = queue.earliest_deadline()
        if earliest is None:
            return []  # nothing waits
        # with two replicas or more, each request has one it may go to: only the late go
        out = self._shed_hopeless(now) if now > earliest or len(self._caps) < 2 else []
        while self._room and queue:  # room first: under overload, the test that fails
            for waiting in self._queue:
                if waiting.avoid is None:
                    target = self._route(waiting.request, self, now)
                else:
                    target = self._roomiest(waiting.avoid)
                if target != waiting.target:
                    waiting.target = target
                    if self.learning:  # its deadline is the new target's
                        queue.set_deadline(waiting, self.deadline(waiting.request, target))
                if target is not None and self.can_admit(target):
                    if now > waiting.deadline:  # too late for this replica's reserve
                        ahead = queue.num_before(waiting.key)
                        queue.remove(waiting)
                        out.append(self._leave(self._shed(waiting.request, "deadline", ahead,
                                                          now)))
                    else:
                        queue.remove(waiting)
                        out.append(self.admit(waiting.request, target, now))
                    break
            else:
                break
        return out

    def _add_in_flight(self, replica: str, delta: int) -> None:
        self._in_flight[replica] += delta
        self._refresh_room(replica)

    def _refresh_room(self, replica: str) -> None:
        """Whether `replica` has room, after its cap or its in-flight count changed."""
        cap = self._caps.get(replica)
        if cap is not None and self._in_flight.get(replica, 0) < cap:
            self._room.add(replica)
        else:
            self._room.discard(replica)

    def _forget_if_gone(self, replica: str) -> None:
        if replica not in self._caps and self._in_flight.get(replica, 0) == 0:
            self._in_flight.pop(replica, None)
            self._drain.pop(replica, None)


def _check_cap(replica: str, cap: int) -> None:
    if cap < 0:
        raise ChatfleetError(f"cap of {replica!r} must not be negative")
