"""When a stream's bytes arrived: stamps taken as the socket is seen readable.

The event loop may handle a burst of chunks one after another, so the time a coroutine reads a
line can be milliseconds after its bytes came in. Three layers bring the stamp closer:

1. aiohttp's protocol `data_received` runs as the socket is read: it stamps every SSE event in
   the bytes it gets, and the stream reader takes those stamps in order (`StreamStamps`).
2. The stamp is not the time `data_received` runs but the time the socket was first *seen*
   readable: in one loop iteration the read callbacks run after the task steps the previous
   iteration woke (every stream's chunk handling) and after each other, so at 64+ streams the
   callback's own clock is late by all of that. The loop's selector notes when each select()
   returned and which sockets it reported (`_StampedSelector`).
3. Bytes that land while a long iteration runs (a decode step's burst at 256 streams) would
   wait for the next select(). A second epoll over the streams' sockets is polled from inside
   the loop's own callbacks (each `data_received`, each line a stream reads), at most every
   `POLL_EVERY_S`, and notes the first time it sees a socket readable. Each socket is
   registered one-shot and re-armed when it is read, so a poll costs only the sockets that
   became readable since the last one.

A stamp is the earliest time a socket was seen readable since it was last read: the bytes were
there then (bytes that reach the same socket later in the same iteration are rare: a stream's
next chunk is a decode step away). asyncio's selector loops only; elsewhere (uvloop, no epoll)
the stamp falls back to the time `data_received` runs. Installed once per process, used only
by responses that register.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import select
import selectors
import time
from typing import Any

import aiohttp

POLL_EVERY_S = 0.0003  # between two extra polls, at least

_ONE_SHOT = (select.EPOLLIN | select.EPOLLONESHOT) if hasattr(select, "epoll") else 0
_STREAMS: dict[int, StreamStamps] = {}  # id(protocol) -> its stream's stamps
_installed = False


class _ReadableSince:
    """When each watched socket was first seen readable since it was last read."""

    def __init__(self) -> None:
        self._ep = select.epoll() if hasattr(select, "epoll") else None
        self.fds: set[int] = set()
        self.since: dict[int, float] = {}
        self._polled = 0.0

    def watch(self, fd: int) -> None:
        """Watch `fd` for a new response. What was noted of it before belongs to the bytes of
        an earlier response on the same kept-alive connection (or an earlier connection the fd
        number served): forgotten, or the new response's first bytes would take that time."""
        self.fds.add(fd)
        self.since.pop(fd, None)
        if self._ep is not None:
            try:
                self._ep.register(fd, _ONE_SHOT)
            except FileExistsError:
                self._ep.modify(fd, _ONE_SHOT)

    def unwatch(self, fd: int) -> None:
        self.fds.discard(fd)
        self.since.pop(fd, None)
        if self._ep is not None:
            with contextlib.suppress(OSError, KeyError, ValueError):
                self._ep.unregister(fd)

    def saw(self, fd: int, t: float) -> None:
        if fd in self.fds and fd not in self.since:
            self.since[fd] = t

    def poll(self) -> None:
        if self._ep is None or not self.fds:
            return
        now = time.monotonic()
        if now - self._polled < POLL_EVERY_S:
            return
        self._polled = now
        since = self.since
        for fd, _ in self._ep.poll(0):
            if fd not in since:
                since[fd] = now

    def take(self, fd: int) -> float | None:
        """The time `fd` was first seen readable, as its bytes are read; re-armed for the
        next ones."""
        if self._ep is not None and fd in self.fds:
            with contextlib.suppress(OSError, ValueError):
                self._ep.modify(fd, _ONE_SHOT)
        return self.since.pop(fd, None)


class _StampedSelector:
    """An event loop's selector that notes when each select() returned, and when each
    watched socket it reported was first seen readable."""

    def __init__(self, inner: selectors.BaseSelector) -> None:
        self._inner = inner
        self.returned_at = time.monotonic()
        self.readable = _ReadableSince()

    def select(self, timeout: float | None = None) -> Any:
        events = self._inner.select(timeout)
        now = self.returned_at = time.monotonic()
        if self.readable.fds:
            for key, mask in events:
                if mask & selectors.EVENT_READ:
                    self.readable.saw(key.fd, now)
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def stamp_selects(loop: asyncio.AbstractEventLoop) -> _StampedSelector | None:
    """Wrap the running loop's selector once (asyncio's selector loops; None for others)."""
    sel = getattr(loop, "_selector", None)
    if sel is None:
        return None
    if not isinstance(sel, _StampedSelector):
        sel = _StampedSelector(sel)
        loop._selector = sel  # type: ignore[attr-defined]
    return sel


def arrival_time(loop: asyncio.AbstractEventLoop | None, fd: int | None = None) -> float:
    """When bytes being read now from socket `fd` arrived, as well as the loop can tell."""
    sel = getattr(loop, "_selector", None)
    if not isinstance(sel, _StampedSelector):
        return time.monotonic()
    if fd is not None:
        sel.readable.poll()  # note the other sockets that became readable meanwhile
        t = sel.readable.take(fd)
        if t is not None:
            return t
    return sel.returned_at


def poll(loop: asyncio.AbstractEventLoop) -> None:
    """Note the watched sockets readable now (cheap: at most one epoll every POLL_EVERY_S)."""
    sel = getattr(loop, "_selector", None)
    if isinstance(sel, _StampedSelector):
        sel.readable.poll()


class StreamStamps:
    """The arrival stamps of one response's SSE events, in order (None: arrived before the
    response registered, or unknown)."""

    def __init__(self, resp: aiohttp.ClientResponse, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.proto: Any = resp.connection.protocol if resp.connection is not None else None
        self.fd: int | None = None
        # events already buffered arrived before they could be stamped: no stamp
        early = sum(bytes(c).count(b"data:") for c in getattr(resp.content, "_buffer", ()))
        self.queue: collections.deque[float | None] = collections.deque([None] * early)
        sel = stamp_selects(loop)
        if self.proto is None:
            return
        transport = getattr(self.proto, "transport", None)
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is not None and sel is not None:
            with contextlib.suppress(OSError, ValueError):
                self.fd = sock.fileno()
                sel.readable.watch(self.fd)
        _STREAMS[id(self.proto)] = self

    def next(self) -> float | None:
        return self.queue.popleft() if self.queue else None

    def close(self) -> None:
        if self.proto is not None and _STREAMS.get(id(self.proto)) is self:
            del _STREAMS[id(self.proto)]
        sel = getattr(self.loop, "_selector", None)
        if self.fd is not None and isinstance(sel, _StampedSelector):
            sel.readable.unwatch(self.fd)
            self.fd = None


def install() -> None:
    """Stamp the SSE events of registered responses in aiohttp's protocol (once a process)."""
    global _installed
    if _installed:
        return
    from aiohttp.client_proto import ResponseHandler

    original = ResponseHandler.data_received

    def data_received(self: ResponseHandler, data: bytes) -> None:
        s = _STREAMS.get(id(self))
        if s is not None and data:
            n = data.count(b"data:")
            if n:
                t = arrival_time(s.loop, s.fd)
                s.queue.extend([t] * n)
        original(self, data)

    ResponseHandler.data_received = data_received  # type: ignore[method-assign]
    _installed = True
