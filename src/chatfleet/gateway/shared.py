"""Caps across gateways: this gateway's share of each replica's cap, kept in step with Redis.

The protocol (docs/gateway.md, "Several gateways: the protocol"; the atomic step is state.py's
`sync`). The invariant: at every replica, the requests all gateways have in flight never add
up to more than its cap, whatever Redis does. Each gateway's core enforces its *share* of each
cap and nothing else, and the shares add up to at most the cap:

- **shared**: the last sync succeeded. Every `refresh_s` the gateway computes its fair share
  of each replica (core/fleet/fairshare.py, from every gateway's published demand), lowers its
  core's caps at once where the fair share is smaller (never below what runs there), and asks
  Redis for the rest; a share grows only by what Redis confirms.
- **fallback**: Redis did not answer (down, paused, slow, restarted and not yet reached). The
  gateway cannot prove anything new, so it keeps the shares Redis last confirmed to it (they
  still count in Redis, for everyone) and grows nothing; it still lowers them if its demand
  falls. A gateway that has never reached Redis holds its fallback share, cap // gateways
  when `state.gateways` is set, else nothing. It goes back to shared mode only through a sync
  that succeeds: that is, after it has re-read the truth from Redis (a Redis restarted empty
  answers with a new epoch, and for a lease TTL nobody's share grows past what it held).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from typing import Literal, Protocol

from chatfleet.core.fleet.fairshare import Demand, fair_shares
from chatfleet.gateway.config import StateSettings
from chatfleet.gateway.metrics import GatewayMetrics
from chatfleet.gateway.state import ReplicaAsk, StateBackend, StateUnavailable, SyncRequest

log = logging.getLogger("chatfleet.gateway.shared")
Mode = Literal["shared", "fallback"]


class HasCap(Protocol):
    @property
    def cap(self) -> int: ...


class SharedFleet(Protocol):
    """What SharedCaps reads of this gateway's fleet and tells it (gateway/fleet.py's
    `LiveFleet`): each replica's cap, its requests in flight here, this gateway's demand; it
    sets this gateway's shares, the other gateways' requests in flight and whether the store
    answers."""

    @property
    def replicas(self) -> Mapping[str, HasCap]: ...

    others: dict[str, int]
    state_up: bool

    def in_flight(self, name: str) -> int: ...

    def demand(self) -> Demand: ...

    def set_shares(self, shares: dict[str, int]) -> None: ...


class SharedCaps:
    def __init__(self, backend: StateBackend, fleet: SharedFleet, metrics: GatewayMetrics,
                 settings: StateSettings) -> None:
        self.backend = backend
        self.fleet = fleet
        self.metrics = metrics
        self.settings = settings
        self.instance = f"gw-{uuid.uuid4().hex[:12]}"
        self.mode: Mode = "fallback"
        self.epoch: str | None = None  # the epoch of the last sync (None: never synced)
        self.grace = False
        self.gateways = 1  # live gateways at the last sync
        self.shares: dict[str, int] = {}  # what this gateway's core enforces, per replica
        self.demands: dict[str, Demand] = {}  # every gateway's demand at the last sync
        self._task: asyncio.Task[None] | None = None

    @property
    def shared(self) -> bool:
        return self.backend.shared

    @property
    def up(self) -> bool:
        return self.mode == "shared"

    def fallback_share(self, cap: int) -> int:
        """What a gateway that has never reached Redis may run at a replica of `cap`."""
        n = self.settings.gateways
        return cap // n if n > 0 else 0

    async def start(self) -> None:
        if not self.shared:
            return
        self.shares = {n: self.fallback_share(rep.cap) for n, rep in self.fleet.replicas.items()}
        self.fleet.set_shares(self.shares)
        self.fleet.state_up = False
        with contextlib.suppress(StateUnavailable):
            await self.backend.start(self.instance)
        await self.sync()
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.shared:
            with contextlib.suppress(Exception):
                await self.backend.leave(self.instance, list(self.fleet.replicas))
        with contextlib.suppress(Exception):
            await self.backend.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.refresh_s)
            await self.sync()

    def fair(self, caps: dict[str, int], mine: Demand) -> dict[str, int]:
        """This gateway's fair share of each replica, from every gateway's last published
        demand and its own of now."""
        demands = {**self.demands, self.instance: mine}
        return fair_shares(caps, demands)[self.instance]

    async def sync(self) -> None:
        """One step of the protocol (the module docstring)."""
        fleet = self.fleet
        caps = {n: rep.cap for n, rep in fleet.replicas.items()}
        mine = fleet.demand()
        wanted = self.fair(caps, mine)
        self._lower({n: min(self.shares.get(n, 0), wanted[n]) for n in caps})
        asks = tuple(ReplicaAsk(n, caps[n], wanted[n], fleet.in_flight(n),
                                max(self.shares.get(n, 0), fleet.in_flight(n)))
                     for n in caps)
        try:
            got = await self.backend.sync(SyncRequest(
                self.instance, self.epoch, self.settings.gateways, self.settings.lease_ttl_s,
                mine, asks))
        except StateUnavailable as exc:
            self._down(exc)
            return
        if self.epoch is not None and got.epoch != self.epoch:
            log.warning("shared state lost its shares (Redis restarted empty?): shares "
                        "re-asserted, none grows for %g s", self.settings.lease_ttl_s)
        if got.grace and not self.grace and not self.settings.gateways \
                and not any(got.shares.values()):
            log.warning("Redis holds no state yet (a new epoch): this gateway gets its first "
                        "share when the epoch settles, within %g s (set state.gateways to the "
                        "number of gateways to start on cap // gateways at once)",
                        self.settings.lease_ttl_s)
        self.epoch, self.grace, self.gateways = got.epoch, got.grace, got.gateways
        self.demands = got.demands
        # Redis holds these for this gateway now (the fair share still caps them)
        self._set({n: min(got.shares.get(n, 0), wanted[n]) for n in caps})
        fleet.others = got.others_in_flight
        if self.mode != "shared":
            log.warning("shared state %s: shares of each cap from Redis (%d gateways)",
                        "reached" if self.metrics.state_failures == 0 else "answers again",
                        got.gateways)
            self.mode = "shared"
            fleet.state_up = True

    def _current(self, name: str) -> int:
        return self.shares.get(name, 0)

    def _lower(self, shares: dict[str, int]) -> None:
        """Smaller shares apply at once (running requests finish; nothing new goes over)."""
        self._set({n: min(v, self._current(n)) for n, v in shares.items()})

    def _set(self, shares: dict[str, int]) -> None:
        if shares != self.shares:
            self.shares = shares
            self.fleet.set_shares(shares)

    def _down(self, exc: Exception) -> None:
        if self.mode == "shared" or self.metrics.state_failures == 0:
            held = ", ".join(f"{n} {v}" for n, v in sorted(self.shares.items()))
            if self.epoch is None and not self.settings.gateways:
                held += " (it has never reached Redis and state.gateways is not set)"
            log.error("shared state unavailable (%s): this gateway keeps the shares Redis "
                      "last confirmed and grows none until it answers: %s", exc, held)
            self.metrics.state_failures += 1
        self.mode = "fallback"
        self.fleet.state_up = False
