"""Run a gateway: on the current event loop (`start`), or in a thread for tests and
benchmarks (`serve_in_thread`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from chatfleet.gateway.app import Gateway

BACKLOG = 4096


class QuietBadRequests(logging.Filter):
    """aiohttp answers a malformed request (bad framing, a header too long, a bare LF) with
    400 and logs it as an error with a traceback; it is the client's mistake, so log one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            record.msg = "bad request answered %s: %s"
            record.args = (exc.code, str(exc.message).splitlines()[0] if exc.message else "")
            record.exc_info = None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def quiet_bad_requests() -> None:
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, QuietBadRequests) for f in logger.filters):
        logger.addFilter(QuietBadRequests())


@dataclass(slots=True)
class RunningGateway:
    gateway: Gateway
    runner: web.AppRunner
    url: str
    loop: asyncio.AbstractEventLoop

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
    return RunningGateway(gw, runner, f"http://{host}:{bound}", asyncio.get_running_loop())


@contextlib.contextmanager
def serve_in_thread(gw: Gateway, host: str = "127.0.0.1",
                    port: int = 0) -> Iterator[RunningGateway]:
    """The gateway on its own event loop (uvloop's, as `chatfleet gateway` runs it) in a
    background thread."""
    import uvloop

    loop = uvloop.new_event_loop()
    started = threading.Event()
    box: dict[str, object] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            try:
                box["gw"] = await start(gw, host, port)
            except BaseException as exc:  # reported to the caller
                box["err"] = exc
            started.set()

        box["boot"] = loop.create_task(boot())
        loop.run_forever()

    t = threading.Thread(target=main, name="gateway", daemon=True)
    t.start()
    started.wait(60)
    if "err" in box or "gw" not in box:
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
        raise box.get("err") or RuntimeError("the gateway did not start")  # type: ignore[misc]
    running = box["gw"]
    assert isinstance(running, RunningGateway)
    try:
        yield running
    finally:
        fut = asyncio.run_coroutine_threadsafe(running.close(), loop)
        with contextlib.suppress(Exception):
            fut.result(30)
        loop.call_soon_threadsafe(loop.stop)
        t.join(30)
        loop.close()
