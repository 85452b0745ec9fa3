"""A slow network in front of Redis: a TCP proxy on 127.0.0.1 that holds every chunk, each
way, for `delay_s` (changeable while it runs) before passing it on, in order."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from chatfleet.http.threads import running_in_thread


class DelayProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.delay_s = 0.0
        self.port = 0
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self) -> DelayProxy:
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._server = server
        return self

    async def close(self) -> None:
        self._server.close()
        for task in list(self._conns):
            task.cancel()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            self._conns.discard(task)
            return
        try:
            await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, up_w):
                w.close()
            self._conns.discard(task)

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send() -> None:
            while True:
                at, data = await queue.get()
                if at > loop.time():
                    await asyncio.sleep(at - loop.time())
                if not data:
                    dst.close()
                    return
                dst.write(data)
                await dst.drain()

        sender = asyncio.create_task(send())
        try:
            while True:
                data = await src.read(65536)
                queue.put_nowait((loop.time() + self.delay_s, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()


@contextlib.contextmanager
def delay_proxy(target_port: int) -> Iterator[DelayProxy]:
    """The proxy, in a thread of its own, in front of 127.0.0.1:`target_port`."""
    with running_in_thread(lambda: DelayProxy(target_port).start(), name="delay-proxy") as p:
        yield p
