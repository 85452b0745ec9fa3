"""Arrival stamps: bytes are stamped when their socket was first seen readable (by the loop's
select() or by the polls made inside the loop's own callbacks), not when their read callback
finally ran behind other work."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

from chatfleet.bench.arrivals import arrival_time, stamp_selects

HOLD_S = 0.05


class Stamper(asyncio.Protocol):
    """Stamps what it reads as the harness does; `then` runs after the stamp (the rest of a
    read callback's work)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, then: Callable[[], None] | None = None,
                 ) -> None:
        self.loop = loop
        self.then = then
        self.fd: int | None = None
        self.stamps: list[float] = []
        self.ran: list[float] = []
        self.got = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.fd = transport.get_extra_info("socket").fileno()

    def data_received(self, data: bytes) -> None:
        self.ran.append(time.monotonic())
        self.stamps.append(arrival_time(self.loop, self.fd))
        self.got.set()
        if self.then is not None:
            self.then()


async def connected(loop: asyncio.AbstractEventLoop,
                    then: Callable[[], None] | None = None) -> tuple[socket.socket, Stamper]:
    a, b = socket.socketpair()
    a.setblocking(False)
    _, proto = await loop.connect_accepted_socket(lambda: Stamper(loop, then), b)
    sel = stamp_selects(loop)
    assert sel is not None and proto.fd is not None
    sel.readable.watch(proto.fd)
    return a, proto


async def behind_a_held_loop() -> tuple[float, Stamper]:
    """Bytes arrive, then a callback queued ahead of their read holds the loop for 50 ms."""
    loop = asyncio.get_running_loop()
    a, proto = await connected(loop)
    try:
        await asyncio.sleep(0.01)
        written = time.monotonic()
        a.send(b"data: {}\n\n")
        loop.call_soon(time.sleep, HOLD_S)  # runs first in the iteration that sees the bytes
        await asyncio.wait_for(proto.got.wait(), 5)
    finally:
        a.close()
    return written, proto


def test_bytes_are_stamped_at_the_select_that_saw_them() -> None:
    written, proto = asyncio.run(behind_a_held_loop())
    assert proto.ran[0] - written >= HOLD_S  # the read callback ran behind the held loop
    assert proto.stamps[0] - written < HOLD_S / 2  # its stamp did not wait for it
    assert proto.stamps[0] <= proto.ran[0]


async def landing_in_a_long_iteration() -> tuple[float, Stamper]:
    """B's bytes land while the loop runs an iteration: A's read callback (which polls as it
    stamps) comes next, then holds the loop 50 ms; B is read in the next iteration."""
    loop = asyncio.get_running_loop()
    a, _ = await connected(loop, then=lambda: time.sleep(HOLD_S))
    b, pb = await connected(loop)
    landed: list[float] = []

    def send_b() -> None:
        landed.append(time.monotonic())
        b.send(b"data: {}\n\n")

    try:
        await asyncio.sleep(0.01)
        a.send(b"data: {}\n\n")
        loop.call_soon(send_b)  # queued ahead of the select that will see A
        await asyncio.wait_for(pb.got.wait(), 5)
    finally:
        a.close()
        b.close()
    return landed[0], pb


def test_bytes_landing_during_an_iteration_are_seen_by_the_next_poll() -> None:
    landed, pb = asyncio.run(landing_in_a_long_iteration())
    assert pb.ran[0] - landed >= HOLD_S  # read only after A's callback let go
    assert pb.stamps[0] - landed < HOLD_S / 2  # A's poll saw B readable


def test_a_new_response_on_a_kept_alive_socket_forgets_what_was_seen_before() -> None:
    """The fd of a kept-alive connection (or a reused fd number) was seen readable for an
    earlier response's last bytes: a new response's first bytes must not take that time (a
    stamp before the request was sent made the run's chunk times decrease)."""

    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        a, proto = await connected(loop)
        try:
            sel = stamp_selects(loop)
            assert sel is not None and proto.fd is not None
            sel.readable.saw(proto.fd, 1.0)  # noted for an earlier response, never read
            sel.readable.watch(proto.fd)  # the next response on the same socket registers
            await asyncio.sleep(0.01)
            written = time.monotonic()
            a.send(b"data: {}\n\n")
            await asyncio.wait_for(proto.got.wait(), 2.0)
            return written, proto.stamps[0]
        finally:
            a.close()

    written, stamp = asyncio.run(main())
    assert stamp >= written - 1e-3
