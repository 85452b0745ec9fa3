"""OpenAPI schemas generated from the request models: what both servers' /openapi.json
describe their bodies with (a field added to a model appears there)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

Schema = dict[str, Any]
REF = "#/components/schemas/{model}"

# OpenAI's error body, as errors.error_json writes it
ERROR_SCHEMA: Schema = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "code": {"type": ["string", "integer"]},
        }}},
}


def ref(name: str) -> Schema:
    return {"$ref": REF.format(model=name)}


def model_schemas(*models: type[BaseModel]) -> dict[str, Schema]:
    """Each model's JSON schema by its class name, and the models they hold, for
    `components.schemas` (references point there)."""
    out: dict[str, Schema] = {}
    for model in models:
        js = model.model_json_schema(ref_template=REF)
        out.update(js.pop("$defs", {}))
        out[model.__name__] = js
    return out


def json_body(name: str) -> Schema:
    """A required JSON request body of the schema `name`."""
    return {"required": True, "content": {"application/json": {"schema": ref(name)}}}
