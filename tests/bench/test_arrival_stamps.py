"""Arrival stamps: bytes are stamped when the loop's select() saw their socket readable, not
when their read callback finally ran behind other work of the same loop iteration."""

from __future__ import annotations

import asyncio
import socket
import time

from chatfleet.bench.client import _arrival_time, _stamp_selects

HOLD_S = 0.05


class Stamper(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.stamps: list[float] = []
        self.got = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.stamps.append(_arrival_time(self.loop))
        self.got.set()


async def stamp_behind_a_held_loop() -> tuple[float, float, float]:
    """Bytes arrive, then a callback queued ahead of their read holds the loop for 50 ms:
    (when they were written, their stamp, when data_received ran)."""
    loop = asyncio.get_running_loop()
    _stamp_selects(loop)
    a, b = socket.socketpair()
    a.setblocking(False)
    ran: list[float] = []
    _, proto = await loop.connect_accepted_socket(lambda: Stamper(loop), b)
    try:
        await asyncio.sleep(0.01)
        written = time.monotonic()
        a.send(b"data: {}\n\n")
        # queued before the select that will see the bytes: runs first in that iteration
        loop.call_soon(time.sleep, HOLD_S)
        orig = proto.data_received

        def noting(data: bytes) -> None:
            ran.append(time.monotonic())
            orig(data)

        proto.data_received = noting  # type: ignore[method-assign]
        await asyncio.wait_for(proto.got.wait(), 5)
    finally:
        a.close()
    return written, proto.stamps[0], ran[0]


def test_bytes_are_stamped_at_the_select_that_saw_them() -> None:
    written, stamp, ran = asyncio.run(stamp_behind_a_held_loop())
    assert ran - written >= HOLD_S  # the read callback ran behind the held loop
    assert stamp - written < HOLD_S / 2  # its stamp did not wait for it
    assert stamp <= ran
