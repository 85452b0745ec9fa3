"""Global caps across gateways: each gateway's core sees, per replica, its cap minus what the
other gateways hold, and takes a lease in the shared store before a request goes upstream.

- Every `refresh_s` the gateway reads the lease counts per replica; what the others hold is
  that count minus its own leases, and the core's cap for the replica becomes the configured
  cap minus that (never below 0). So the core still decides where and whether; a race between
  two gateways for the last slot is settled by the store's atomic try-acquire, and the loser
  puts its request back in its own queue.
- Leases are renewed every `renew_s` while their streams run (a renewal re-adds a lease an
  emptied Redis lost) and released when they end; a crashed gateway's leases expire.
- When the store does not answer, the gateway falls back to its share of each cap (cap //
  instances last seen, at least 1), says so in its metrics and log, and keeps probing; when the
  store answers again it re-asserts its leases and reads the counts afresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid

from chatfleet.gateway.fleet import LiveFleet
from chatfleet.gateway.metrics import GatewayMetrics
from chatfleet.gateway.state import LEASE_TTL_S, StateBackend, StateUnavailable

log = logging.getLogger("chatfleet.gateway.shared")
REFRESH_S = 0.05


class SharedCaps:
    def __init__(self, backend: StateBackend, fleet: LiveFleet, metrics: GatewayMetrics, *,
                 refresh_s: float = REFRESH_S, renew_s: float = LEASE_TTL_S / 3) -> None:
        self.backend = backend
        self.fleet = fleet
        self.metrics = metrics
        self.refresh_s = refresh_s
        self.renew_s = renew_s
        self.instance = f"gw-{uuid.uuid4().hex[:12]}"
        self.held: dict[str, str] = {}  # lease id -> replica
        self.up = True
        self.instances = 1
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: set[asyncio.Task[None]] = set()

    @property
    def shared(self) -> bool:
        return self.backend.shared

    async def start(self) -> None:
        if not self.shared:
            return
        try:
            await self.backend.start(self.instance)
            self.instances = await self.backend.heartbeat(self.instance)
            await self.refresh()
        except StateUnavailable as exc:
            self._down(exc)
        self._tasks = [asyncio.create_task(self._refresh_loop()),
                       asyncio.create_task(self._renew_loop())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for task in list(self._pending):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 1.0)
        with contextlib.suppress(Exception):
            await self.backend.close()

    # --- leases -------------------------------------------------------------------------------
    async def acquire(self, replica: str, cap: int) -> str | None:
        """A lease on a slot of `replica` (its id), or None when the fleet-wide cap is full.
        Without a shared store, or while it is down, the local count (already held by the
        core) is the only check."""
        lease = f"{self.instance}:{next(self._ids)}"
        if not self.shared:
            return lease
        if self.up:
            try:
                if not await self.backend.try_acquire(replica, cap, lease):
                    self.metrics.lease_conflicts += 1
                    await self.refresh()
                    return None
            except StateUnavailable as exc:
                self._down(exc)
        self.held[lease] = replica
        return lease

    def release(self, replica: str, lease: str) -> None:
        if self.held.pop(lease, None) is None or not self.up:
            return
        task = asyncio.create_task(self._release(replica, lease))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _release(self, replica: str, lease: str) -> None:
        try:
            await self.backend.release(replica, lease)
        except StateUnavailable as exc:
            self._down(exc)

    # --- what the others hold -----------------------------------------------------------------
    async def refresh(self) -> None:
        names = list(self.fleet.replicas)
        counts = await self.backend.counts(names)
        mine: dict[str, int] = {}
        for replica in self.held.values():
            mine[replica] = mine.get(replica, 0) + 1
        self.fleet.set_others({r: max(0, counts.get(r, 0) - mine.get(r, 0)) for r in names})

    async def _refresh_loop(self) -> None:
        beat = 0.0
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.refresh_s)
            try:
                if not self.up:  # the store is back? re-assert what we hold first
                    await self.backend.renew(self._pairs())
                    self._recovered()
                if loop.time() - beat > 1.0:
                    self.instances = await self.backend.heartbeat(self.instance)
                    beat = loop.time()
                await self.refresh()
            except StateUnavailable as exc:
                self._down(exc)

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.renew_s)
            if not self.up:
                continue
            try:
                await self.backend.renew(self._pairs())
            except StateUnavailable as exc:
                self._down(exc)

    def _pairs(self) -> list[tuple[str, str]]:
        return [(replica, lease) for lease, replica in self.held.items()]

    # --- fallback -----------------------------------------------------------------------------
    def _down(self, exc: Exception) -> None:
        if self.up:
            log.error("shared state unavailable (%s): each replica's cap falls back to this "
                      "gateway's share (1/%d)", exc, self.instances)
            self.metrics.state_failures += 1
        self.up = False
        self.fleet.state_up = False
        self.fleet.set_share(self.instances)

    def _recovered(self) -> None:
        log.warning("shared state is back: fleet-wide caps again")
        self.up = True
        self.fleet.state_up = True
        self.fleet.set_share(1)
