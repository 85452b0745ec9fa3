"""Run a gateway: on the current event loop (`start`), or in a thread for tests and
benchmarks (`serve_in_thread`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web

from chatfleet.gateway.app import Gateway
from chatfleet.gateway.connections import ConnectionGuard
from chatfleet.http.log import quiet_bad_requests
from chatfleet.http.threads import running_in_thread

BACKLOG = 4096
log = logging.getLogger("chatfleet.gateway")


@dataclass(slots=True)
class RunningGateway:
    gateway: Gateway
    runner: web.AppRunner
    url: str
    guard: ConnectionGuard

    async def close(self) -> None:
        await self.guard.stop()
        await self.runner.cleanup()


class GuardedSite(web.BaseSite):
    """aiohttp's TCP site, its connections taken through a ConnectionGuard (limits, header
    and idle timeouts: gateway/connections.py)."""

    def __init__(self, runner: web.BaseRunner, guard: ConnectionGuard, host: str,
                 port: int) -> None:
        super().__init__(runner, backlog=BACKLOG)
        self.host, self.port, self.guard = host, port, guard
        self.bound_port = port

    @property
    def name(self) -> str:
        return f"http://{self.host}:{self.bound_port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self.guard.factory(server), self.host,
                                                self.port, backlog=self._backlog,
                                                reuse_address=True)
        sock: socket.socket = self._server.sockets[0]
        self.bound_port = sock.getsockname()[1]


async def start(gw: Gateway, host: str = "127.0.0.1", port: int = 0) -> RunningGateway:
    quiet_bad_requests()
    guard = ConnectionGuard(lambda: gw.cfg, gw.metrics)
    gw.app.middlewares.insert(0, guard.middleware)  # outermost: a request is in progress
    runner = web.AppRunner(gw.app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=5.0)
    await runner.setup()
    site = GuardedSite(runner, guard, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    guard.start()
    limit = guard.limit()
    log.info("client connections: at most %d (descriptor limit %d), request heads within "
             "%g s, idle ones closed after %g s", limit, guard.fd_limit,
             gw.cfg.timeouts.client_header_s, gw.cfg.timeouts.client_idle_s)
    return RunningGateway(gw, runner, f"http://{host}:{site.bound_port}", guard)


@contextlib.contextmanager
def serve_in_thread(gw: Gateway, host: str = "127.0.0.1",
                    port: int = 0) -> Iterator[RunningGateway]:
    """The gateway on its own event loop (uvloop's, as `chatfleet gateway` runs it) in a
    background thread."""
    import uvloop

    with running_in_thread(lambda: start(gw, host, port), name="gateway",
                           loop=uvloop.new_event_loop()) as running:
        yield running
