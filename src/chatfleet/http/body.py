"""A request's JSON body, read within limits: its size (413), its time (408), its
Content-Encoding (a bad gzip is a 400), valid JSON (400) and a JSON object (400); and whether
it can be written again (a body to forward: orjson reads 1,024 levels but writes 254).

The decode runs with Python's cyclic garbage collector paused. orjson holds the GIL for the
whole decode, so nothing else runs meanwhile either way; but every few hundred containers it
creates set off a collection, each over all the containers made so far: 1.3 million empty
arrays (a 3.8 MB body) took 0.70 s of CPU with the collector on and 0.06 s with it paused,
the event loop blocked all along. Paused, the decode's time is bounded by the body's size."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from chatfleet.http.errors import BadRequest, ClientLeft

MAX_JSON_DEPTH = 254  # arrays and objects; orjson reads 1,024 levels but writes only 254
CHUNK_BYTES = 65536


@dataclass(frozen=True, slots=True)
class BodyLimits:
    max_bytes: int
    timeout_s: float | None = None  # None: the body has no deadline of its own


async def read_body(request: web.Request, limits: BodyLimits) -> bytes:
    """The body's bytes, decoded as its Content-Encoding says; BadRequest (413, 408, 400) or
    ClientLeft (the connection closed while it came)."""
    limit = limits.max_bytes
    if request.content_length is not None and request.content_length > limit:
        raise BadRequest(f"the request body is larger than {limit} bytes", status=413)
    try:
        raw = await asyncio.wait_for(_read_at_most(request, limit), limits.timeout_s)
    except TimeoutError as exc:
        raise BadRequest("the request body did not arrive in time", status=408) from exc
    except ConnectionResetError as exc:
        raise ClientLeft("the client went away before its body arrived") from exc
    if raw is None:
        raise BadRequest(f"the request body is larger than {limit} bytes", status=413)
    return raw


@contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (as it was, after)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def parse_object(raw: bytes) -> dict[str, Any]:
    """`raw` as a JSON object, or BadRequest (400)."""
    try:
        with collector_paused():
            body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


async def read_object(request: web.Request, limits: BodyLimits) -> dict[str, Any]:
    return parse_object(await read_body(request, limits))


def check_writable(body: dict[str, Any]) -> None:
    """What cannot be written cannot be forwarded: BadRequest (400) before trying."""
    try:
        orjson.dumps(body)
    except orjson.JSONEncodeError as exc:
        raise BadRequest(f"the body is nested too deeply: at most {MAX_JSON_DEPTH} levels "
                         "of arrays and objects") from exc


async def _read_at_most(request: web.Request, limit: int) -> bytes | None:
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in request.content.iter_chunked(CHUNK_BYTES):
            size += len(chunk)
            if size > limit:
                return None
            parts.append(chunk)
    except web.RequestPayloadError as exc:  # a Content-Encoding that does not decode
        raise BadRequest("the body could not be decoded as its Content-Encoding "
                         f"({request.headers.get('Content-Encoding', 'none')}) says") from exc
    return b"".join(parts)
