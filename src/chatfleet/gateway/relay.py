"""One client request through the gateway: its slot, the upstream exchange, the relay.

The order of things (docs/gateway.md):
1. The body is read (bounded in size and time) and checked; the shared prompt is applied
   (app.py). A streamed answer needs chunked transfer: an HTTP/1.0 client asking for one gets
   400 before anything is taken.
2. The request's `Slot` (slots.py) is acquired: admitted to a replica, queued until a slot or
   its deadline, or shed with 429 + Retry-After (503 when no replica serves; per-key limits
   too, all the core's decisions).
3. The request goes upstream on a pooled connection. A failure before the response head (a
   stale keep-alive connection is first retried on the same replica, fresh) sends the request
   back to admission (`Slot.retry_elsewhere`, the core's requeue), its deadline unchanged: it
   goes on to another replica when one has room in time, or is shed with 429 + Retry-After;
   the failure's own error (502) only when no other replica is in the fleet, or on a second
   failure. A non-200 head is replaced with the gateway's own error. The head of a stream
   must come within `first_byte_s`; a whole (non-streaming) answer's head comes when the
   answer is done, so it is bounded by the request's `total_s`, and running past it is the
   request's timeout, not the replica's failure.
4. The body is relayed byte for byte. If the replica dies mid-stream the client gets an SSE
   error event and the connection closes; if the client leaves, the upstream connection is
   dropped at once, which aborts the request at the engine. Whatever ends the exchange, the
   upstream request is dropped with it.
5. The slot is released exactly once (the Slot's context), the answer's usage teaches the
   router the session's token counts, and `run` returns one `Outcome`, which the caller counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson
from aiohttp import web

from chatfleet.core.fleet.admission import Decision, FleetRequest
from chatfleet.gateway import errors
from chatfleet.gateway.admission import LiveAdmission
from chatfleet.gateway.config import Timeouts
from chatfleet.gateway.metrics import GatewayMetrics
from chatfleet.gateway.replicas import ReplicaRegistry
from chatfleet.gateway.slots import Slot
from chatfleet.gateway.upstream import CUT_STALLED, Exchange, UpstreamError, request_bytes
from chatfleet.http.errors import error

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
JSON_HEADERS = {"Content-Type": "application/json"}
_ids = itertools.count(1)


class Outcome(StrEnum):
    """How a request ended (`requests_total{outcome}`)."""

    OK = "ok"  # the whole answer reached the client
    SHED = "shed"  # 429 + Retry-After: the queue, the deadline, the key's limit
    ERROR = "error"  # the gateway's or a replica's failure (502, 503, an SSE error event)
    TIMEOUT = "timeout"  # 504, or a stream cut for its idle or total timeout
    CANCELLED = "cancelled"  # the client went away (or was cut off for not reading)
    REJECTED = "rejected"  # the request's own fault, seen upstream or here (a 4xx)


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
    cut_off: str | None = None  # it was cut off for leaving its answer unread: why


@dataclass(frozen=True, slots=True)
class Relayed:
    response: web.StreamResponse
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """What the relay reads of the configuration (it changes at a reload)."""

    timeouts: Timeouts = field(default_factory=Timeouts)
    debug_headers: bool = False


def next_request_id() -> str:
    return f"gw-{next(_ids)}"


class StreamWatch:
    """The streams being relayed, for the idle timeout and each request's total one: `sweep`
    aborts those past either (the client gets the SSE error event); and their clients, until
    the last byte has left: one that has taken nothing of its answer for `client_read_s`
    while some of it waited (gateway/reading.py) is cut off, its upstream request aborted and
    its slot freed."""

    def __init__(self) -> None:
        self._watched: dict[int, tuple[Exchange, float]] = {}

    def watch(self, ex: Exchange, deadline: float) -> int:
        self._watched[id(ex)] = (ex, deadline)
        return id(ex)

    def unwatch(self, token: int) -> None:
        self._watched.pop(token, None)

    def sweep(self, now: float, idle_s: float, client_read_s: float) -> None:
        for token, (ex, deadline) in list(self._watched.items()):
            if not ex.client_gone and ex.client_reading(now).stalled(now, client_read_s):
                ex.cut_client(CUT_STALLED)
                self._watched.pop(token, None)
                continue
            if ex.done.done():  # the answer is all in: only its client is watched
                continue
            if now - ex.last_read > idle_s or now > deadline:
                ex.timed_out = True
                ex.abort_upstream()
                self._watched.pop(token, None)


class Relay:
    """The relay, with its dependencies given: admission (slots, first bytes, usage), the
    replica registry (replicas and their pools, health reports), the metrics it times streams
    into, its settings, the stream watch, and `on_placed` (where a request's session now runs:
    the shared session map)."""

    def __init__(self, admission: LiveAdmission, registry: ReplicaRegistry,
                 metrics: GatewayMetrics, settings: RelaySettings, watch: StreamWatch,
                 on_placed: Callable[[FleetRequest, str], None] | None = None) -> None:
        self.admission = admission
        self.registry = registry
        self.metrics = metrics
        self.settings = settings
        self.watch = watch
        self.on_placed = on_placed

    async def run(self, request: web.Request, call: Call) -> Relayed:
        if call.stream and request.version < (1, 1):
            return Relayed(error(400, "stream: true needs HTTP/1.1 (a stream is sent "
                                 "with chunked transfer): send the request over "
                                 "HTTP/1.1, or without stream", param="stream"),
                           Outcome.REJECTED)
        async with Slot(self.admission, call.fleet_request, self.on_placed) as slot:
            assert slot.decision is not None
            if slot.shed:
                return _shed(slot.decision, call)
            return await self._exchange(request, call, slot)

    async def _exchange(self, request: web.Request, call: Call, slot: Slot) -> Relayed:
        admission, registry = self.admission, self.registry
        t = self.settings.timeouts
        retried = False
        fresh = False
        while True:
            assert slot.replica is not None
            replica = slot.replica
            rep = registry.replicas.get(replica)
            ex = Exchange(admission.loop, self._timer(call, slot) if call.stream else None,
                          keep_body=not call.stream)
            # a stream's head comes at once; a whole answer's when it is done
            head_s = t.first_byte_s if call.stream else max(
                0.0, call.arrival + t.total_s - admission.now())
            try:
                if rep is None:
                    raise UpstreamError("replica removed", before_head=True)
                up = await rep.pool.connect(t.connect_s, reuse=not fresh)
                up.send(ex, request_bytes(call.path, rep.pool.authority, call.body,
                                          call.stream, call.request_id))
                async with asyncio.timeout(head_s):
                    status, length = await ex.head
            except UpstreamError as exc:
                if exc.reused and not fresh:
                    fresh = True  # a keep-alive connection the replica had closed
                    continue
                registry.report(replica, ok=False)
                failed = await self._fail_over(call, slot, retried, error(
                    502, "no replica could take the request", code="upstream_unavailable"))
                if failed is not None:
                    return failed
                retried, fresh = True, False
                continue
            except TimeoutError:
                ex.abort_upstream()
                if call.stream:
                    registry.report(replica, ok=False)
                    return Relayed(error(504, f"the engine did not answer within "
                                         f"{t.first_byte_s:g} s",
                                         code="upstream_timeout"), Outcome.TIMEOUT)
                return Relayed(error(504, f"the answer was not done within the "
                                     f"request's total timeout, {t.total_s:g} s",
                                     code="upstream_timeout"), Outcome.TIMEOUT)
            except BaseException:  # the client left (cancelled), or anything else
                ex.abort_upstream()
                raise
            if status >= 500 or status == 429:
                ex.abort_upstream()
                registry.report(replica, ok=status == 429)
                failed = await self._fail_over(call, slot, retried,
                                               errors.upstream_status(status))
                if failed is not None:
                    return failed
                retried, fresh = True, False
                continue
            if status != 200:
                ex.abort_upstream()
                registry.report(replica, ok=True)  # the request's fault, not the replica's
                return Relayed(errors.upstream_status(status), Outcome.REJECTED)
            try:
                return await self._relay(request, call, slot, replica, ex, length)
            finally:
                ex.abort_upstream()  # a no-op once the answer ended; else the engine stops

    async def _fail_over(self, call: Call, slot: Slot, retried: bool,
                         failure: web.Response) -> Relayed | None:
        """The request failed at its replica before the first byte. The first time, it goes
        back to admission (`Slot.retry_elsewhere`: its slot there frees, its deadline stays)
        and None is returned once another replica's slot is held; a shed answers 429 +
        Retry-After. `failure`, the failure's own error, is the answer on a second failure,
        or when no other replica is in the fleet."""
        if retried:
            return Relayed(failure, Outcome.ERROR)
        self.metrics.requeues += 1
        d = await slot.retry_elsewhere()
        if d.admitted:
            self.metrics.retries += 1
            return None
        if d.reason == "no_replica":
            return Relayed(failure, Outcome.ERROR)
        return _shed(d, call)

    def _timer(self, call: Call, slot: Slot) -> Any:
        """The stream's clock: TTFT and ITL into the metrics, and the first chunk's time
        since admission to the fleet (a sample of the replica's learned reserve)."""
        m = self.metrics
        admission = self.admission
        last: float | None = None
        replica, decision = slot.replica, slot.decision

        def on_chunks(n: int, now: float) -> None:
            nonlocal last
            m.chunks += n
            if last is None:
                m.ttft.observe(now - call.arrival)
                if replica is not None and decision is not None:
                    admission.first_byte(replica, decision.at)
                n -= 1
            elif n:
                m.itl.observe((now - last) / n, n)
                n = 0
            if n:
                m.itl.observe(0.0, n)
            last = now

        return on_chunks

    async def _relay(self, request: web.Request, call: Call, slot: Slot, replica: str,
                     ex: Exchange, length: int | None) -> Relayed:
        headers = {**(SSE_HEADERS if call.stream and length is None else JSON_HEADERS),
                   "X-Request-ID": call.request_id, **call.headers}
        if self.settings.debug_headers:
            headers["x-chatfleet-replica"] = replica
        resp = web.StreamResponse(status=200, headers=headers)
        if length is None:
            resp.enable_chunked_encoding()
        else:
            resp.content_length = length
        transport = request.transport
        watch: int | None = None
        try:
            await resp.prepare(request)
            if transport is None or transport.is_closing():
                raise ConnectionResetError
            ex.start(transport)
            # watched until its last byte has left (the client's stalls: StreamWatch)
            watch = self.watch.watch(ex, call.arrival + self.settings.timeouts.total_s)
            await ex.done
            self.registry.report(replica, ok=True)
            self._learn(call, ex)
            slot.release()  # the engine is done with it, whether or not the client has it all
            if ex.client_gone:  # it left before the end reached it
                return Relayed(resp, Outcome.CANCELLED)
            if transport.is_closing():  # (checked before start) it has it all, and closed
                return Relayed(resp, Outcome.OK)
            _bypass_writer(resp)
            with contextlib.suppress(ConnectionError):
                await resp.write_eof()  # waits while the client's buffer is full
            if ex.cut_off is not None:  # cut off for not reading the end of it
                call.cut_off = ex.cut_off
                return Relayed(resp, Outcome.CANCELLED)
            return Relayed(resp, Outcome.OK)
        except asyncio.CancelledError:
            call.cut_off = ex.cut_off
            raise
        except ConnectionResetError:
            return Relayed(resp, Outcome.CANCELLED)
        except UpstreamError:
            if ex.client_gone:
                call.cut_off = ex.cut_off
                resp.force_close()
                return Relayed(resp, Outcome.CANCELLED)
            self.registry.report(replica, ok=False)
            resp.force_close()
            if length is None and transport is not None and not transport.is_closing():
                transport.write(errors.sse_error_chunk())
                _bypass_writer(resp)
                with contextlib.suppress(ConnectionError):
                    await resp.write_eof()
            elif transport is not None:
                transport.close()
            return Relayed(resp, Outcome.TIMEOUT if ex.timed_out else Outcome.ERROR)
        finally:
            if watch is not None:
                self.watch.unwatch(watch)

    def _learn(self, call: Call, ex: Exchange) -> None:
        """The answer's usage: the session's prompt and cached tokens for the next turn."""
        usage = find_usage(ex.body_bytes() if not call.stream else ex.tail_bytes(),
                           call.stream)
        if usage is None:
            return
        prompt = usage.get("prompt_tokens")
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        self.admission.observe_usage(
            call.fleet_request.session_key,
            prompt if isinstance(prompt, int) else None,
            cached if isinstance(cached, int) else None)


def _shed(d: Decision, call: Call) -> Relayed:
    """The core turned the request away: 429 + Retry-After (503 when no replica serves)."""
    return Relayed(errors.shed(d, call.request_id),
                   Outcome.ERROR if d.reason == "no_replica" else Outcome.SHED)


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
