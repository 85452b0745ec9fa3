"""Client connections: how many, and how long each may sit without a request.

aiohttp closes no connection that never sends a request, and none whose request head arrives a
byte at a time (its keep-alive timer, 3,630 s by default, is the only bound). Here every
client connection goes through a `ConnectionGuard`, which wraps aiohttp's protocol for it:

- **Header timeout** (`timeouts.client_header_s`): from the first byte of a request head to the
  moment the gateway starts handling the request. A client that trickles its headers
  (slowloris) is closed when it runs out.
- **Idle timeout** (`timeouts.client_idle_s`): a connection with no request in progress (never
  sent one, or between two on a kept-alive connection) is closed after this long.
- **Connection limit** (`max_connections`; by default what the process's descriptor limit
  leaves after the gateway's own reserve, `fd_reserve`: a base, the connections being refused,
  the probes, and one upstream connection per slot it serves). A connection beyond it takes
  the place of the connection idle the longest, if that one has been idle for at least the
  header timeout (a new connection has that long to send its request, so none is evicted
  before it could); otherwise it gets a 503 with `Retry-After` (`refuse`), never a silent
  close. So idle sockets can never take every descriptor, and `/health` always gets in.

`chatfleet gateway` raises the soft descriptor limit to the hard one at start
(`raise_descriptor_limit`) and refuses to start when the room left for client connections is
smaller than the slots it serves (`check_room`): a gateway that cannot hold a client
connection per slot cannot fill its caps.

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

from chatfleet.gateway.config import ConfigError, GatewayConfig
from chatfleet.gateway.metrics import GatewayMetrics
from chatfleet.http.errors import error_body
from chatfleet.http.headers import SERVER

log = logging.getLogger("chatfleet.gateway")
SWEEP_S = 0.25
FD_RESERVE_BASE = 64  # stdio, the listening socket, the event loop, logs, Redis, the config
# connections past the limit still being answered their 503 (each holds a descriptor until
# the client has read it and closed, at most REFUSAL_LINGER_S); more at once are closed as
# soon as the 503 is written
MAX_REFUSING = 128
REFUSAL_LINGER_S = 2.0
MIN_CONNECTIONS = 16  # the floor of the limit when a reload leaves less room (logged)
RETRY_AFTER_S = 1
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\nServer: " + SERVER.encode()
           + b"\r\nContent-Type: application/json\r\nRetry-After: %d\r\nretry-after-ms: %d\r\n"
           b"Connection: close\r\nContent-Length: %d\r\n\r\n%s")
NO_LIMIT = 1_048_576  # Linux's default fs.nr_open: what an unlimited hard limit allows


def slots_served(cfg: GatewayConfig) -> int:
    """The slots this gateway may hold at once: the sum of the replicas' caps. With several
    gateways its share of a replica is at most that replica's cap (the shares protocol hands
    the whole cap to the one gateway with demand), so the cap, not cap // gateways."""
    return sum(cfg.replica_cap(r) for r in cfg.replicas)


def fd_reserve(cfg: GatewayConfig) -> int:
    """Descriptors the gateway keeps for itself: a base, the connections being refused, two
    per replica for its probes, and one per slot it serves (a replica's pool never holds more
    connections than the requests the gateway ran there at once)."""
    return FD_RESERVE_BASE + MAX_REFUSING + 2 * len(cfg.replicas) + slots_served(cfg)


def connection_room(cfg: GatewayConfig, fd_limit: int) -> int:
    """Client connections the descriptor limit leaves room for."""
    return fd_limit - fd_reserve(cfg)


def connection_limit(cfg: GatewayConfig, fd_limit: int) -> int:
    """The configured `max_connections`, never above the room the descriptor limit leaves
    (and at least MIN_CONNECTIONS, should a reload leave less: logged)."""
    room = max(MIN_CONNECTIONS, connection_room(cfg, fd_limit))
    return room if cfg.max_connections is None else min(cfg.max_connections, room)


