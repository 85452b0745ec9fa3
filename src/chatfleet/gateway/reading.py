"""Whether a stream's client is taking its answer.

What of an answer the client has not taken yet is the bytes waiting in the gateway's buffer
for the socket, plus the bytes the kernel holds or has sent that the client's TCP has not
acknowledged (`SIOCOUTQ`). A client that reads nothing fills its receive window, and from then
on its TCP acknowledges nothing more: what the gateway has written, less what is still
pending, stops growing. Counted that way (not by the gateway's buffer alone) a stalled client
shows up as soon as its own buffers are full, not after the gateway's socket has also
absorbed its send buffer (up to 4 MiB on Linux's defaults). One ioctl per stream per look; the
relay's stream watch looks every 0.5 s.
"""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
from dataclasses import dataclass


def unacked_bytes(transport: asyncio.BaseTransport) -> int:
    """Bytes in the socket's send queue not yet acknowledged by the peer (0 where the socket
    cannot say)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    except (OSError, ValueError):
        return 0
    n: int = struct.unpack("i", raw)[0]
    return n


@dataclass(slots=True)
class ReadProgress:
    """What a client has taken of its answer, as last seen, and since when it has taken
    nothing while something waited (None: nothing waits, or it took some at the last look)."""

    delivered: int = 0
    waiting_since: float | None = None

    def observe(self, written: int, pending: int, now: float) -> None:
        """`written` bytes handed to the client's transport so far, `pending` of them not
        taken yet."""
        delivered = written - pending
        if pending <= 0:
            self.waiting_since = None
        elif delivered > self.delivered or self.waiting_since is None:
            self.waiting_since = now
        self.delivered = max(self.delivered, delivered)

    def stalled(self, now: float, limit_s: float) -> bool:
        return self.waiting_since is not None and now - self.waiting_since > limit_s
