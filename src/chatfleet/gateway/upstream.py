"""Upstream HTTP/1.1: keep-alive connections to a replica, and the byte pass-through relay.

Why hand-written (docs/gateway-relay.md measured it): the gateway sends one request per
exchange on a pooled connection and copies the response body onto the client's transport as
it arrives, chunk frames and all, without parsing a chunk. It follows the chunked framing by
length only, to know where the response ends and to forward whole chunks (so that a clean SSE
error event can always be appended if the replica dies mid-stream). Per read it takes one
clock reading for the gateway's TTFT and ITL, and it keeps references to the last reads, in
which the usage block of the answer arrives.

An `Exchange` is one request and its response. Its `head` future resolves with (status,
content length or None for chunked) when the response head arrives; `done` when the response
has ended (or fails with `UpstreamError`). Until `start(transport)` is called, body bytes are
held (an error answer is never relayed: the gateway writes its own).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any

from chatfleet.gateway.reading import ReadProgress, unacked_bytes

MAX_HEAD_BYTES = 64 * 1024
IDLE_CONNECTION_MAX_S = 4.0  # uvicorn (SGLang, vLLM) closes idle keep-alive after 5 s
MAX_IDLE_PER_REPLICA = 1024
TAIL_READS = 3
# a client that lets this much of its answer pile up unread in the gateway is cut off: its
# upstream request is aborted, and the gateway's memory per stream stays bounded
MAX_CLIENT_BUFFER = 1024 * 1024
# why a client was cut off: its unread answer passed MAX_CLIENT_BUFFER, or it read nothing of
# it for timeouts.client_read_s (relay.py's StreamWatch)
CUT_BUFFER = "buffer"
CUT_STALLED = "stalled"


class UpstreamError(ConnectionError):
    """The exchange failed. `before_head`: nothing of a response had arrived (safe to retry
    elsewhere); `reused`: on a connection that had served earlier requests (stale keep-alive)."""

    def __init__(self, message: str, *, before_head: bool, reused: bool = False) -> None:
        super().__init__(message)
        self.before_head = before_head
        self.reused = reused


# called per read with chunks (count of SSE chunks) and the read's clock time
OnChunks = Callable[[int, float], None]


class Exchange:
    def __init__(self, loop: asyncio.AbstractEventLoop, on_chunks: OnChunks | None = None,
                 keep_body: bool = False) -> None:
        self.loop = loop
        self.head: asyncio.Future[tuple[int, int | None]] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        for fut in (self.head, self.done):  # a failure nobody awaited is not worth a warning
            fut.add_done_callback(_quiet)
        self.on_chunks = on_chunks
        self.keep_body = keep_body  # hold the whole body (non-streaming answers, errors)
        self.body: list[bytes] = []
        self.tail: deque[bytes] = deque(maxlen=TAIL_READS)
        self.client: asyncio.Transport | None = None
        self.held: list[bytes] = []
        self.status = 0
        self.chunked = False
        self.num_chunks = 0
        self.client_gone = False
        self.timed_out = False  # aborted by the gateway's idle or total timeout
        self.cut_off: str | None = None  # the client was cut off for not reading: why
        self.last_read = loop.time()
        self.written = 0  # bytes of the answer handed to the client's transport
        self.reading = ReadProgress()  # whether the client takes them (the stream watch's)
        self.up: Upstream | None = None

    # called by the Upstream protocol --------------------------------------------------------
    def got_head(self, status: int, length: int | None, chunked: bool) -> None:
        self.status, self.chunked = status, chunked
        if not self.head.done():
            self.head.set_result((status, length))

    def got_body(self, data: bytes, chunks: int, now: float) -> None:
        self.last_read = now
        if data:
            self.tail.append(data)
            if self.keep_body:
                self.body.append(data)
            client = self.client
            if client is None:
                self.held.append(data)
            elif client.is_closing():
                self.client_gone = True
                self.abort_upstream()
                return
            else:
                client.write(data)
                self.written += len(data)
                if client.get_write_buffer_size() > MAX_CLIENT_BUFFER:
                    self.cut_client(CUT_BUFFER)
                    return
        if chunks:
            self.num_chunks += chunks
            if self.on_chunks is not None:
                self.on_chunks(chunks, now)

    def ended(self) -> None:
        if not self.head.done():
            self.head.set_exception(UpstreamError("no response head", before_head=True))
        if not self.done.done():
            self.done.set_result(None)

    def failed(self, exc: UpstreamError) -> None:
        for fut in (self.head, self.done):
            if not fut.done():
                fut.set_exception(exc)

    # called by the gateway -------------------------------------------------------------------
    def start(self, client: asyncio.Transport) -> None:
        """Relay from now on: what was held goes first."""
        self.client = client
        if self.held:
            data = b"".join(self.held)
            self.held = []
            if client.is_closing():
                self.client_gone = True
                self.abort_upstream()
            else:
                client.write(data)
                self.written += len(data)

    def client_reading(self, now: float) -> ReadProgress:
        """Look at the client's side now: what of the answer it has not taken yet (in the
        gateway's buffer, or sent and not acknowledged by its TCP)."""
        client = self.client
        if client is None or client.is_closing():  # not started, or gone: nothing to take
            self.reading.waiting_since = None
        else:
            self.reading.observe(self.written, client.get_write_buffer_size()
                                 + unacked_bytes(client), now)
        return self.reading

    def cut_client(self, why: str) -> None:
        """Cut the client off for not reading (`why`); the upstream request goes with it."""
        self.cut_off = why
        self.client_gone = True
        if self.client is not None:
            self.client.abort()
        self.abort_upstream()

    def abort_upstream(self) -> None:
        """Drop the upstream connection: the replica sees the client go and aborts."""
        up = self.up
        if up is not None:
            up.abort()
        self.failed(UpstreamError("aborted", before_head=False))

    def body_bytes(self) -> bytes:
        return b"".join(self.body)

    def tail_bytes(self) -> bytes:
        return b"".join(self.tail)


