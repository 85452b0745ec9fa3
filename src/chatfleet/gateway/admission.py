"""The gateway's admission: `core/fleet`'s admission and routing on the event loop's clock.

The core decides; this shell keeps the futures of queued requests, arms one timer for the
earliest queue deadline, logs every decision and counts the sheds. It admits to the replicas
the registry (replicas.py) seats in it, at the caps the registry gives: `LiveAdmission` is the
registry's `Seats`. It knows nothing of pools, probes or health.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.fleet.admission import Decision, DrainRate, FleetRequest, Outcome
from chatfleet.core.fleet.fairshare import Demand
from chatfleet.core.fleet.fleet import Fleet, FleetSettings, FleetTrace
from chatfleet.gateway.config import GatewayConfig, key_limits
from chatfleet.gateway.metrics import GatewayMetrics

# uvloop's clock (loop.time()) reads whole milliseconds, and its timers round their delay to
# the millisecond. The core sheds a queued request when now > deadline, so the first reading
# that can be past a deadline is one tick after it: a deadline timer armed any closer fires
# while the clock still reads the deadline's own millisecond, finds nothing expired and arms
# again 0 ms away, spinning until the clock moves (hundreds of calls a deadline, measured).
CLOCK_TICK_S = 0.001

DEMAND_WINDOW_S = 5.0  # the offered rate a gateway publishes: requests over the last 5 s


class DecisionRow(NamedTuple):
    """One admission decision as the log keeps it."""

    at: float
    request_id: str
    outcome: Outcome
    replica: str | None
    reason: str | None


@dataclass(slots=True)
class DecisionLog:
    """Every admission decision, in order (the parity test and `--decisions` read it)."""

    rows: list[DecisionRow] = field(default_factory=list)
    limit: int = 1_000_000

    def add(self, d: Decision) -> None:
        if len(self.rows) < self.limit:
            self.rows.append(DecisionRow(d.at, d.request.request_id, d.outcome, d.replica,
                                         d.reason))


def fleet_settings(cfg: GatewayConfig) -> FleetSettings:
    return FleetSettings(
        queue_depth=cfg.queue_depth, ttft_budget_s=cfg.ttft_budget_s,
        prefill_reserve_s=cfg.prefill_reserve_s, prioritize_returning=cfg.prioritize_returning,
        affinity=cfg.routing.affinity, shared_prefix_tokens=cfg.routing.shared_prefix_tokens,
        session_ttl_s=cfg.routing.session_ttl_s, max_sessions=cfg.routing.max_sessions,
        key_limits=key_limits(cfg), reserve=cfg.reserve, spill=cfg.routing.spill)


class LiveAdmission:
    """`core.fleet.Fleet` on the event loop's clock (see the module docstring). Requests come
    in through `offer`/`acquire`/`requeue` and leave through `release`; the registry seats
    replicas and sets their caps through `add_replica`/`remove_replica`/`set_cap`."""

    def __init__(self, cfg: GatewayConfig, step_time: StepTimeModel,
                 metrics: GatewayMetrics, log: DecisionLog | None = None,
                 trace: FleetTrace | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.metrics = metrics
        self.log = log
        self._waiters: dict[str, asyncio.Future[Decision]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.offered = DrainRate(DEMAND_WINDOW_S)  # arrivals, for the published demand
        self.core = Fleet({}, fleet_settings(cfg), step_time, trace)
        self._key_limits = key_limits(cfg)
        self.ac = self.core.ac  # reads only: every change goes through self.core
        self.router = self.core.router

    def now(self) -> float:
        return self.loop.time()

    # --- configuration ------------------------------------------------------------------------
    def apply(self, cfg: GatewayConfig) -> None:
        """Take a new configuration's queue depth and per-key limits (the replicas and their
        caps are the registry's; routing mode and the TTFT budget are fixed at start)."""
        now = self.now()
        decisions: list[Decision] = []
        if cfg.queue_depth != self.ac.max_queue_depth:
            decisions += self.core.set_queue_depth(cfg.queue_depth, now)
        limits = key_limits(cfg)
        if limits != self._key_limits:
            self.core.set_key_limits(limits, now)
            self._key_limits = limits
        self.dispatch(decisions)

    # --- the registry's seats -----------------------------------------------------------------
    def add_replica(self, name: str, cap: int) -> None:
        self.dispatch(self.core.add_replica(name, cap, self.now()))

    def remove_replica(self, name: str) -> None:
        self.dispatch(self.core.remove_replica(name, self.now()))

    def set_cap(self, name: str, cap: int) -> None:
        self.dispatch(self.core.set_cap(name, cap, self.now()))

    def cap(self, name: str) -> int:
        return self.ac.cap(name)

    # --- requests -----------------------------------------------------------------------------
    def offer(self, req: FleetRequest) -> Decision | asyncio.Future[Decision]:
        """The request's decision now, or a future that resolves when it is admitted or shed."""
        now = self.now()
        self.offered.observe(now)
        return self._first(req, self.core.offer(req, now))

    async def acquire(self, req: FleetRequest) -> Decision:
        """Admitted or shed; a cancelled wait leaves the queue (or releases the slot that was
        granted in the same instant)."""
        return await self._wait(req, self.offer(req))

    async def requeue(self, req: FleetRequest, failed: str) -> Decision:
        """`req` failed at `failed` before its first byte (its slot there is freed by the
        core): admitted elsewhere, or shed, at once or after waiting in the queue again."""
        return await self._wait(req, self._first(req, self.core.requeue(req, failed,
                                                                          self.now())))

    def _first(self, req: FleetRequest,
               decisions: list[Decision]) -> Decision | asyncio.Future[Decision]:
        """Hand out `decisions`; the first is about `req`: itself, or a future when queued."""
        first = decisions[0]
        if first.queued:
            fut: asyncio.Future[Decision] = self.loop.create_future()
            self._waiters[req.request_id] = fut
            self.dispatch(decisions)
            return fut
        self.dispatch(decisions)
        return first

    async def _wait(self, req: FleetRequest,
                    got: Decision | asyncio.Future[Decision]) -> Decision:
        if isinstance(got, Decision):
            return got
        try:
            return await asyncio.shield(got)
        except asyncio.CancelledError:
            self._waiters.pop(req.request_id, None)
            if not self.core.cancel(req.request_id, self.now()) and got.done() \
                    and not got.cancelled():
                d = got.result()
                if d.admitted and d.replica is not None:
                    self.release(d.replica, req.key)
            raise

    def first_byte(self, replica: str, admitted_at: float) -> None:
        """The first byte of a stream admitted to `replica` at `admitted_at` arrived now: a
        sample of the replica's learned reserve (the queue's deadlines may move)."""
        self.dispatch(self.core.first_byte(replica, admitted_at, self.now()))

    def release(self, replica: str, key: str | None = None) -> None:
        """A request (under API key `key`) at `replica` is done with its slot."""
        self.dispatch(self.core.release(replica, self.now(), key))

    def observe_usage(self, key: str | None, prompt: int | None, cached: int | None) -> None:
        self.core.observe_usage(key, prompt, cached, self.now())

    def dispatch(self, decisions: Iterable[Decision]) -> None:
        """Hand decisions (already noted by the core) to the requests waiting on them."""
        decisions = list(decisions)
        for d in decisions:
            if self.log is not None:
                self.log.add(d)
            if d.shed and d.reason is not None:
                self.metrics.shed[d.reason] += 1
        for d in decisions:
            if d.queued:
                continue
            fut = self._waiters.pop(d.request.request_id, None)
            if fut is not None and not fut.done():
                fut.set_result(d)
        self._arm()

    def _arm(self) -> None:
        nxt = self.ac.next_deadline()
        if nxt is None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer, self._timer_at = None, None
            return
        if self._timer_at is not None and self._timer_at <= nxt:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = nxt
        self._timer = self.loop.call_at(nxt + CLOCK_TICK_S, self._expire)

    def _expire(self) -> None:
        self._timer, self._timer_at = None, None
        self.dispatch(self.core.expire(self.now()))

    # --- reads --------------------------------------------------------------------------------
    def in_flight(self, name: str) -> int:
        return self.ac.in_flight(name)

    def demand(self, replicas: Iterable[str]) -> Demand:
        """What this gateway's clients ask for now: requests offered per second over the
        window, and requests queued or in flight at `replicas`."""
        need = self.ac.queue_depth() + sum(self.ac.in_flight(n) for n in replicas)
        return Demand(self.offered.rate(self.now()), need)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for fut in self._waiters.values():
            fut.cancel()
