"""The replica registry: the replicas the configuration names, each with its connection pool,
its health and its cap, and which of them admission may use.

A replica joins admission (is seated) only once it has passed a probe (at start-up, or after it
was added at run time): until then it takes no request. One that fails too often is ejected
(unseated, its pool closed) and seated again after enough probes pass. A configuration change
adds and removes replicas and changes caps without touching running streams: a removed replica
finishes its streams. With several gateways the cap admission enforces is this gateway's share
of the replica's (shared.py sets the shares).

The registry tells admission only through `Seats` (gateway/admission.py's `LiveAdmission`
keeps it): seat a replica at a cap, unseat it, change its cap, read the cap it enforces.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Protocol

from chatfleet.core.fleet.health import ReplicaHealth, Transition
from chatfleet.gateway.config import GatewayConfig, ReplicaConfig
from chatfleet.gateway.metrics import GatewayMetrics
from chatfleet.gateway.upstream import Pool

log = logging.getLogger("chatfleet.gateway")


class Seats(Protocol):
    """What the registry asks of admission: the replicas it admits to, and each one's cap."""

    def add_replica(self, name: str, cap: int) -> None: ...

    def remove_replica(self, name: str) -> None: ...

    def set_cap(self, name: str, cap: int) -> None: ...

    def cap(self, name: str) -> int: ...


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
        """Seated in admission: not removed, has passed a probe, not ejected."""
        return not self.removed and self.health.serving


class ReplicaRegistry:
    """The replicas by name (see the module docstring); admission is its `seats`."""

    def __init__(self, seats: Seats, metrics: GatewayMetrics) -> None:
        self.seats = seats
        self.metrics = metrics
        self.replicas: dict[str, LiveReplica] = {}
        # this gateway's share of each replica's cap (shared.py); None: it counts alone
        self.shares: dict[str, int] | None = None

    def effective_cap(self, rep: LiveReplica) -> int:
        """The cap admission enforces: the replica's cap, or with several gateways this
        gateway's share of it (never more than the cap)."""
        if self.shares is None:
            return rep.cap
        return min(rep.cap, self.shares.get(rep.name, 0))

    def set_shares(self, shares: dict[str, int]) -> None:
        self.shares = dict(shares)
        for name, rep in self.replicas.items():
            if rep.serving and self.seats.cap(name) != self.effective_cap(rep):
                self.seats.set_cap(name, self.effective_cap(rep))

    # --- configuration ------------------------------------------------------------------------
    def apply(self, cfg: GatewayConfig) -> None:
        """Take a new configuration's replicas: joining (pending until a probe passes),
        leaving (unseated, their pools closed), their caps and health thresholds."""
        wanted = {r.name: r for r in cfg.replicas}
        for name, rep in list(self.replicas.items()):
            if name not in wanted or wanted[name].url != rep.config.url:
                if rep.serving:
                    self.seats.remove_replica(name)
                rep.removed = True
                rep.pool.close()
                del self.replicas[name]
        for name, rc in wanted.items():
            cap = cfg.replica_cap(rc)
            known = self.replicas.get(name)
            if known is None:  # pending: it is seated at its first probe success
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
                self.set_cap(name, cap)

    def set_cap(self, name: str, cap: int) -> None:
        rep = self.replicas[name]
        rep.cap = cap
        if rep.serving:
            self.seats.set_cap(name, self.effective_cap(rep))

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
        h = rep.health
        if t == "ejected":
            log.warning("replica %s (%s) ejected after %d consecutive failures, the last: %s",
                        rep.name, rep.config.url, h.eject_after_failures, rep.last_failure)
            self.metrics.ejections[rep.name] += 1
            self.seats.remove_replica(rep.name)
            rep.pool.close()
        elif t in ("ready", "readmitted") and not rep.removed:
            if t == "readmitted":
                log.warning("replica %s (%s) readmitted after %d successful probes", rep.name,
                            rep.config.url, h.readmit_after_successes)
            else:
                log.info("replica %s (%s) serving: its first probe passed", rep.name,
                         rep.config.url)
            self.seats.add_replica(rep.name, self.effective_cap(rep))

    def close(self) -> None:
        for rep in self.replicas.values():
            with contextlib.suppress(Exception):
                rep.pool.close()
