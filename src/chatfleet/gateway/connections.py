"""Client connections: how many, and how long each may sit without a request.

aiohttp closes no connection that never sends a request, and none whose request head arrives a
byte at a time (its keep-alive timer, 3,630 s by default, is the only bound). Here every
client connection goes through a `ConnectionGuard`, which wraps aiohttp's protocol for it:

- **Header timeout** (`timeouts.client_header_s`): from the first byte of a request head to the
  moment the gateway starts handling the request. A client that trickles its headers
  (slowloris) is closed when it runs out.
- **Idle timeout** (`timeouts.client_idle_s`): a connection with no request in progress (never
  sent one, or between two on a kept-alive connection) is closed after this long.
- **Connection limit** (`max_connections`; by default the process's descriptor limit minus what
  the gateway needs for its replicas, Redis and itself: `fd_reserve`). A connection beyond it
  takes the place of the connection idle the longest; when every connection has a request in
  progress it gets a 503 and is closed. So idle sockets can never take every descriptor, and
  `/health` always gets in.

"In progress" runs from the app's first middleware to the end of the handler (a streamed
answer, the whole stream). The timeouts and the limit are read from the live configuration,
so a reload applies them to every connection at the next sweep (every `SWEEP_S`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from collections.abc import Callable
from typing import Any, cast

from aiohttp import web

from chatfleet.gateway import errors
from chatfleet.gateway.config import GatewayConfig
from chatfleet.gateway.metrics import GatewayMetrics

log = logging.getLogger("chatfleet.gateway")
SWEEP_S = 0.25
FD_RESERVE_BASE = 64  # stdio, the listening socket, the event loop, logs, Redis, the config
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
           b"Connection: close\r\nContent-Length: %d\r\n\r\n%s")


def fd_reserve(cfg: GatewayConfig) -> int:
    """Descriptors the gateway keeps for itself: a base, and two per slot of every replica
    (its upstream connection, and a pooled one closing behind it) and per probe."""
    return FD_RESERVE_BASE + 2 * sum(cfg.replica_cap(r) for r in cfg.replicas) \
        + 2 * len(cfg.replicas)


def descriptor_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1_000_000


def connection_limit(cfg: GatewayConfig, fd_limit: int) -> int:
    """The configured `max_connections`, never above what the descriptor limit leaves after
    `fd_reserve` (and at least 16)."""
    room = max(16, fd_limit - fd_reserve(cfg))
    return room if cfg.max_connections is None else min(cfg.max_connections, room)


class Connection(asyncio.Protocol):
    """One client connection: aiohttp's protocol inside, the guard's clocks around it."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol) -> None:
        self.guard = guard
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.idle_since = guard.loop.time()
        self.head_since: float | None = None  # the first byte of a request head
        self.in_progress = 0  # requests inside the app
        self.started = False  # handed to aiohttp (not refused)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if not self.guard.admit(self):
            return
        self.started = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.in_progress and self.head_since is None:
            self.head_since = self.guard.loop.time()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.started else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.lost(self)
        if self.started:
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def close(self, reason: str) -> None:
        """Closed by the guard: it no longer counts against the limit."""
        self.guard.forget(self)
        self.guard.metrics.connections_closed[reason] += 1
        if self.transport is not None:
            self.transport.close()


class ConnectionGuard:
    """Every client connection of one gateway (module docstring)."""

    def __init__(self, cfg: Callable[[], GatewayConfig], metrics: GatewayMetrics,
                 fd_limit: int | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.fd_limit = fd_limit if fd_limit is not None else descriptor_limit()
        self.loop = asyncio.get_running_loop()
        self.open: dict[asyncio.BaseTransport, Connection] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._limit_said: int | None = None

    # --- wiring -------------------------------------------------------------------------------
    def factory(self, server: Callable[[], asyncio.Protocol]) -> Callable[[], Connection]:
        """The protocol factory for `loop.create_server`: aiohttp's, wrapped."""
        return lambda: Connection(self, server())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Marks the request's connection busy while the app handles it (first middleware)."""
        conn = self.open.get(request.transport) if request.transport is not None else None
        if conn is None:
            resp: web.StreamResponse = await handler(request)
            return resp
        conn.in_progress += 1
        conn.head_since = None
        try:
            resp = await handler(request)
            return resp
        finally:
            conn.in_progress -= 1
            conn.idle_since = self.loop.time()

    def start(self) -> None:
        self._sweeper = asyncio.create_task(self._sweep_loop())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper

    # --- the limit ----------------------------------------------------------------------------
    def limit(self) -> int:
        n = connection_limit(self.cfg(), self.fd_limit)
        cfg_max = self.cfg().max_connections
        if cfg_max is not None and n < cfg_max and self._limit_said != n:
            log.warning("max_connections %d lowered to %d: the descriptor limit is %d and the "
                        "gateway keeps %d for itself (raise ulimit -n)", cfg_max, n,
                        self.fd_limit, fd_reserve(self.cfg()))
        self._limit_said = n
        return n

    def admit(self, conn: Connection) -> bool:
        """A new connection: take it (making room if the limit is reached), or refuse it."""
        assert conn.transport is not None
        if len(self.open) >= self.limit():
            idle = [c for c in self.open.values() if not c.in_progress]
            if not idle:
                self.metrics.connections_closed["refused"] += 1
                body = errors.error_body(503, "the gateway is at its connection limit; "
                                         "retry shortly", code="connection_limit")
                conn.transport.write(REFUSED % (len(body), body))
                conn.transport.close()
                return False
            min(idle, key=lambda c: c.idle_since).close("evicted")
        self.open[conn.transport] = conn
        self.metrics.client_connections = len(self.open)
        return True

    def lost(self, conn: Connection) -> None:
        self.forget(conn)

    def forget(self, conn: Connection) -> None:
        if conn.transport is not None and self.open.get(conn.transport) is conn:
            del self.open[conn.transport]
        self.metrics.client_connections = len(self.open)

    # --- the timeouts -------------------------------------------------------------------------
    def sweep(self) -> None:
        t = self.cfg().timeouts
        now = self.loop.time()
        for conn in list(self.open.values()):
            if conn.in_progress:
                continue
            if conn.head_since is not None and now - conn.head_since > t.client_header_s:
                conn.close("header")
            elif conn.head_since is None and now - conn.idle_since > t.client_idle_s:
                conn.close("idle")

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_S)
            self.sweep()
