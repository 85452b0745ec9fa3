"""The OpenAI request shapes the simserver accepts (and its OpenAPI description).

Unknown fields are ignored, as SGLang ignores them (its router injects some). Sampling fields
(temperature, top_p, ...) are accepted and have no effect on the modelled answer.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Lenient):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class TextPart(_Lenient):
    type: Literal["text"] = "text"
    text: str


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    reasoning_content: str | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str | None:
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content)
        return self.content


class _Common(_Lenient):
    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    n: int = Field(1, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    rid: str | None = Field(None, min_length=1, max_length=200)
    user: str | None = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_Common):
    prompt: str | list[int] = Field(min_length=1)
    max_tokens: int | None = Field(16, ge=1)


class AbortRequest(_Lenient):
    rid: str = Field(min_length=1)


def error_body(message: str, code: int = 400, param: str | None = None,
               kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openapi(title: str, version: str, engine: str = "sglang") -> dict[str, Any]:
    """An OpenAPI 3.0 description of every route, from the request models: SGLang's admin
    routes, or vLLM's for a replica of the vLLM engine model."""
    schemas: dict[str, Any] = {}
    for model in (ChatCompletionRequest, CompletionRequest, AbortRequest):
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for name, sub in js.pop("$defs", {}).items():
            schemas[name] = sub
        schemas[model.__name__] = js
    err = {"description": "bad request",
           "content": {"application/json": {"schema": {"type": "object"}}}}
    ok_json = {"description": "ok", "content": {"application/json": {"schema": {}}}}

    def body(name: str) -> dict[str, Any]:
        return {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{name}"}}}}

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
