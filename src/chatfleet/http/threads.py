"""A server on its own event loop in a background thread (tests, benchmarks, parity runs):
the one helper behind `simserver.server.serve_in_thread` and `gateway.server.serve_in_thread`."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Protocol, TypeVar


class Closable(Protocol):
    async def close(self) -> None: ...


S = TypeVar("S", bound=Closable)


@contextlib.contextmanager
def running_in_thread(start: Callable[[], Awaitable[S]], *, name: str,
                      loop: asyncio.AbstractEventLoop | None = None,
                      start_timeout_s: float = 60.0) -> Iterator[S]:
    """Run `start()` on `loop` (a new asyncio loop by default) in a daemon thread, yield what
    it returned, and on exit `close()` it, stop the loop and join the thread. A failure to
    start is raised in the caller's thread."""
    loop = loop or asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, object] = {}

    def main() -> None:
        asyncio.set_event_loop(loop)

        async def boot() -> None:
            try:
                box["server"] = await start()
            except BaseException as exc:  # reported to the caller
                box["err"] = exc
            started.set()

        box["boot"] = loop.create_task(boot())
        loop.run_forever()

    t = threading.Thread(target=main, name=name, daemon=True)
    t.start()
    started.wait(start_timeout_s)
    if "server" not in box:
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
        loop.close()
        err = box.get("err")
        raise err if isinstance(err, BaseException) else RuntimeError(f"{name} did not start")
    server: S = box["server"]  # type: ignore[assignment]
    try:
        yield server
    finally:
        fut = asyncio.run_coroutine_threadsafe(server.close(), loop)
        with contextlib.suppress(Exception):
            fut.result(30)
        loop.call_soon_threadsafe(loop.stop)
        t.join(30)
        loop.close()
