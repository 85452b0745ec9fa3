"""OpenAI's request bodies, as the servers read them: chat completions and completions.

These are the fields with OpenAI's types and the ranges every engine enforces; unknown fields
are ignored (SGLang's router injects some, and the gateway forwards the body as it came).
The gateway checks a body against them strictly (`strict=True`: `"stream": "yes"` is a 400),
before it takes a slot; the simserver narrows them to what its engine model serves
(simserver/api.py: text parts only, known roles, token-id prompts) and reads them as SGLang's
pydantic does (lax: `"stream": "true"` is true). A body that does not fit is a BadRequest
whose message and param name the field (`parse`). Before a generation body is parsed, its item
counts are bounded and more than one sequence is refused (http/bounds.py); the fields carry
the same limits, so the OpenAPI descriptions state them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from chatfleet.http.bounds import MAX_MESSAGES, MAX_STOP, MAX_TOOLS, check_bounds
from chatfleet.http.errors import BadRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
# the parts of a validation error's location that name a union's member, not a field:
# pydantic's tags ('str', 'list[int]', 'literal[...]', a model's class name)
_TYPE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


class Lenient(BaseModel):
    """Unknown fields are ignored (and, at the gateway, forwarded)."""

    model_config = ConfigDict(extra="ignore")


class StreamOptions(Lenient):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ContentPart(Lenient):
    """One part of a message's content: text, or another kind an engine may take (image_url,
    ...), which the gateway passes on."""

    type: str
    text: str | None = None


class ChatMessage(Lenient):
    role: str = Field(json_schema_extra={"enum": list(ROLES)})
    content: str | Sequence[ContentPart] | None = None
    reasoning_content: str | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str | None:
        """The content as one text (the text parts joined)."""
        if isinstance(self.content, str) or self.content is None:
            return self.content
        return "".join(p.text or "" for p in self.content)


class GenerationRequest(Lenient):
    """The fields both generation bodies share."""

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = Field(
        None, description="with stream true, the gateway sets include_usage (its usage "
                          "teaches the router the session's token counts)")
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    n: int = Field(1, ge=1, le=1, description="one sequence per request: each takes a slot")
    best_of: int | None = Field(None, ge=1, le=1, description="one sequence per request")
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    user: str | None = Field(None, description="the session key when there is no "
                                               "X-Session-ID")
    # the engines' own fields (SGLang's, vLLM's)
    min_tokens: int = Field(0, ge=0)
    ignore_eos: bool = False
    rid: str | list[str] | None = Field(
        None, description="the request id (SGLang's field); the gateway uses it as "
                          "X-Request-ID when it matches ^[A-Za-z0-9._:#-]{1,128}$")

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(GenerationRequest):
    messages: Sequence[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Any = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(GenerationRequest):
    # one prompt per request: a batch of prompts would run one sequence each in one slot
    prompt: (str | list[int] | Annotated[list[str], Field(max_length=1)]
             | Annotated[list[list[int]], Field(max_length=1)]) = Field(min_length=1)
    max_tokens: int | None = Field(16, ge=1)


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: dict[str, Any], *, strict: bool = False) -> M:
    """`body` as `model`, or a BadRequest (400) naming the first field at fault; a generation
    body's bounds are checked first (http/bounds.py)."""
    if issubclass(model, GenerationRequest):
        check_bounds(body)
    try:
        return model.model_validate(body, strict=strict)
    except ValidationError as exc:
        raise field_error(exc) from None


def field_error(exc: ValidationError) -> BadRequest:
    """The first error: "messages.0.role: Field required", param "messages.0.role"."""
    err = exc.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()) if not _is_tag(x))
    msg = str(err.get("msg", "invalid"))
    return BadRequest(f"{loc}: {msg}" if loc else msg, loc or None)


def _is_tag(part: object) -> bool:
    if not isinstance(part, str) or not part:
        return False
    return part in _TYPE_TAGS or part[0].isupper() or "[" in part or "-" in part
