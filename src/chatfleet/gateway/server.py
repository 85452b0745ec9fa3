"""Run a gateway: on the current event loop (`start`), or in a thread for tests and
benchmarks (`serve_in_thread`)."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web

from chatfleet.gateway.app import Gateway
from chatfleet.serverlog import quiet_bad_requests
from chatfleet.threads import running_in_thread

BACKLOG = 4096


@dataclass(slots=True)
class RunningGateway:
    gateway: Gateway
    runner: web.AppRunner
    url: str

    async def close(self) -> None:
        await self.runner.cleanup()


async def start(gw: Gateway, host: str = "127.0.0.1", port: int = 0) -> RunningGateway:
    quiet_bad_requests()
    runner = web.AppRunner(gw.app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=5.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=BACKLOG, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    sock: socket.socket = site._server.sockets[0]  # type: ignore[union-attr]
    bound = sock.getsockname()[1]
    return RunningGateway(gw, runner, f"http://{host}:{bound}")


@contextlib.contextmanager
def serve_in_thread(gw: Gateway, host: str = "127.0.0.1",
                    port: int = 0) -> Iterator[RunningGateway]:
    """The gateway on its own event loop (uvloop's, as `chatfleet gateway` runs it) in a
    background thread."""
    import uvloop

    with running_in_thread(lambda: start(gw, host, port), name="gateway",
                           loop=uvloop.new_event_loop()) as running:
        yield running
