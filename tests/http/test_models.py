"""OpenAI's request bodies: the gateway reads them strictly, the simserver as SGLang's pydantic
does and narrowed to what it serves; a body that does not fit is a 400 naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from chatfleet.http.errors import BadRequest
from chatfleet.http.models import ChatCompletionRequest, CompletionRequest, parse
from chatfleet.simserver import api

USER = [{"role": "user", "content": "hi"}]


def refused(model: Any, body: dict[str, Any], *, strict: bool = False) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        parse(model, body, strict=strict)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(("body", "param"), [
    ({}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"content": "hi"}]}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "max_tokens": True}, "max_tokens"),
    ({"messages": USER, "max_completion_tokens": 2.5}, "max_completion_tokens"),
    ({"messages": USER, "stream": "yes"}, "stream"),
    ({"messages": USER, "stream_options": {"include_usage": "yes"}},
     "stream_options.include_usage"),
    ({"messages": USER, "temperature": "hot"}, "temperature"),
    ({"messages": USER, "n": 0}, "n"),
])
def test_a_chat_body_that_does_not_fit_names_the_field(body: dict[str, Any],
                                                      param: str) -> None:
    err = refused(ChatCompletionRequest, body, strict=True)
    assert err.param == param
    assert err.message.startswith(f"{param}: ")


@pytest.mark.parametrize("prompt", [3, "", [], None])
def test_a_prompt_that_does_not_fit_names_the_prompt(prompt: Any) -> None:
    """A union's member tags ('str', 'list[int]') are not part of the field's name."""
    err = refused(CompletionRequest, {"prompt": prompt}, strict=True)
    assert err.param == "prompt" and err.message.startswith("prompt: ")


def test_what_the_gateway_passes_on_to_any_engine() -> None:
    """Any role (vLLM takes custom ones), any kind of content part, a prompt in a list of one,
    unknown fields: the engine behind decides (a batch of prompts is refused:
    tests/http/test_bounds.py)."""
    req = parse(ChatCompletionRequest, {"messages": [
        {"role": "critic", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        "chat_template_kwargs": {"enable_thinking": False}, "bootstrap_room": 7},
        strict=True)
    assert req.messages[0].role == "critic" and req.stream is False
    assert parse(CompletionRequest, {"prompt": [[1, 2]]}, strict=True).prompt == [[1, 2]]
    assert parse(CompletionRequest, {"prompt": ["hi"]}, strict=True).prompt == ["hi"]


def test_the_gateway_is_strict_and_the_simserver_lax_like_sglang() -> None:
    body = {"messages": USER, "stream": "true", "max_tokens": "8"}
    assert refused(ChatCompletionRequest, body, strict=True).param == "stream"
    req = parse(api.ChatCompletionRequest, body)
    assert req.stream is True and req.max_tokens == 8


@pytest.mark.parametrize(("model", "body"), [
    (api.ChatCompletionRequest, {"messages": [{"role": "critic", "content": "hi"}]}),
    (api.ChatCompletionRequest, {"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
    (api.CompletionRequest, {"prompt": [[1, 2]]}),
    (api.ChatCompletionRequest, {"messages": USER, "rid": ""}),
])
def test_the_simserver_narrows_the_bodies_to_what_it_serves(model: Any,
                                                            body: dict[str, Any]) -> None:
    parse(model.__mro__[1], body, strict=True)  # the gateway lets it through
    assert refused(model, body).param is not None
