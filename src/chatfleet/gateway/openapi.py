"""The gateway's OpenAPI 3.1 description, served at GET /openapi.json.

It is the contract of what the gateway accepts and answers, kept truthful to the code
(app.py, errors.py, relay.py, admin.py): every route it registers, the headers it reads, and
every status it answers itself, each with its body.

The request bodies are OpenAI's, their schemas generated from the models the gateway checks
a body against (chatfleet/http/models.py: a field added there appears here). The gateway
checks a JSON object and the described fields' types strictly (`messages` a non-empty list of
messages with a string `role`, `max_tokens` a positive integer, `stream` a boolean, ...: 400
naming the field otherwise) and passes the body through to the engine as it came, which checks
the rest (an engine's 4xx becomes the gateway's 400, or 413/422, with the gateway's own text).
So the bodies allow additional properties (engine fields such as `chat_template_kwargs`), and
the described fields carry OpenAI's types without ranges the engines do not enforce.

Statuses the gateway answers itself: 400 (the body, or the engine rejected it), 401 (no or an
unknown key, when keys are configured; the admin API without the admin key), 404 (an unknown
path; the admin API when it is off; an unknown replica), 405 (a known path, another method:
with Allow), 408 (the body did not arrive within timeouts.client_body_s), 413 (the body is
larger than max_body_bytes), 422 (the engine answered 422), 429 (shed: Retry-After and
retry-after-ms), 502 (the replica failed before the first byte and no other could take the
request, or the engine failed), 503 (no replica is serving: with Retry-After; the engine was
overloaded; no replica answered /v1/models; /ready with no replica serving), 504
(no response head within timeouts.first_byte_s). Every error body is OpenAI's
`{"error": {"message", "type", "param", "code"}}`. A 500 is a bug in the gateway: it is not
part of the contract.
"""

from __future__ import annotations

from typing import Any

from chatfleet import __version__
from chatfleet.http.models import ChatCompletionRequest, CompletionRequest
from chatfleet.http.openapi import ERROR_SCHEMA, json_body, model_schemas, ref

JSON = "application/json"
SSE = "text/event-stream"

Schema = dict[str, Any]


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


_INT = {"type": "integer"}
_NUM = {"type": "number"}
_STR = {"type": "string"}
_BOOL = {"type": "boolean"}
# One server-sent event, as a client parses the stream (the engine's chunks relayed byte for
# byte: `data:` lines of JSON chunks, then `data: [DONE]`).
_SSE_EVENT = {"type": "object", "required": ["data"],
              "properties": {"data": _STR, "event": _STR, "id": _STR, "retry": _INT}}

SCHEMAS: dict[str, Schema] = {
    "Error": ERROR_SCHEMA,
    **model_schemas(ChatCompletionRequest, CompletionRequest),
    "Completion": {
        "type": "object", "required": ["id", "object", "choices"], "additionalProperties": True,
        "properties": {
            "id": _STR, "object": _STR, "created": _INT, "model": _STR,
            "choices": {"type": "array", "items": {"type": "object"}},
            "usage": {"type": "object", "properties": {
                "prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT}},
        },
    },
    "Models": {
        "type": "object", "required": ["object", "data"],
        "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": {
            "type": "object", "required": ["id", "object"],
            "properties": {"id": _STR, "object": {"const": "model"}, "created": _INT,
                           "owned_by": _STR}}}},
    },
    "Health": {"type": "object", "required": ["status"],
               "properties": {"status": {"const": "ok"}}},
    "Ready": {
        "type": "object", "required": ["ready", "serving", "ejected", "pending"],
        "properties": {"ready": _BOOL, "serving": {"type": "array", "items": _STR},
                       "ejected": {"type": "array", "items": _STR},
                       "pending": {"type": "array", "items": _STR,
                                   "description": "not yet passed a health probe"}},
    },
    "Replica": {
        "type": "object",
        "required": ["name", "url", "cap", "in_flight", "serving", "ejected", "pending"],
        "properties": {"name": _STR, "url": _STR, "cap": _INT, "in_flight": _INT,
                       "serving": _BOOL, "ejected": _BOOL, "pending": _BOOL},
    },
    "Replicas": {"type": "object", "required": ["replicas"],
                 "properties": {"replicas": {"type": "array", "items": ref("Replica")}}},
    "NewReplica": {
        "type": "object", "required": ["url"],
        "properties": {"url": {"type": "string", "description": "http://host:port"},
                       "name": _STR, "cap": {"type": "integer", "minimum": 0}},
    },
    "Limits": {
        "type": "object", "required": ["cap", "queue_depth", "caps", "keys", "ttft_budget_s",
                                       "timeouts"],
        "properties": {
            "cap": _INT, "queue_depth": _INT,
            "caps": {"type": "object", "additionalProperties": _INT},
            "keys": {"type": "object", "additionalProperties": _nullable(_INT)},
            "ttft_budget_s": _NUM,
            "prefill_reserve_s": {**_NUM, "description": "the reserve before a replica's is "
                                  "learned (or always, reserve.learn false)"},
            "reserve": {"type": "object", "description": "how each replica's reserve is "
                        "learned: the config's reserve section (learn, window_s, max_samples, "
                        "percentile, min_samples, min_s, max_s, resolution_s)"},
            "timeouts": {"type": "object", "additionalProperties": _NUM},
        },
    },
    "LimitsChange": {
        "type": "object", "additionalProperties": False,
        "properties": {
            "cap": {"type": "integer", "minimum": 0},
            "caps": {"type": "object", "additionalProperties": {"type": "integer",
                                                                "minimum": 0}},
            "queue_depth": {"type": "integer", "minimum": 0},
            "keys": {"type": "object",
                     "additionalProperties": _nullable({"type": "integer", "minimum": 1})},
        },
    },
}

