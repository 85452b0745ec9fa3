"""The live fleet: `core/fleet`'s admission and routing on the event loop's clock.

The core decides; this shell keeps the futures of queued requests, arms one timer for the
earliest queue deadline, keeps the health of each replica and its connection pool, and applies
configuration changes (caps, replicas) without touching running streams.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.fleet.admission import Decision, FleetRequest
from chatfleet.core.fleet.fleet import Fleet, FleetSettings, FleetTrace
from chatfleet.core.fleet.health import ReplicaHealth, Transition
from chatfleet.gateway.config import GatewayConfig, ReplicaConfig
from chatfleet.gateway.metrics import GatewayMetrics, Gauges
from chatfleet.gateway.upstream import Pool

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

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def serving(self) -> bool:
        return not self.removed and not self.health.ejected


@dataclass(slots=True)
class DecisionLog:
    """Every admission decision, in order (the parity test and `--decisions` read it)."""

    rows: list[tuple[float, str, str, str | None, str | None]] = field(default_factory=list)
    limit: int = 1_000_000

    def add(self, d: Decision) -> None:
        if len(self.rows) < self.limit:
            self.rows.append((d.at, d.request.request_id, d.outcome, d.replica, d.reason))


def fleet_settings(cfg: GatewayConfig) -> FleetSettings:
    return FleetSettings(
        queue_depth=cfg.queue_depth, ttft_budget_s=cfg.ttft_budget_s,
        prefill_reserve_s=cfg.prefill_reserve_s, prioritize_returning=cfg.prioritize_returning,
        affinity=cfg.routing.affinity, shared_prefix_tokens=cfg.routing.shared_prefix_tokens,
        session_ttl_s=cfg.routing.session_ttl_s, max_sessions=cfg.routing.max_sessions)


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
        self.others: dict[str, int] = {}  # slots other gateways hold, per replica (shared.py)
        self.share = 1  # > 1: the shared store is down; each cap is split this many ways
        self.state_up = True  # the shared store answers (always, in memory)
        self.core = Fleet({}, fleet_settings(cfg), step_time, trace)
        self.ac = self.core.ac  # reads only: every change goes through self.core
        self.router = self.core.router
        self.apply(cfg)

    def now(self) -> float:
        return self.loop.time()

    def effective_cap(self, rep: LiveReplica) -> int:
        """The cap this gateway's core enforces: the replica's cap minus what other gateways
        hold; with the shared store down, this gateway's share of it."""
        if self.share > 1:
            return max(1, rep.cap // self.share) if rep.cap > 0 else 0
        return max(0, rep.cap - self.others.get(rep.name, 0))

    def set_others(self, others: dict[str, int]) -> None:
        self.others = others
        self._push_caps()

    def set_share(self, share: int) -> None:
        self.share = max(1, share)
        self._push_caps()

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
            if known is None:
                new = LiveReplica(rc, cap, Pool(rc.host, rc.port),
                                  ReplicaHealth(cfg.health.eject_after_failures,
                                                cfg.health.readmit_after_successes))
                self.replicas[name] = new
                decisions += self.core.add_replica(name, self.effective_cap(new), now)
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
    def report(self, name: str, ok: bool, probe: bool = False) -> None:
        """An outcome at `name`: a probe's, or a request's (a request that was already
        running when its replica was ejected does not count toward bringing it back)."""
        rep = self.replicas.get(name)
        if rep is None or (rep.health.ejected and not probe):
            return
        if not ok:
            self.metrics.upstream_failures[name] += 1
        self._transition(rep, rep.health.success() if ok else rep.health.failure())

    def _transition(self, rep: LiveReplica, t: Transition | None) -> None:
        now = self.now()
        if t == "ejected":
            self.metrics.ejections[rep.name] += 1
            self.dispatch(self.core.remove_replica(rep.name, now))
            rep.pool.close()
        elif t == "readmitted" and not rep.removed:
            self.dispatch(self.core.add_replica(rep.name, self.effective_cap(rep), now))

    # --- admission ----------------------------------------------------------------------------
    def offer(self, req: FleetRequest) -> Decision | asyncio.Future[Decision]:
        """The request's decision now, or a future that resolves when it is admitted or shed."""
        decisions = self.core.offer(req, self.now())
        first = decisions[0]
        if first.queued:
            fut: asyncio.Future[Decision] = self.loop.create_future()
            self._waiters[req.request_id] = fut
            self.dispatch(decisions)
            return fut
        self.dispatch(decisions)
        return first

    async def acquire(self, req: FleetRequest) -> Decision:
        """Admitted or shed; a cancelled wait leaves the queue (or releases the slot that was
        granted in the same instant)."""
        got = self.offer(req)
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
                    self.release(d.replica)
            raise

    def admit_elsewhere(self, req: FleetRequest, avoid: str) -> Decision | None:
        """The retry after a failure before the first byte: a slot on another serving replica
        with room (least loaded first), or None."""
        d = self.core.admit_elsewhere(req, avoid, self.now())
        if d is not None:
            self.dispatch([d])
        return d

    def release(self, replica: str) -> None:
        self.dispatch(self.core.release(replica, self.now()))

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
        sessions = 0
        if self.router is not None:
            sessions = len(self.router.sessions)
        return Gauges(
            queue_depth=self.ac.queue_depth(),
            in_flight={n: self.ac.in_flight(n) for n in self.replicas},
            caps={n: r.cap for n, r in self.replicas.items()},
            healthy={n: r.serving for n, r in self.replicas.items()},
            sessions=sessions, routes={str(k): v for k, v in self.core.num_routes.items()},
            state_up=int(self.state_up), others=dict(self.others))

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for fut in self._waiters.values():
            fut.cancel()
        for rep in self.replicas.values():
            with contextlib.suppress(Exception):
                rep.pool.close()
