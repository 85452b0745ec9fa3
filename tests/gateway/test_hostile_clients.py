"""What a hostile or broken client can send the gateway (issue 14): every bad input gets a clear
4xx with the OpenAI error body and one log line at most, never a 500 or a traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from chatfleet.gateway.config import hash_key
from chatfleet.gateway.state import MemoryState, RedisState, StateBackend
from tests.gateway.conftest import Fake, gateway, gateway_config, raw_connection
from tests.gateway.redis_server import redis_server

pytestmark = pytest.mark.timeout(120)

MSG = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4'


def post(headers: bytes, body: bytes) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + headers
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def exchange(url: str, data: bytes) -> tuple[int, bytes]:
    """Send `data`; the answer's status and body (read to Content-Length)."""
    with raw_connection(url, data) as s:
        got = b""
        while b"\r\n\r\n" not in got:
            part = s.recv(65536)
            assert part, got
            got += part
        head, body = got.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(body) < length:
            part = s.recv(65536)
            assert part
            body += part
    return int(head.split(b" ", 2)[1]), body


def openai_error(status: int, body: bytes, expected: int) -> str:
    assert status == expected, (status, body[:300])
    err = orjson.loads(body)["error"]
    assert {"message", "type", "param", "code"} <= set(err)
    assert isinstance(err["message"], str) and err["message"]
    return str(err["message"])


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for rec in caplog.records:
        assert rec.exc_info is None, (rec.name, rec.getMessage())
        assert rec.levelno < logging.ERROR, (rec.name, rec.getMessage())


@pytest.mark.parametrize("depth", [254, 300, 1000])
def test_json_nested_deeper_than_the_gateway_can_forward_is_a_400(
        fakes2: list[Fake], depth: int, caplog: pytest.LogCaptureFixture) -> None:
    """orjson reads 1,024 levels but writes 255: the gateway must refuse what it cannot send
    on, before it tries."""
    body = MSG + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        message = openai_error(*exchange(g.url, post(b"", body)), 400)
        assert "nested" in message
        status, _ = exchange(g.url, post(b"", MSG + b"}"))
        assert status == 200
    assert sum(len(f.bodies) for f in fakes2) == 1
    no_traceback(caplog)


def test_an_invalid_gzip_body_is_a_400(fakes2: list[Fake],
                                       caplog: pytest.LogCaptureFixture) -> None:
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        message = openai_error(*exchange(
            g.url, post(b"Content-Encoding: gzip\r\n", b"this is not gzip")), 400)
        assert "Content-Encoding" in message
    assert sum(len(f.bodies) for f in fakes2) == 0
    no_traceback(caplog)


@pytest.fixture(params=["memory", "redis"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateBackend]:
    if request.param == "memory":
        yield MemoryState()
        return
    with redis_server(tmp_path) as (url, _):
        yield RedisState(url)


def test_a_session_id_that_is_not_utf8_is_a_400(fakes2: list[Fake], state: StateBackend,
                                                caplog: pytest.LogCaptureFixture) -> None:
    with gateway(gateway_config([f.url for f in fakes2]), state=state) as g:
        message = openai_error(*exchange(g.url, post(b"X-Session-ID: caf\xe9\xff\r\n",
                                                     MSG + b"}")), 400)
        assert "X-Session-ID" in message
        status, _ = exchange(g.url, post("X-Session-ID: café\r\n".encode(), MSG + b"}"))
        assert status == 200  # UTF-8 beyond ASCII is fine
    assert sum(len(f.bodies) for f in fakes2) == 1
    no_traceback(caplog)


def test_an_api_key_that_is_not_utf8_is_a_401(fakes2: list[Fake],
                                              caplog: pytest.LogCaptureFixture) -> None:
    cfg = gateway_config([f.url for f in fakes2],
                         keys=[{"name": "a", "sha256": hash_key("good-key")}])
    with gateway(cfg) as g:
        openai_error(*exchange(g.url, post(b"Authorization: Bearer k\xff\xfe\r\n",
                                           MSG + b"}")), 401)
        status, _ = exchange(g.url, post(b"Authorization: Bearer good-key\r\n", MSG + b"}"))
        assert status == 200
    no_traceback(caplog)