def descriptor_limit() -> int:
    """The soft RLIMIT_NOFILE (an unlimited one as NO_LIMIT)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return NO_LIMIT if soft == resource.RLIM_INFINITY else soft


def raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one (as most servers do at start: the
    stock soft limit of 1,024 is a default for interactive shells, not a server's budget);
    the soft limit in force afterwards (unchanged where the kernel refuses)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NO_LIMIT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return descriptor_limit()


def check_room(cfg: GatewayConfig, fd_limit: int) -> None:
    """ConfigError when the descriptor limit leaves fewer client connections than the slots
    the gateway serves."""
    slots = slots_served(cfg)
    room = connection_room(cfg, fd_limit)
    if room < slots:
        raise ConfigError(
            f"the descriptor limit ({fd_limit}, ulimit -n) leaves room for {max(room, 0)} "
            f"client connections after the gateway's own {fd_reserve(cfg)}, fewer than the "
            f"{slots} slots it serves: raise the hard limit (ulimit -Hn) to at least "
            f"{fd_reserve(cfg) + slots}, or lower the caps")


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
        self.linger: asyncio.TimerHandle | None = None  # a refused one, until it closes

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if not self.guard.admit(self):
            return
        self.started = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.started:  # refused: what it sends is read and dropped
            return
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
        if self.started:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.started:
            self.inner.resume_writing()

    def close(self, reason: str) -> None:
        """Closed by the guard: it no longer counts against the limit."""
        self.guard.forget(self)
        self.guard.metrics.connections_closed[reason] += 1
        if self.transport is not None:
            self.transport.close()

    def refuse(self, body: bytes, linger: bool) -> None:
        """The 503, then a lingering close: the write side is shut (the client reads the
        answer and an end), what the client still sends is read and dropped, and the
        connection closes when the client closes or after REFUSAL_LINGER_S. Closing at once
        would answer a request that arrives afterwards with a reset, which can take the 503
        with it before the client reads it (RFC 9112, section 9.6)."""
        assert self.transport is not None
        t = self.transport
        t.write(REFUSED % (RETRY_AFTER_S, 1000 * RETRY_AFTER_S, len(body), body))
        if linger and t.can_write_eof():
            t.write_eof()
            self.linger = self.guard.loop.call_later(REFUSAL_LINGER_S, t.close)
        else:
            t.close()


class ConnectionGuard:
    """Every client connection of one gateway (module docstring)."""

    def __init__(self, cfg: Callable[[], GatewayConfig], metrics: GatewayMetrics,
                 fd_limit: int | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.fd_limit = fd_limit if fd_limit is not None else descriptor_limit()
        self.loop = asyncio.get_running_loop()
        self.open: dict[asyncio.BaseTransport, Connection] = {}
        self.refusing: set[Connection] = set()
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
        for conn in list(self.refusing):
            if conn.transport is not None:
                conn.transport.close()

    # --- the limit ----------------------------------------------------------------------------
    def limit(self) -> int:
        cfg = self.cfg()
        n = connection_limit(cfg, self.fd_limit)
        if self._limit_said != n:
            if cfg.max_connections is not None and n < cfg.max_connections:
                log.warning("max_connections %d lowered to %d: the descriptor limit is %d and "
                            "the gateway keeps %d for itself (raise ulimit -n)",
                            cfg.max_connections, n, self.fd_limit, fd_reserve(cfg))
            if n < slots_served(cfg):
                log.warning("at most %d client connections for %d slots: the descriptor limit "
                            "%d leaves no more after the gateway's own %d (raise ulimit -n)",
                            n, slots_served(cfg), self.fd_limit, fd_reserve(cfg))
        self._limit_said = n
        return n

    def admit(self, conn: Connection) -> bool:
        """A new connection: take it (making room if the limit is reached and a connection has
        been idle for at least the header timeout), or refuse it with a 503."""
        assert conn.transport is not None
        if len(self.open) >= self.limit():
            now = self.loop.time()
            header_s = self.cfg().timeouts.client_header_s
            idle = [c for c in self.open.values() if not c.in_progress
                    and c.head_since is None and now - c.idle_since >= header_s]
            if not idle:
                self.refuse(conn)
                return False
            min(idle, key=lambda c: c.idle_since).close("evicted")
        self.open[conn.transport] = conn
        self.metrics.client_connections = len(self.open)
        return True

    def refuse(self, conn: Connection) -> None:
        self.metrics.connections_closed["refused"] += 1
        body = error_body(503, "the gateway is at its connection limit; retry shortly",
                          code="connection_limit")
        linger = len(self.refusing) < MAX_REFUSING
        if linger:
            self.refusing.add(conn)
        conn.refuse(body, linger)

    def lost(self, conn: Connection) -> None:
        if conn.linger is not None:
            conn.linger.cancel()
            self.refusing.discard(conn)
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