_REQUEST_ID = {"description": "the request's id (the client's X-Request-ID or rid when "
                              "usable, else the gateway's own)", "schema": _STR}


def _error(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description,
                           "content": {JSON: {"schema": ref("Error")}}}
    if headers:
        out["headers"] = headers
    return out


def _ok(description: str, schema: Schema, media: str = JSON) -> dict[str, Any]:
    return {"description": description, "content": {media: {"schema": schema}}}


_RETRY_HEADERS: dict[str, dict[str, Any]] = {
    "Retry-After": {"required": True, "description": "whole seconds, 1-60",
                    "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "retry-after-ms": {"required": True, "description": "milliseconds (what openai-python "
                       "reads)", "schema": {"type": "string", "pattern": "^[0-9]+$"}},
    "X-Request-ID": _REQUEST_ID}
# 503 carries them only for no_replica
_OPTIONAL_RETRY_HEADERS = {k: {**v, "required": False} for k, v in _RETRY_HEADERS.items()}
_SHED = _error("shed: the queue is full, the wait would miss the TTFT budget (a request that "
               "failed at a replica before the first byte waits again with its original "
               "deadline), a request with priority took the place, or the key's concurrent "
               "limit is reached (code queue_full, deadline, displaced, key_limit)",
               _RETRY_HEADERS)

_AUTH_V1 = _error("keys are configured and the request has none, or an unknown one "
                  "(code invalid_api_key)")
_AUTH_ADMIN = {
    "401": _error("the admin API without the admin key (code invalid_api_key)"),
    "404": _error("the admin API is off (no admin.sha256 in the config file)"),
}

_HEADERS_IN = [
    {"name": "X-Session-ID", "in": "header", "required": False, "schema": _STR,
     "description": "the session key for affinity (else the body's user, else a hash of "
                    "the first turn)"},
    {"name": "X-Request-ID", "in": "header", "required": False, "schema": _STR,
     "description": "used as the request's id when it matches ^[A-Za-z0-9._:#-]{1,128}$ and "
                    "no running request has it"},
]


def _generate(request: str, what: str) -> dict[str, Any]:
    return {
        "summary": what,
        "description": "Relayed to a replica (admission, routing, retry before the first "
                       "byte). A stream that fails after the first byte ends with one SSE "
                       "event data: {\"error\": {..., \"code\": 502}}.",
        "parameters": _HEADERS_IN,
        "security": [{}, {"bearer": []}, {"api_key": []}],
        "requestBody": json_body(request),
        "responses": {
            "200": {"description": "the engine's answer, relayed: JSON, or server-sent events "
                                   "when stream is true",
                    "headers": {"X-Request-ID": _REQUEST_ID,
                                "x-chatfleet-prefix": {
                                    "description": "the shared-prefix check (with "
                                                   "debug_headers only)", "schema": _STR},
                                "x-chatfleet-replica": {
                                    "description": "the replica (with debug_headers)",
                                    "schema": _STR}},
                    "content": {JSON: {"schema": ref("Completion")},
                                SSE: {"schema": _SSE_EVENT}}},
            "400": _error("the body is not a JSON object, a checked field is wrong (param "
                          "names it), or the engine rejected the request (code "
                          "engine_rejected)"),
            "401": _AUTH_V1,
            "408": _error("the body did not arrive within timeouts.client_body_s"),
            "413": _error("the body is larger than max_body_bytes (or the engine said 413)"),
            "422": _error("the engine answered 422 (code engine_rejected)"),
            "429": _SHED,
            "502": _error("the replica failed before the first byte and no other replica could "
                          "take the request (code upstream_unavailable), or the engine failed "
                          "(code engine_error)"),
            "503": _error("no replica is serving: none has passed a health probe, or all are "
                          "ejected (code no_replica, with Retry-After and retry-after-ms); or "
                          "the engine was overloaded (code engine_overloaded)",
                          _OPTIONAL_RETRY_HEADERS),
            "504": _error("no response head within timeouts.first_byte_s (code "
                          "upstream_timeout)"),
        },
    }


def _admin(summary: str, ok: dict[str, Any], *, status: str = "200",
           body: str | None = None, bad: str | None = None,
           extra: dict[str, Any] | None = None) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary,
                          "security": [{"bearer": []}, {"api_key": []}],
                          "responses": {status: ok, **_AUTH_ADMIN, **(extra or {})}}
    if body is not None:
        op["requestBody"] = json_body(body)
    if bad is not None:
        op["responses"]["400"] = _error(bad)
    return op