def _quiet(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()


class Upstream(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection to a replica."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.num_exchanges = 0
        self.idle_since = 0.0
        self.ex: Exchange | None = None
        self._reset_parse()

    def _reset_parse(self) -> None:
        self.head_buf = b""
        self.in_body = False
        self.pending = b""  # bytes of an incomplete chunk, held until it is whole
        self.remaining: int | None = None  # content-length body: bytes still to come
        self.until_close = False
        self.keep_alive = True

    # protocol --------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def send(self, ex: Exchange, request: bytes) -> None:
        assert self.transport is not None
        self.ex = ex
        ex.up = self
        self.num_exchanges += 1
        self._reset_parse()
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        ex = self.ex
        if ex is None:  # nothing expected: a server talking out of turn
            self.abort()
            return
        if self.in_body:
            self._body(ex, data, ex.loop.time())
            return
        self.head_buf += data
        end = self.head_buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head_buf) > MAX_HEAD_BYTES:
                self._fail(UpstreamError("response head too large", before_head=True))
            return
        head, rest = self.head_buf[:end], self.head_buf[end + 4:]
        self.head_buf = b""
        try:
            status, length, chunked, keep_alive = parse_head(head)
        except ValueError:
            self._fail(UpstreamError("malformed response head", before_head=True))
            return
        self.in_body = True
        self.keep_alive = keep_alive
        if status == 100:  # an interim response: the real head follows
            self.in_body = False
            if rest:
                self.data_received(rest)
            return
        if not chunked:
            if length is None:
                self.until_close = True
                self.keep_alive = False
            else:
                self.remaining = length
        ex.got_head(status, length, chunked)
        if self.ex is not ex:  # the head's receiver aborted
            return
        if self.remaining == 0:
            self._finish(ex)
        elif rest:
            self._body(ex, rest, ex.loop.time())

    def _body(self, ex: Exchange, data: bytes, now: float) -> None:
        if self.remaining is not None:
            take = data[:self.remaining]
            self.remaining -= len(take)
            ex.got_body(take, 1 if take else 0, now)
            if self.remaining == 0 and self.ex is ex:
                self._finish(ex)
            return
        if self.until_close:
            ex.got_body(data, 1, now)
            return
        if self.pending:
            data = self.pending + data
            self.pending = b""
        pos, n, chunks, final = 0, len(data), 0, False
        while pos < n:
            j = data.find(b"\r\n", pos)
            if j < 0:
                break
            try:
                size = int(data[pos:j].split(b";", 1)[0], 16)
            except ValueError:
                self._fail(UpstreamError("malformed chunked body", before_head=False))
                return
            if size == 0:
                end = data.find(b"\r\n\r\n", j)  # the last chunk, trailers, the blank line
                if end < 0:
                    break
                pos, final = end + 4, True
                break
            end = j + 2 + size + 2
            if end > n:
                break
            pos = end
            chunks += 1
        whole, self.pending = data[:pos], data[pos:]
        if whole or chunks:
            ex.got_body(whole, chunks, now)
        if final and self.ex is ex:
            self._finish(ex)

    def _finish(self, ex: Exchange) -> None:
        self.ex = None
        ex.up = None
        reusable = self.keep_alive and not self.pending and not self.closed
        self._reset_parse()
        if reusable:
            self.pool.release(self)
        else:
            self.abort()
        ex.ended()

    def _fail(self, exc: UpstreamError) -> None:
        ex = self.ex
        self.ex = None
        self.abort()
        if ex is not None:
            ex.up = None
            ex.failed(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        ex = self.ex
        self.ex = None
        if ex is None:
            return
        ex.up = None
        if self.until_close and self.in_body:
            ex.ended()
            return
        before_head = not self.in_body
        reused = self.num_exchanges > 1 and before_head and not self.head_buf
        ex.failed(UpstreamError("the replica closed the connection", before_head=before_head,
                                reused=reused))

    def abort(self) -> None:
        self.closed = True
        self.ex = None
        if self.transport is not None:
            self.transport.abort()


def parse_head(head: bytes) -> tuple[int, int | None, bool, bool]:
    """(status, content length, chunked, keep-alive) of an HTTP/1.1 response head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ValueError("not an HTTP/1.x status line")
    status = int(parts[1])
    length: int | None = None
    chunked = False
    keep_alive = parts[0] == b"HTTP/1.1"
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        value = value.strip().lower()
        if name == b"content-length":
            length = int(value)
            if length < 0:
                raise ValueError("negative content-length")
        elif name == b"transfer-encoding":
            chunked = value.endswith(b"chunked")
        elif name == b"connection":
            keep_alive = b"close" not in value if keep_alive else b"keep-alive" in value
    if status in (204, 304) or 100 <= status < 200:
        length = 0 if status != 100 else None
        chunked = False
    return status, (None if chunked else length), chunked, keep_alive


class Pool:
    """Idle keep-alive connections to one replica."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.authority = f"{host}:{port}"  # the Host header of its requests
        self.idle: list[Upstream] = []
        self.num_opened = 0

    async def connect(self, timeout_s: float, reuse: bool = True) -> Upstream:
        """An idle pooled connection (unless `reuse` is off: the retry after a stale one),
        else a new one."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        while reuse and self.idle:
            up = self.idle.pop()
            if not up.closed and now - up.idle_since < IDLE_CONNECTION_MAX_S:
                return up
            up.abort()
        try:
            _, up = await asyncio.wait_for(
                loop.create_connection(lambda: Upstream(self), self.host, self.port),
                timeout_s)
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect: {type(exc).__name__}",
                                before_head=True) from exc
        self.num_opened += 1
        return up

    def release(self, up: Upstream) -> None:
        if up.closed or len(self.idle) >= MAX_IDLE_PER_REPLICA:
            up.abort()
            return
        assert up.transport is not None
        up.idle_since = asyncio.get_running_loop().time()
        self.idle.append(up)

    def close(self) -> None:
        for up in self.idle:
            with contextlib.suppress(Exception):
                up.abort()
        self.idle = []


def request_bytes(path: str, host: str, body: bytes, stream: bool, request_id: str) -> bytes:
    accept = b"text/event-stream" if stream else b"application/json"
    return (b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
            b"Accept: %s\r\nX-Request-ID: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (path.encode(), host.encode(), accept, request_id.encode(), len(body), body))
