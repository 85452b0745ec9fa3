"""Tiny inline aiohttp apps for the shared HTTP parts: each served in its own thread and loop
on 127.0.0.1, stopped when its `with` ends."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web

from chatfleet.http.threads import running_in_thread


@dataclass(slots=True)
class Served:
    runner: web.AppRunner
    url: str

    async def close(self) -> None:
        await self.runner.cleanup()


@contextlib.contextmanager
def served(app: web.Application) -> Iterator[str]:
    """`app` on 127.0.0.1 (any free port); yields its base URL."""

    async def start() -> Served:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return Served(runner, f"http://127.0.0.1:{port}")

    with running_in_thread(start, name="inline-app") as srv:
        yield srv.url