def openapi() -> dict[str, Any]:
    """The description (a fresh dict each call)."""
    import copy

    limits = _ok("the limits now", ref("Limits"))
    replicas = _ok("the replicas now", ref("Replicas"))
    paths: dict[str, Any] = {
        "/v1/chat/completions": {"post": _generate("ChatCompletionRequest",
                                                   "chat completions")},
        "/v1/completions": {"post": _generate("CompletionRequest", "completions")},
        "/v1/models": {"get": {
            "summary": "the replicas' models (or served_model_name from the config)",
            "security": [{}, {"bearer": []}, {"api_key": []}],
            "responses": {"200": _ok("the models", ref("Models")), "401": _AUTH_V1,
                          "503": _error("no replica answered /v1/models (code "
                                        "no_replica)")}}},
        "/health": {"get": {"summary": "the process is up", "security": [],
                            "responses": {"200": _ok("up", ref("Health"))}}},
        "/ready": {"get": {"summary": "at least one replica takes requests", "security": [],
                           "responses": {"200": _ok("serving", ref("Ready")),
                                         "503": _ok("no replica serving", ref("Ready"))}}},
        "/metrics": {"get": {"summary": "Prometheus text", "security": [], "responses": {
            "200": _ok("the metrics", _STR, "text/plain")}}},
        "/openapi.json": {"get": {"summary": "this description", "security": [],
                                  "responses": {"200": _ok("OpenAPI 3.1",
                                                           {"type": "object"})}}},
        "/admin/replicas": {
            "get": _admin("list the replicas", replicas),
            "post": _admin("add a replica", _ok("added; the replicas now", ref("Replicas")),
                           status="201", body="NewReplica",
                           bad="not a JSON object, or not a valid replica (bad URL, name "
                               "taken, ...)"),
        },
        "/admin/replicas/{name}": {"delete": {
            **_admin("remove a replica (its streams finish)", replicas,
                     bad="the last replica cannot be removed",
                     extra={"404": _error("no replica of that name, or the admin API is "
                                          "off")}),
            "parameters": [{"name": "name", "in": "path", "required": True,
                            "schema": _STR}]}},
        "/admin/limits": {
            "get": _admin("caps, queue depth, per-key limits", limits),
            "put": _admin("change caps, the queue depth or per-key limits (until the next "
                          "reload)", limits, body="LimitsChange",
                          bad="not a JSON object, an unknown key, a bad count, an unknown "
                              "replica or key name"),
        },
        "/admin/reload": {"post": _admin(
            "re-read the config file", limits,
            bad="started without --config, or the file is bad (the running configuration "
                "is kept)")},
    }
    return copy.deepcopy({
        "openapi": "3.1.0",
        "info": {"title": "chatfleet gateway", "version": __version__,
                 "description": "An OpenAI-compatible gateway in front of engine replicas. "
                                "Any known path with another method answers 405 with Allow; "
                                "an unknown path 404; both with the error body."},
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "an API key (when keys are configured), or the "
                                          "admin key for /admin"},
                "api_key": {"type": "apiKey", "in": "header", "name": "api-key",
                            "description": "the key without Authorization"},
            },
        },
    })
