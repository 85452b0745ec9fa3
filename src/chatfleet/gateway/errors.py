"""The gateway's own answers: OpenAI-shaped errors, and nothing of an upstream's text."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from aiohttp import web

from chatfleet.core.fleet.admission import Decision

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
          413: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_exceeded", 502: "server_error", 503: "server_error",
          504: "timeout_error"}


def error_body(status: int, message: str, code: str | None = None,
               param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message,
                                   "type": _TYPES.get(status, "server_error"),
                                   "param": param, "code": code or status}})


def error(status: int, message: str, code: str | None = None, param: str | None = None,
          headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(status, message, code, param),
                        content_type="application/json", headers=headers)


def shed(d: Decision, request_id: str) -> web.Response:
    """429 with Retry-After (whole seconds, RFC 9110) and retry-after-ms (openai-python); 503
    with the same headers when no replica takes requests at all (reason no_replica)."""
    reasons = {"queue_full": "the queue is full", "deadline": "the wait would miss the "
               "time-to-first-token target", "displaced": "a request with priority took "
               "the place in the queue", "key_limit": "this key's concurrent request limit is "
               "reached"}
    reason = d.reason or "queue_full"
    headers = {"Retry-After": str(d.retry_after_s), "retry-after-ms": str(d.retry_after_ms),
               "X-Request-ID": request_id}
    if reason == "no_replica":
        return error(503, f"no replica is serving (none has passed a health probe yet, or "
                     f"all are ejected); retry after {d.retry_after_s} s", code=reason,
                     headers=headers)
    return error(429, f"overloaded: {reasons.get(reason, reason)}; retry after "
                 f"{d.retry_after_s} s", code=reason, headers=headers)


def upstream_status(status: int) -> web.Response:
    """A replica's non-200 answer, replaced: the status class survives, the text does not."""
    if status == 429:
        return error(503, "the engine is overloaded; try again", code="engine_overloaded")
    if 400 <= status < 500:
        return error(400 if status not in (413, 422) else status,
                     f"the engine rejected the request (HTTP {status}): check its parameters "
                     "(max_tokens against the context length, the model name, the messages)",
                     code="engine_rejected")
    return error(502, "the engine failed to answer", code="engine_error")


SSE_ERROR = (b"data: " + orjson.dumps({"error": {
    "message": "the replica serving this stream failed; the answer is incomplete",
    "type": "server_error", "param": None, "code": 502}}) + b"\n\n")


def sse_error_chunk() -> bytes:
    """The error event as one HTTP chunk, then the end of the chunked body."""
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(SSE_ERROR), SSE_ERROR)
