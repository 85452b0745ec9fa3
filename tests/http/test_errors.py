"""The one error middleware: a BadRequest is its OpenAI error body, aiohttp's own 4xx keep
their status and Allow header, and an unexpected exception is logged with its traceback and
answered as a JSON 500 that holds none of it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import requests
from aiohttp import web

from chatfleet.http.errors import BadRequest, error_json, error_middleware

from .conftest import served

log = logging.getLogger("chatfleet.test-http")


def app(answer_http_errors: bool = True) -> web.Application:
    async def bad(request: web.Request) -> web.Response:
        raise BadRequest("max_tokens: Input should be greater than or equal to 1",
                         "max_tokens")

    async def too_large(request: web.Request) -> web.Response:
        raise BadRequest("the request body is larger than 10 bytes", status=413)

    async def bug(request: web.Request) -> web.Response:
        raise RuntimeError("SECRET internal detail")

    async def ok(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    a = web.Application(middlewares=[error_middleware(log, "test server",
                                                      answer_http_errors=answer_http_errors)])
    a.router.add_post("/bad", bad)
    a.router.add_post("/large", too_large)
    a.router.add_get("/bug", bug)
    a.router.add_get("/ok", ok)
    return a


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with served(app()) as u:
        yield u


def test_a_bad_request_is_the_openai_error_body(url: str) -> None:
    r = requests.post(url + "/bad", timeout=10)
    assert r.status_code == 400
    assert r.headers["Content-Type"].startswith("application/json")
    assert r.json() == {"error": {
        "message": "max_tokens: Input should be greater than or equal to 1",
        "type": "invalid_request_error", "param": "max_tokens", "code": 400}}
    r = requests.post(url + "/large", timeout=10)
    assert r.status_code == 413
    assert r.json() == error_json(413, "the request body is larger than 10 bytes")


def test_an_unexpected_exception_is_logged_and_a_json_500_without_it(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger=log.name):
        r = requests.get(url + "/bug", timeout=10)
    assert r.status_code == 500
    assert r.json() == {"error": {"message": "internal error in the test server (logged)",
                                  "type": "server_error", "param": None, "code": 500}}
    assert "SECRET" not in r.text and "Traceback" not in r.text
    [rec] = [rec for rec in caplog.records if rec.name == log.name]
    assert rec.exc_info is not None and "SECRET internal detail" in str(rec.exc_info[1])
    assert requests.get(url + "/ok", timeout=10).json() == {"ok": True}  # it serves on


def test_aiohttp_s_own_errors_get_the_body_and_keep_allow(url: str) -> None:
    r = requests.get(url + "/bad", timeout=10)
    assert r.status_code == 405 and r.headers["Allow"] == "POST"
    assert r.json()["error"]["type"] == "invalid_request_error"
    r = requests.get(url + "/nothing", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_or_as_aiohttp_writes_them_when_asked() -> None:
    with served(app(answer_http_errors=False)) as u:
        r = requests.get(u + "/bad", timeout=10)
        assert r.status_code == 405 and r.headers["Allow"] == "POST"
        assert r.headers["Content-Type"].startswith("text/plain")
        assert requests.post(u + "/bad", timeout=10).json()["error"]["param"] == "max_tokens"
