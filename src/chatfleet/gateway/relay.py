"""One client request through the gateway: admission, the upstream exchange, the relay.

The order of things (docs/gateway.md):
1. The body is read (bounded in size and time) and checked; the shared prompt is applied.
2. The request is offered to admission (`core/fleet`): admitted to a replica, queued until a
   slot or its deadline, or shed with 429 + Retry-After.
3. The request goes upstream on a pooled connection. A failure before the response head (a
   stale keep-alive connection is first retried on the same replica, fresh) sends the request
   back to admission (`core/fleet` requeue), its deadline unchanged: it goes on to another
   replica when one has room in time, or is shed with 429 + Retry-After; the failure's own
   error (502) only when no other replica is in the fleet, or on a second failure. A non-200
   head is replaced with the gateway's own error.
4. The body is relayed byte for byte. If the replica dies mid-stream the client gets an SSE
   error event and the connection closes; if the client leaves, the upstream connection is
   dropped at once, which aborts the request at the engine.
5. The slot is released exactly once, and the answer's usage teaches the router the session's
   token counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from chatfleet.core.fleet.admission import FleetRequest
from chatfleet.gateway import errors
from chatfleet.gateway.upstream import Exchange, UpstreamError, request_bytes

if TYPE_CHECKING:
    from chatfleet.gateway.app import Gateway

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
JSON_HEADERS = {"Content-Type": "application/json"}
_ids = itertools.count(1)


@dataclass(slots=True)
class Call:
    """What one request carries through the relay."""

    request_id: str
    path: str
    body: bytes
    stream: bool
    fleet_request: FleetRequest
    arrival: float
    headers: dict[str, str] = field(default_factory=dict)  # extra response headers
    replica: str | None = None
    slot_held: bool = False
    lease: str | None = None  # the shared store's lease on the slot


def next_request_id() -> str:
    return f"gw-{next(_ids)}"


class Relay:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    async def run(self, request: web.Request, call: Call) -> web.StreamResponse:
        gw = self.gw
        while True:
            try:
                d = await gw.fleet.acquire(call.fleet_request)
            except asyncio.CancelledError:  # the client left while queued
                gw.metrics.client_left()
                raise
            if d.shed:
                gw.metrics.requests["error" if d.reason == "no_replica" else "shed"] += 1
                return errors.shed(d, call.request_id)
            assert d.replica is not None
            call.replica, call.slot_held = d.replica, True
            if await self._lease(call):
                break
            # another gateway took the replica's last slot first: back to the queue (its
            # deadline unchanged); the core now knows the slot is gone
            self._release(call)
        gw.remember_session(call.fleet_request.session_key, d.replica)
        try:
            return await self._exchange(request, call)
        finally:
            self._release(call)

    async def _lease(self, call: Call) -> bool:
        assert call.replica is not None
        rep = self.gw.fleet.replicas.get(call.replica)
        cap = rep.cap if rep is not None else 0
        call.lease = await self.gw.shared.acquire(call.replica, cap)
        return call.lease is not None

    def _release(self, call: Call) -> None:
        if call.slot_held and call.replica is not None:
            call.slot_held = False
            self._drop_lease(call)
            self.gw.fleet.release(call.replica)

    def _drop_lease(self, call: Call) -> None:
        if call.lease is not None and call.replica is not None:
            self.gw.shared.release(call.replica, call.lease)
            call.lease = None

    async def _exchange(self, request: web.Request, call: Call) -> web.StreamResponse:
        gw = self.gw
        t = gw.cfg.timeouts
        retried = False
        fresh = False
        while True:
            assert call.replica is not None
            rep = gw.fleet.replicas.get(call.replica)
            ex = Exchange(gw.loop, self._timer(call) if call.stream else None,
                          keep_body=not call.stream)
            try:
                if rep is None:
                    raise UpstreamError("replica removed", before_head=True)
                up = await rep.pool.connect(t.connect_s, reuse=not fresh)
                up.send(ex, request_bytes(call.path, rep.config.url[7:], call.body, call.stream,
                                          call.request_id))
                status, length = await asyncio.wait_for(asyncio.shield(ex.head),
                                                        t.first_byte_s)
            except UpstreamError as exc:
                if exc.reused and not fresh:
                    fresh = True  # a keep-alive connection the replica had closed
                    continue
                gw.fleet.report(call.replica, ok=False)
                failed = await self._fail_over(call, retried, errors.error(
                    502, "no replica could take the request", code="upstream_unavailable"))
                if failed is not None:
                    return failed
                retried, fresh = True, False
                continue
            except TimeoutError:
                ex.abort_upstream()
                gw.fleet.report(call.replica, ok=False)
                gw.metrics.requests["timeout"] += 1
                return errors.error(504, f"the engine did not answer within "
                                    f"{t.first_byte_s:g} s", code="upstream_timeout")
            except asyncio.CancelledError:
                ex.abort_upstream()
                gw.metrics.client_left()
                raise
            if status >= 500 or status == 429:
                ex.abort_upstream()
                gw.fleet.report(call.replica, ok=status == 429)
                failed = await self._fail_over(call, retried, errors.upstream_status(status))
                if failed is not None:
                    return failed
                retried, fresh = True, False
                continue
            if status != 200:
                ex.abort_upstream()
                gw.fleet.report(call.replica, ok=True)  # the request's fault, not the replica's
                gw.metrics.requests["rejected"] += 1
                return errors.upstream_status(status)
            return await self._relay(request, call, ex, length)

    async def _fail_over(self, call: Call, retried: bool,
                         failure: web.Response) -> web.StreamResponse | None:
        """The request failed at its replica before the first byte. The first time, it goes
        back to admission (the core's `requeue`: its slot there frees, its deadline stays)
        and None is returned once another replica's slot is held; a shed answers 429 +
        Retry-After. `failure`, the failure's own error, is the answer on a second failure,
        or when no other replica is in the fleet."""
        gw = self.gw
        if retried:
            gw.metrics.requests["error"] += 1
            return failure
        assert call.replica is not None
        failed = call.replica
        self._drop_lease(call)
        call.slot_held = False  # the core frees it in requeue
        gw.metrics.requeues += 1
        try:
            d = await gw.fleet.requeue(call.fleet_request, failed)
            while d.admitted:
                assert d.replica is not None
                call.replica, call.slot_held = d.replica, True
                if await self._lease(call):
                    gw.metrics.retries += 1
                    gw.remember_session(call.fleet_request.session_key, d.replica)
                    return None
                self._release(call)  # another gateway took that slot first: wait again
                d = await gw.fleet.acquire(call.fleet_request)
        except asyncio.CancelledError:  # the client left while queued again
            gw.metrics.client_left()
            raise
        if d.reason == "no_replica":
            gw.metrics.requests["error"] += 1
            return failure
        gw.metrics.requests["shed"] += 1
        return errors.shed(d, call.request_id)

    def _timer(self, call: Call) -> Any:
        m = self.gw.metrics
        last: float | None = None

        def on_chunks(n: int, now: float) -> None:
            nonlocal last
            m.chunks += n
            if last is None:
                m.ttft.observe(now - call.arrival)
                n -= 1
            elif n:
                m.itl.observe((now - last) / n, n)
                n = 0
            if n:
                m.itl.observe(0.0, n)
            last = now

        return on_chunks

    async def _relay(self, request: web.Request, call: Call, ex: Exchange,
                     length: int | None) -> web.StreamResponse:
        gw = self.gw
        headers = {**(SSE_HEADERS if call.stream and length is None else JSON_HEADERS),
                   "X-Request-ID": call.request_id, **call.headers}
        if gw.cfg.debug_headers and call.replica is not None:
            headers["x-chatfleet-replica"] = call.replica
        resp = web.StreamResponse(status=200, headers=headers)
        if length is None:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = length
        transport = request.transport
        try:
            await resp.prepare(request)
            if transport is None or transport.is_closing():
                raise ConnectionResetError
            ex.start(transport)
            watch = gw.watch(ex, call.arrival)
            try:
                await asyncio.shield(ex.done)
            finally:
                gw.unwatch(watch)
        except asyncio.CancelledError:
            ex.abort_upstream()
            gw.metrics.client_left(ex.slow_client)
            raise
        except ConnectionResetError:
            ex.abort_upstream()
            gw.metrics.client_left()
            return resp
        except UpstreamError:
            if ex.client_gone:
                gw.metrics.client_left(ex.slow_client)
                resp.force_close()
                return resp
            gw.metrics.requests["timeout" if ex.timed_out else "error"] += 1
            assert call.replica is not None
            gw.fleet.report(call.replica, ok=False)
            resp.force_close()
            if length is None and transport is not None and not transport.is_closing():
                transport.write(errors.sse_error_chunk())
                _bypass_writer(resp)
                with contextlib.suppress(ConnectionError):
                    await resp.write_eof()
            elif transport is not None:
                transport.close()
            return resp
        assert call.replica is not None
        gw.fleet.report(call.replica, ok=True)
        gw.metrics.requests["ok"] += 1
        self._learn(call, ex)
        if ex.client_gone or transport.is_closing():  # transport: checked before start
            return resp
        _bypass_writer(resp)
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp

    def _learn(self, call: Call, ex: Exchange) -> None:
        """The answer's usage: the session's prompt and cached tokens for the next turn."""
        usage = find_usage(ex.body_bytes() if not call.stream else ex.tail_bytes(),
                           call.stream)
        if usage is None:
            return
        prompt = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        self.gw.fleet.observe_usage(
            call.fleet_request.session_key,
            prompt if isinstance(prompt, int) else None,
            cached if isinstance(cached, int) else None)


def _bypass_writer(resp: web.StreamResponse) -> None:
    """The body went to the transport verbatim, its chunk framing and end included: aiohttp's
    writer must not add its own end-of-body frame."""
    writer = resp._payload_writer
    if writer is not None:
        writer.chunked = False  # type: ignore[attr-defined]


def find_usage(data: bytes, stream: bool) -> dict[str, Any] | None:
    """The `usage` object of an answer: the whole JSON body, or the last SSE event that
    carries one (found in the final reads of the stream, its chunk framing around it)."""
    if not stream:
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return None
        usage = obj.get("usage") if isinstance(obj, dict) else None
        return usage if isinstance(usage, dict) else None
    pos = data.rfind(b'"usage"')
    while pos >= 0:
        start = data.rfind(b"data:", 0, pos)
        end = data.find(b"\n", pos)
        if start >= 0 and end > 0:
            try:
                obj = orjson.loads(data[start + 5:end])
            except orjson.JSONDecodeError:
                obj = None
            usage = obj.get("usage") if isinstance(obj, dict) else None
            if isinstance(usage, dict):
                return usage
        pos = data.rfind(b'"usage"', 0, pos)
    return None
