"""Reading a JSON body within its limits: every way a body can be wrong is a 4xx with the
OpenAI error body (size 413, time 408, encoding, JSON, object 400), and a body too deep to
write again is refused before it is forwarded."""

from __future__ import annotations

import gzip
import socket
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import requests
from aiohttp import web

from chatfleet.http.body import MAX_JSON_DEPTH, BodyLimits, check_writable, read_object
from chatfleet.http.errors import BadRequest, error_middleware

from .conftest import served

LIMITS = BodyLimits(max_bytes=100, timeout_s=0.5)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    async def echo(request: web.Request) -> web.Response:
        return web.json_response(await read_object(request, LIMITS))

    import logging

    app = web.Application(middlewares=[error_middleware(logging.getLogger("t"), "t")])
    app.router.add_post("/echo", echo)
    with served(app) as u:
        yield u


def error(r: requests.Response, status: int) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert err["code"] == status and err["param"] is None
    return str(err["message"])


def test_a_json_object_is_read_plain_or_gzipped(url: str) -> None:
    assert requests.post(url + "/echo", json={"a": 1}, timeout=10).json() == {"a": 1}
    r = requests.post(url + "/echo", data=gzip.compress(b'{"b": [1, 2]}'), timeout=10,
                      headers={"Content-Encoding": "gzip"})
    assert r.json() == {"b": [1, 2]}


@pytest.mark.parametrize(("data", "headers", "words"), [
    (b"this is not gzip", {"Content-Encoding": "gzip"}, "Content-Encoding (gzip)"),
    (b"{", {}, "not valid JSON"),
    (b'{"p": "\xff\xfe"}', {}, "not valid JSON"),
    (b"", {}, "not valid JSON"),
    (b"[1]", {}, "must be a JSON object"),
    (b"null", {}, "must be a JSON object"),
])
def test_a_body_that_is_not_a_json_object_is_a_400(url: str, data: bytes,
                                                   headers: dict[str, str], words: str) -> None:
    assert words in error(requests.post(url + "/echo", data=data, headers=headers,
                                        timeout=10), 400)


def test_a_body_over_the_limit_is_a_413_with_or_without_its_length(url: str) -> None:
    big = orjson.dumps({"x": "y" * 200})
    assert "larger than 100 bytes" in error(requests.post(url + "/echo", data=big,
                                                          timeout=10), 413)

    def chunked() -> Iterator[bytes]:
        yield big[:50]
        yield big[50:]

    assert "larger than 100 bytes" in error(requests.post(url + "/echo", data=chunked(),
                                                          timeout=10), 413)


def test_a_body_that_does_not_arrive_in_time_is_a_408(url: str) -> None:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  b"Content-Length: 20\r\n\r\n{\"a\"")
        got = b""
        while b"\r\n\r\n" not in got:
            part = s.recv(65536)
            assert part, got
            got += part
        s.sendall(b': 1234567890123}')  # the rest, late: the server drains it and closes
        while s.recv(65536):
            pass
    assert got.startswith(b"HTTP/1.1 408"), got[:200]


def nested(depth: int) -> Any:
    out: Any = []
    for _ in range(depth - 1):
        out = [out]
    return out


def test_a_body_too_deep_to_write_again_is_refused() -> None:
    """orjson reads 1,024 levels, writes 254: the object and its arrays count."""
    check_writable({"x": nested(MAX_JSON_DEPTH - 1)})
    with pytest.raises(BadRequest, match="nested too deeply") as caught:
        check_writable({"x": nested(MAX_JSON_DEPTH)})
    assert caught.value.status == 400
