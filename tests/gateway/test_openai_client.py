"""The official `openai` client through the gateway, unchanged: streaming, non-streaming, tools
passed through, and a 429 it understands (retry-after-ms)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import openai
import pytest

from chatfleet.simserver.server import serve_in_thread as simserver
from tests.gateway.conftest import Fake, gateway, gateway_config
from tests.gateway.test_relay import in_background
from tests.simserver.conftest import config

pytestmark = pytest.mark.timeout(120)

MESSAGES = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three rivers of Europe."}]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


@pytest.fixture(scope="module")
def through_gateway() -> Iterator[str]:
    """Two simserver replicas (the SGLang-like API) behind a gateway; the gateway's URL."""
    with simserver(config(replicas=2)) as srv:
        cfg = gateway_config(srv.urls, names=["a", "b"])
        with gateway(cfg) as g:
            yield g.url


def client(url: str, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=30,
                         max_retries=retries)


def test_streaming_chat(through_gateway: str) -> None:
    with client(through_gateway) as c:
        stream = c.chat.completions.create(model="qwen3-8b", messages=MESSAGES,  # type: ignore[arg-type]
                                           max_tokens=12, stream=True,
                                           stream_options={"include_usage": True})
        chunks = list(stream)
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text.strip()
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_non_streaming_chat_and_completions(through_gateway: str) -> None:
    with client(through_gateway) as c:
        r = c.chat.completions.create(model="qwen3-8b", messages=MESSAGES,  # type: ignore[arg-type]
                                      max_tokens=8)
        assert r.choices[0].finish_reason == "length"
        assert r.usage is not None and r.usage.completion_tokens == 8
        cr = c.completions.create(model="qwen3-8b", prompt="The capital of France is",
                                  max_tokens=5)
        assert cr.usage is not None and cr.usage.completion_tokens == 5
        models = c.models.list()
        assert [m.id for m in models.data] == ["qwen3-8b"]


def test_tools_reach_the_replica_unchanged(fakes2: list[Fake]) -> None:
    with gateway(gateway_config([fakes2[0].url], names=["f0"])) as g, client(g.url) as c:
        r = c.chat.completions.create(model="m", messages=MESSAGES,  # type: ignore[arg-type]
                                      tools=TOOLS, tool_choice="auto",  # type: ignore[arg-type]
                                      extra_body={"fake": {"chunks": 2}})
        assert r.choices[0].message.content
        stream = c.chat.completions.create(model="m", messages=MESSAGES,  # type: ignore[arg-type]
                                           tools=TOOLS, stream=True,  # type: ignore[arg-type]
                                           extra_body={"fake": {"chunks": 2}})
        assert len([ch for ch in stream if ch.choices]) == 2
    for body in fakes2[0].bodies:
        assert body["tools"] == TOOLS
    assert fakes2[0].bodies[0]["tool_choice"] == "auto"


def test_a_shed_request_is_a_rate_limit_error_the_client_can_retry(
        fakes2: list[Fake]) -> None:
    cfg = gateway_config([fakes2[0].url], names=["f0"], cap=1, queue_depth=0)
    with gateway(cfg) as g:
        t = in_background(g.url, {"chunks": 60, "gap_s": 0.02},
                          lambda: g.gateway.fleet.ac.in_flight("f0") == 1)
        with client(g.url) as c, pytest.raises(openai.RateLimitError) as err:
            c.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert err.value.response.headers["retry-after-ms"].isdigit()
        # with retries on, the client waits retry-after-ms and gets through once the slot frees
        t0 = time.monotonic()
        with client(g.url, retries=5) as c:
            r = c.chat.completions.create(model="m", messages=MESSAGES,  # type: ignore[arg-type]
                                          extra_body={"fake": {"chunks": 1}})
        assert r.choices[0].message.content
        assert time.monotonic() - t0 >= 0.5
        t.join(30)
