"""The live fleet: `core/fleet`'s admission and routing on the event loop's clock.

The core decides; this shell keeps the futures of queued requests, arms one timer for the
earliest queue deadline, keeps the health of each replica and its connection pool, and applies
configuration changes (caps, replicas) without touching running streams. A replica joins the
core's fleet only once it has passed a probe (at start-up, or after it was added at run time):
until then it takes no request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.fleet.admission import Decision, DrainRate, FleetRequest, Outcome
from chatfleet.core.fleet.fairshare import Demand
from chatfleet.core.fleet.fleet import Fleet, FleetSettings, FleetTrace
from chatfleet.core.fleet.health import ReplicaHealth, Transition
from chatfleet.gateway.config import GatewayConfig, ReplicaConfig, key_limits
from chatfleet.gateway.metrics import GatewayMetrics, Gauges
from chatfleet.gateway.upstream import Pool

log = logging.getLogger("chatfleet.gateway")

# uvloop's clock (loop.time()) reads whole milliseconds, and its timers round their delay to
# the millisecond. The core sheds a queued request when now > deadline, so the first reading
# that can be past a deadline is one tick after it: a deadline timer armed any closer fires
# while the clock still reads the deadline's own millisecond, finds nothing expired and arms
# again 0 ms away, spinning until the clock moves (hundreds of calls a deadline, measured).
CLOCK_TICK_S = 0.001


@dataclass(slots=True)
class LiveReplica:
    config: ReplicaConfig
    cap: int
    pool: Pool
    health: ReplicaHealth
    removed: bool = False  # dropped from the configuration; kept until its streams end
    last_failure: str = ""  # what the last failed probe or request said

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def serving(self) -> bool:
        """In the core's fleet: not removed, has passed a probe, not ejected."""
        return not self.removed and self.health.serving


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


DEMAND_WINDOW_S = 5.0  # the offered rate a gateway publishes: requests over the last 5 s


