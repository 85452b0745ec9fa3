"""What the hostile-client probe of issue 23 found in the gateway: a body of 130,000 tiny
messages was parsed and validated on the event loop (0.6-0.7 s, about 107 MiB) before any slot
was taken, and forwarded; `n` went on unchecked (n sequences in one slot); the `Server` header
named aiohttp's version. Each is a test that failed before the fix."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import requests

from chatfleet.http.bounds import MAX_MESSAGES
from chatfleet.http.headers import SERVER
from chatfleet.simserver.server import serve_in_thread
from tests.gateway.conftest import Fake, gateway, gateway_config
from tests.gateway.test_hostile_clients import exchange, openai_error, post
from tests.simserver.conftest import config

pytestmark = pytest.mark.timeout(120)

TINY = {"role": "user", "content": "a"}


def probe_body(n: int) -> bytes:
    return orjson.dumps({"model": "m", "messages": [TINY] * n, "max_tokens": 4})


def test_a_body_of_130000_tiny_messages_is_refused_before_it_takes_a_slot(
        fakes2: list[Fake]) -> None:
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        raw = probe_body(130_000)
        assert len(raw) > 3_000_000
        message = openai_error(*exchange(g.url, post(b"", raw)), 400)
        assert message == f"messages: at most {MAX_MESSAGES} items, not 130000"
        status, _ = exchange(g.url, post(b"", probe_body(MAX_MESSAGES)))
        assert status == 200
    assert [len(b["messages"]) for f in fakes2 for b in f.bodies] == [MAX_MESSAGES]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": [TINY], "n": 4}, "n"),
    ("/v1/chat/completions", {"messages": [TINY], "best_of": 2}, "best_of"),
    ("/v1/completions", {"prompt": ["a", "b", "c"]}, "prompt"),
    ("/v1/completions", {"prompt": [[1, 2], [3, 4]]}, "prompt"),
])
def test_more_than_one_sequence_per_request_is_refused(fakes2: list[Fake], path: str,
                                                       body: dict[str, Any],
                                                       param: str) -> None:
    """Several sequences in the one slot the gateway counts would run past the cap: a 400
    naming the field, nothing forwarded; the same request for one sequence goes through."""
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        r = requests.post(g.url + path, json={**body, "max_tokens": 4}, timeout=30)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and "per request" in err["message"]
        assert sum(len(f.bodies) for f in fakes2) == 0
        one = {**body, "max_tokens": 4, "n": 1, "best_of": 1}
        if "prompt" in body:
            one["prompt"] = body["prompt"][:1]
        assert requests.post(g.url + path, json=one, timeout=30).status_code == 200


def test_the_gateway_names_no_version_in_its_server_header(fakes2: list[Fake]) -> None:
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        answers = [
            requests.get(g.url + "/health", timeout=10),
            requests.get(g.url + "/nowhere", timeout=10),
            requests.post(g.url + "/v1/chat/completions", json={"messages": []}, timeout=10),
            requests.post(g.url + "/v1/chat/completions", timeout=30,
                          json={"messages": [TINY], "max_tokens": 2, "stream": True}),
        ]
        assert [r.status_code for r in answers] == [200, 404, 400, 200]
        assert {r.headers["Server"] for r in answers} == {SERVER}


def test_the_simserver_names_no_version_and_bounds_items_the_same_way() -> None:
    with serve_in_thread(config()) as srv:
        url = srv.urls[0]
        answers = [requests.get(url + "/health", timeout=10),
                   requests.post(url + "/v1/chat/completions", data=probe_body(130_000),
                                 headers={"Content-Type": "application/json"}, timeout=30),
                   requests.post(url + "/v1/chat/completions", timeout=30,
                                 json={"messages": [TINY], "max_tokens": 2})]
        assert [r.status_code for r in answers] == [200, 400, 200]
        assert answers[1].json()["error"]["message"] == (
            f"messages: at most {MAX_MESSAGES} items, not 130000")
        assert {r.headers["Server"] for r in answers} == {SERVER}
