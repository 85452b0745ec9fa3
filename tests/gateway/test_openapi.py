"""The gateway's OpenAPI description: a valid OpenAPI 3.1 document, served without a key, and
in step with the routes the application registers (both ways)."""

from __future__ import annotations

from typing import Any

import requests
import schemathesis
from jsonschema import Draft202012Validator

from chatfleet.gateway.app import Gateway
from chatfleet.gateway.config import hash_key
from chatfleet.gateway.openapi import openapi
from tests.gateway.conftest import Fake, gateway, gateway_config
from tests.gateway.test_relay import chat

METHODS = {"get", "put", "post", "delete", "patch", "options", "head", "trace"}


def registered(gw: Gateway) -> set[tuple[str, str]]:
    """(method, path) of every route; aiohttp's automatic HEAD for each GET left out."""
    out = set()
    for resource in gw.app.router.resources():
        for route in resource:
            if route.method != "HEAD":
                out.add((route.method.lower(), resource.canonical))
    return out


def described(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(m, path) for path, item in doc["paths"].items() for m in item if m in METHODS}


def test_the_description_is_valid_openapi_3_1() -> None:
    doc = openapi()
    assert doc["openapi"] == "3.1.0"
    schema = schemathesis.openapi.from_dict(doc)
    schema.validate()  # the OpenAPI 3.1 meta-schema
    for sub in doc["components"]["schemas"].values():
        Draft202012Validator.check_schema(sub)
    ops = list(schema.get_all_operations())
    assert len(ops) == len(described(doc))
    assert all(op.ok() for op in ops)  # every operation's references resolve
    # a fresh copy each call: nobody can change the served one by accident
    doc["paths"].clear()
    assert openapi()["paths"]


def test_every_route_is_described_and_nothing_else(fakes2: list[Fake]) -> None:
    gw = Gateway(gateway_config([f.url for f in fakes2]))
    assert registered(gw) == described(openapi())


def test_every_error_status_has_the_error_body() -> None:
    doc = openapi()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method not in METHODS:
                continue
            assert "200" in op["responses"] or "201" in op["responses"], (method, path)
            for status, resp in op["responses"].items():
                if int(status) >= 400 and path != "/ready":
                    assert resp["content"]["application/json"]["schema"] == {
                        "$ref": "#/components/schemas/Error"}, (method, path, status)
            shed = op["responses"].get("429")
            if shed is not None:
                assert shed["headers"]["Retry-After"]["required"] is True


def test_served_without_a_key(fakes2: list[Fake]) -> None:
    cfg = gateway_config([f.url for f in fakes2],
                         keys=[{"name": "alice", "sha256": hash_key("sk-alice-123")}],
                         admin={"sha256": hash_key("admin-key-123")})
    with gateway(cfg) as g:
        r = requests.get(g.url + "/openapi.json", timeout=5)
        assert r.status_code == 200
        assert r.headers["Content-Type"].startswith("application/json")
        assert r.json() == openapi()
        # while the API itself needs one
        assert requests.get(g.url + "/v1/models", timeout=5).status_code == 401


def test_a_relayed_stream_matches_the_described_events(fakes2: list[Fake]) -> None:
    """Each server-sent event of a streamed answer (as a client parses it: `data:` lines)
    validates against the description's text/event-stream schema: the check Schemathesis's
    response_schema_conformance makes on every streamed case."""
    op = openapi()["paths"]["/v1/chat/completions"]["post"]
    validator = Draft202012Validator(op["responses"]["200"]["content"]["text/event-stream"]
                                     ["schema"])
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        resp = chat(g.url, {"chunks": 3})
    assert resp.status_code == 200
    found = [{"data": line[len("data: "):]} for line in resp.text.splitlines()
             if line.startswith("data: ")]
    assert len(found) >= 4 and found[-1] == {"data": "[DONE]"}
    for event in found:
        validator.validate(event)
    assert not Draft202012Validator(validator.schema).is_valid("data: [DONE]")  # not raw text