class LiveFleet:
    """`core.fleet.Fleet` on the event loop's clock (see the module docstring)."""

    def __init__(self, cfg: GatewayConfig, step_time: StepTimeModel,
                 metrics: GatewayMetrics, log: DecisionLog | None = None,
                 trace: FleetTrace | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.metrics = metrics
        self.log = log
        self.replicas: dict[str, LiveReplica] = {}
        self._waiters: dict[str, asyncio.Future[Decision]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self.cfg = cfg
        # this gateway's share of each replica's cap (shared.py); None: it counts alone
        self.shares: dict[str, int] | None = None
        self.others: dict[str, int] = {}  # other gateways' requests in flight, per replica
        self.state_up = True  # the shared store answers (always, in memory)
        self.offered = DrainRate(DEMAND_WINDOW_S)  # arrivals, for the published demand
        self.core = Fleet({}, fleet_settings(cfg), step_time, trace)
        self._key_limits = key_limits(cfg)
        self.ac = self.core.ac  # reads only: every change goes through self.core
        self.router = self.core.router
        self.apply(cfg)

    def now(self) -> float:
        return self.loop.time()

    def effective_cap(self, rep: LiveReplica) -> int:
        """The cap this gateway's core enforces: the replica's cap, or with several gateways
        this gateway's share of it (never more than the cap)."""
        if self.shares is None:
            return rep.cap
        return min(rep.cap, self.shares.get(rep.name, 0))

    def set_shares(self, shares: dict[str, int]) -> None:
        self.shares = dict(shares)
        self._push_caps()

    def in_flight(self, name: str) -> int:
        return self.ac.in_flight(name)

    def demand(self) -> Demand:
        """What this gateway's clients ask for now: requests offered per second over the
        window, and requests queued or in flight."""
        now = self.now()
        need = self.ac.queue_depth() + sum(self.ac.in_flight(n) for n in self.replicas)
        return Demand(self.offered.rate(now), need)

    def _push_caps(self) -> None:
        now = self.now()
        decisions: list[Decision] = []
        for name, rep in self.replicas.items():
            if rep.serving and self.ac.cap(name) != self.effective_cap(rep):
                decisions += self.core.set_cap(name, self.effective_cap(rep), now)
        self.dispatch(decisions)

    # --- configuration ------------------------------------------------------------------------
    def apply(self, cfg: GatewayConfig) -> None:
        """Take a new configuration: caps, queue depth, replicas joining or leaving, health
        thresholds. Running requests are never touched; a removed replica finishes its
        streams. Routing mode and the TTFT budget are fixed at start."""
        now = self.now()
        self.cfg = cfg
        decisions: list[Decision] = []
        if cfg.queue_depth != self.ac.max_queue_depth:
            decisions += self.core.set_queue_depth(cfg.queue_depth, now)
        limits = key_limits(cfg)
        if limits != self._key_limits:
            self.core.set_key_limits(limits, now)
            self._key_limits = limits
        wanted = {r.name: r for r in cfg.replicas}
        for name, rep in list(self.replicas.items()):
            if name not in wanted or wanted[name].url != rep.config.url:
                decisions += self._take_out(rep, now)
                rep.removed = True
                rep.pool.close()
                del self.replicas[name]
        for name, rc in wanted.items():
            cap = cfg.replica_cap(rc)
            known = self.replicas.get(name)
            if known is None:  # pending: it joins the core at its first probe success
                self.replicas[name] = LiveReplica(
                    rc, cap, Pool(rc.host, rc.port),
                    ReplicaHealth(cfg.health.eject_after_failures,
                                  cfg.health.readmit_after_successes, pending=True))
                continue
            rep = known
            rep.config = rc
            rep.health.eject_after_failures = cfg.health.eject_after_failures
            rep.health.readmit_after_successes = cfg.health.readmit_after_successes
            if rep.cap != cap:
                rep.cap = cap
                if rep.serving:
                    decisions += self.core.set_cap(name, self.effective_cap(rep), now)
        self.dispatch(decisions)

    def set_cap(self, name: str, cap: int) -> None:
        rep = self.replicas[name]
        rep.cap = cap
        if rep.serving:
            self.dispatch(self.core.set_cap(name, self.effective_cap(rep), self.now()))

    def _take_out(self, rep: LiveReplica, now: float) -> list[Decision]:
        if rep.serving:
            return self.core.remove_replica(rep.name, now)
        return []

    # --- health -------------------------------------------------------------------------------
    def report(self, name: str, ok: bool, probe: bool = False, reason: str = "") -> None:
        """An outcome at `name`: a probe's, or a request's (a request that was already
        running when its replica was ejected does not count toward bringing it back).
        `reason`: what a failure was (the ejection's log line names the last one)."""
        rep = self.replicas.get(name)
        if rep is None or (not rep.health.serving and not probe):
            return
        if not ok:
            self.metrics.upstream_failures[name] += 1
            rep.last_failure = reason or ("a probe failed" if probe else "a request failed")
        self._transition(rep, rep.health.success() if ok else rep.health.failure())

    def _transition(self, rep: LiveReplica, t: Transition | None) -> None:
        now = self.now()
        h = rep.health
        if t == "ejected":
            log.warning("replica %s (%s) ejected after %d consecutive failures, the last: %s",
                        rep.name, rep.config.url, h.eject_after_failures, rep.last_failure)
            self.metrics.ejections[rep.name] += 1
            self.dispatch(self.core.remove_replica(rep.name, now))
            rep.pool.close()
        elif t in ("ready", "readmitted") and not rep.removed:
            if t == "readmitted":
                log.warning("replica %s (%s) readmitted after %d successful probes", rep.name,
                            rep.config.url, h.readmit_after_successes)
            else:
                log.info("replica %s (%s) serving: its first probe passed", rep.name,
                         rep.config.url)
            self.dispatch(self.core.add_replica(rep.name, self.effective_cap(rep), now))

    # --- admission ----------------------------------------------------------------------------
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
    def gauges(self) -> Gauges:
        sessions = session_bytes = 0
        if self.router is not None:
            sessions = len(self.router.sessions)
            session_bytes = self.router.sessions.num_bytes
        return Gauges(
            queue_depth=self.ac.queue_depth(),
            in_flight={n: self.ac.in_flight(n) for n in self.replicas},
            caps={n: r.cap for n, r in self.replicas.items()},
            shares={n: self.effective_cap(r) for n, r in self.replicas.items()},
            healthy={n: r.serving for n, r in self.replicas.items()},
            sessions=sessions, routes={str(k): v for k, v in self.core.num_routes.items()},
            state_up=int(self.state_up), others=dict(self.others),
            session_bytes=session_bytes,
            reserves={n: self.ac.reserve_s(n) for n in self.replicas},
            reserve_samples={n: len(est) for n, est in self.ac.reserves().items()
                             if n in self.replicas})

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for fut in self._waiters.values():
            fut.cancel()
        for rep in self.replicas.values():
            with contextlib.suppress(Exception):
                rep.pool.close()
