"""The OpenAI request shapes the simserver accepts (and its OpenAPI description): OpenAI's
bodies (chatfleet/http/models.py, the gateway's too) narrowed to what the engine model serves:
the five roles, text content parts, a prompt of text or token ids, SGLang's rid.

Unknown fields are ignored, as SGLang ignores them (its router injects some). Sampling fields
(temperature, top_p, ...) are accepted and have no effect on the modelled answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from chatfleet.http import models
from chatfleet.http.models import Lenient
from chatfleet.http.openapi import json_body, model_schemas

Role = Literal["system", "developer", "user", "assistant", "tool"]  # models.ROLES


class TextPart(models.ContentPart):
    type: Literal["text"] = "text"
    text: str


class ChatMessage(models.ChatMessage):
    role: Role
    content: str | Sequence[TextPart] | None = None


class ChatCompletionRequest(models.ChatCompletionRequest):
    messages: Sequence[ChatMessage] = Field(min_length=1)
    rid: str | None = Field(None, min_length=1, max_length=200)


class CompletionRequest(models.CompletionRequest):
    prompt: str | list[int] = Field(min_length=1)
    rid: str | None = Field(None, min_length=1, max_length=200)


class AbortRequest(Lenient):
    rid: str = Field(min_length=1)


def openapi(title: str, version: str, engine: str = "sglang") -> dict[str, Any]:
    """An OpenAPI 3.0 description of every route, from the request models: SGLang's admin
    routes, or vLLM's for a replica of the vLLM engine model."""
    schemas = model_schemas(ChatCompletionRequest, CompletionRequest, AbortRequest)
    err = {"description": "bad request",
           "content": {"application/json": {"schema": {"type": "object"}}}}
    ok_json = {"description": "ok", "content": {"application/json": {"schema": {}}}}
    body = json_body

    gen = {"description": "a completion (JSON), or server-sent events when stream is true",
           "content": {"application/json": {"schema": {}}, "text/event-stream": {"schema": {}}}}
    admin: dict[str, Any] = {
        "/health_generate": {"get": {"responses": {"200": {"description": "ok"}}}},
        "/get_server_info": {"get": {"responses": {"200": ok_json}}},
        "/flush_cache": {"post": {"responses": {"200": {"description": "flushed"},
                                                "400": err}}},
        "/abort_request": {"post": {"requestBody": body("AbortRequest"),
                                    "responses": {"200": ok_json, "400": err}}},
    }
    if engine == "vllm":
        admin = {
            "/reset_prefix_cache": {"post": {"responses": {"200": ok_json}}},
            "/server_info": {"get": {"responses": {"200": ok_json}}},
            "/version": {"get": {"responses": {"200": ok_json}}},
        }
    return {
        "openapi": "3.0.3",
        "info": {"title": title, "version": version},
        "paths": {
            "/v1/chat/completions": {"post": {"requestBody": body("ChatCompletionRequest"),
                                              "responses": {"200": gen, "400": err}}},
            "/v1/completions": {"post": {"requestBody": body("CompletionRequest"),
                                         "responses": {"200": gen, "400": err}}},
            "/v1/models": {"get": {"responses": {"200": ok_json}}},
            "/health": {"get": {"responses": {"200": {"description": "ok"}}}},
            **admin,
            "/metrics": {"get": {"responses": {"200": {"description": "Prometheus text"}}}},
            "/telemetry": {"get": {"responses": {"200": ok_json}}},
        },
        "components": {"schemas": schemas},
    }
