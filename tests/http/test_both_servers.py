"""One BadRequest, rendered the same by both servers: the same bad body gets the same status
and the same error JSON from a simserver and from a gateway in front of it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from chatfleet.simserver.server import serve_in_thread
from tests.gateway.conftest import gateway, gateway_config
from tests.simserver.conftest import config

pytestmark = pytest.mark.timeout(120)
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def urls() -> Iterator[tuple[str, str]]:
    with serve_in_thread(config()) as sim, gateway(gateway_config(sim.urls)) as g:
        yield sim.urls[0], g.url


def post(url: str, data: bytes, headers: dict[str, str] | None = None) -> requests.Response:
    return requests.post(url + CHAT, data=data, timeout=30,
                         headers={"Content-Type": "application/json", **(headers or {})})


BAD: dict[str, tuple[bytes, dict[str, str]]] = {
    "not JSON": (b'{"messages": [', {}),
    "not UTF-8": (b'{"messages": "\xff"}', {}),
    "not an object": (b'[{"role": "user", "content": "hi"}]', {}),
    "not the gzip it says": (b"this is not gzip", {"Content-Encoding": "gzip"}),
    "no messages": (b'{"messages": []}', {}),
    "a message without a role": (b'{"messages": [{"content": "hi"}]}', {}),
    "max_tokens below 1": (b'{"messages": [{"role": "user", "content": "hi"}], '
                           b'"max_tokens": 0}', {}),
    "a content of the wrong type": (b'{"messages": [{"role": "user", "content": 5}]}', {}),
}


@pytest.mark.parametrize("case", list(BAD))
def test_the_same_bad_body_gets_the_same_answer_from_both(urls: tuple[str, str],
                                                          case: str) -> None:
    sim, gw = urls
    data, headers = BAD[case]
    answers: list[tuple[int, str, Any]] = []
    for url in (sim, gw):
        r = post(url, data, headers)
        answers.append((r.status_code, r.headers["Content-Type"], r.json()))
    assert answers[0] == answers[1]
    status, content_type, body = answers[0]
    assert status == 400 and content_type.startswith("application/json")
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == 400


def test_a_good_body_goes_through_both(urls: tuple[str, str]) -> None:
    for url in urls:
        r = requests.post(url + CHAT, timeout=30, json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] <= 2
