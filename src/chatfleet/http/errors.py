"""The one BadRequest, OpenAI's error body, and the one error middleware of both servers.

A handler raises `BadRequest(status, message, param)` for the client's mistake; the middleware
answers it as OpenAI's `{"error": {"message", "type", "param", "code"}}`. Anything unexpected
is logged with its traceback and answered as a JSON 500 whose body says only that it was
logged: a 500 is a bug, never the answer to bad input.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

# OpenAI's error types by status (a status not here is a server_error)
TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 408: "timeout_error",
         413: "invalid_request_error", 422: "invalid_request_error",
         429: "rate_limit_exceeded", 502: "server_error", 503: "server_error",
         504: "timeout_error"}


class BadRequest(Exception):
    """The client's mistake: a 4xx with `message` (and `param`, the field at fault)."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


class ClientLeft(BadRequest):
    """The client went away before its body arrived (nobody reads the 400)."""


def error_json(status: int, message: str, code: str | int | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape; `code` is the status unless a word says more."""
    return {"error": {"message": message, "type": TYPES.get(status, "server_error"),
                      "param": param, "code": code or status}}


def error_body(status: int, message: str, code: str | None = None,
               param: str | None = None) -> bytes:
    return orjson.dumps(error_json(status, message, code, param))


def error(status: int, message: str, code: str | None = None, param: str | None = None,
          headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(status, message, code, param),
                        content_type="application/json", headers=headers)


def answer(exc: BadRequest) -> web.Response:
    return error(exc.status, exc.message, exc.code, exc.param)


def error_middleware(log: logging.Logger, server: str, *,
                     answer_http_errors: bool = True) -> Middleware:
    """The middleware: BadRequest as its error body; aiohttp's own 4xx/5xx (404, 405 with its
    Allow header, ...) as the error body too when `answer_http_errors` (else as aiohttp
    answers them); anything else logged to `log` and answered 500, "internal error in the
    `server` (logged)", without the traceback."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except BadRequest as exc:
            return answer(exc)
        except web.HTTPException as exc:
            if exc.status < 400 or not answer_http_errors:
                raise
            return error(exc.status, exc.reason, headers={
                k: v for k, v in exc.headers.items() if k.lower() == "allow"})
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception:
            log.exception("internal error on %s %s", request.method, request.path)
            return error(500, f"internal error in the {server} (logged)")

    return errors
