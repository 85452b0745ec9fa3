"""The request bodies of both servers' /openapi.json are generated from the models: every
field of a model is described (a field added to a model appears), with its type."""

from __future__ import annotations

from pydantic import BaseModel

from chatfleet.gateway.openapi import openapi
from chatfleet.http.models import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    StreamOptions,
)
from chatfleet.http.openapi import model_schemas
from chatfleet.simserver import api


def test_the_gateway_describes_every_field_of_the_models() -> None:
    schemas = openapi()["components"]["schemas"]
    for model in (ChatCompletionRequest, CompletionRequest, ChatMessage, StreamOptions):
        described = schemas[model.__name__]
        assert set(described["properties"]) == set(model.model_fields), model.__name__
        required = {n for n, f in model.model_fields.items() if f.is_required()}
        assert set(described.get("required", [])) == required
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["messages"]["items"] == {"$ref": "#/components/schemas/ChatMessage"}
    assert chat["stream"]["type"] == "boolean"
    assert {"type": "integer", "minimum": 1} in chat["max_tokens"]["anyOf"]


def test_a_field_added_to_a_model_is_described() -> None:
    class WithPriority(ChatCompletionRequest):
        priority: int = 0

    class Empty(BaseModel):
        pass

    schemas = model_schemas(WithPriority, Empty)
    assert schemas["WithPriority"]["properties"]["priority"]["type"] == "integer"
    assert set(schemas["WithPriority"]["properties"]) == set(ChatCompletionRequest.model_fields
                                                             ) | {"priority"}
    assert "ChatMessage" in schemas  # what it holds, for its references
    assert schemas["Empty"]["properties"] == {}


def test_the_simserver_describes_its_narrowed_bodies() -> None:
    schemas = api.openapi("t", "0")["components"]["schemas"]
    assert schemas["ChatMessage"]["properties"]["role"]["enum"] == [
        "system", "developer", "user", "assistant", "tool"]
    assert set(schemas["CompletionRequest"]["properties"]) == set(
        api.CompletionRequest.model_fields)
