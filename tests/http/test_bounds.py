"""What one request may carry (issue 23): item counts are bounded before pydantic parses the
body, and a request asks for one sequence. Before, 130,000 one-word messages were parsed and
validated (0.46 s of CPU on the event loop, some 70 MiB) and `n`, `best_of` and a batch of
prompts went on to the engine, several sequences in one slot."""

from __future__ import annotations

from typing import Any

import pytest

from chatfleet.http.bounds import MAX_MESSAGES, MAX_PARTS, MAX_STOP, MAX_TOOLS
from chatfleet.http.errors import BadRequest
from chatfleet.http.models import ChatCompletionRequest, CompletionRequest, parse
from chatfleet.simserver import api

USER = {"role": "user", "content": "hi"}
PART = {"type": "text", "text": "a"}


def refused(model: Any, body: dict[str, Any], *, strict: bool = True) -> BadRequest:
    with pytest.raises(BadRequest) as caught:
        parse(model, body, strict=strict)
    assert caught.value.status == 400
    return caught.value


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"messages": [USER] * (MAX_MESSAGES + 1)}, "messages", f"at most {MAX_MESSAGES} items"),
    ({"messages": [USER], "tools": [{"type": "function"}] * (MAX_TOOLS + 1)}, "tools",
     f"at most {MAX_TOOLS} items"),
    ({"messages": [USER], "stop": ["x"] * (MAX_STOP + 1)}, "stop", f"at most {MAX_STOP} items"),
    ({"messages": [{"role": "user", "content": [PART] * (MAX_PARTS // 2 + 1)}] * 2},
     "messages", f"at most {MAX_PARTS} content parts"),
    ({"messages": [{"role": "assistant", "tool_calls": [{}] * (MAX_PARTS + 1)}]}, "messages",
     "tool calls"),
    ({"messages": [USER], "n": 2}, "n", "one sequence per request"),
    ({"messages": [USER], "best_of": 3}, "best_of", "send 3 requests"),
])
def test_a_chat_body_past_its_bounds_is_a_400_naming_the_field(
        body: dict[str, Any], param: str, words: str) -> None:
    for model, strict in ((ChatCompletionRequest, True), (api.ChatCompletionRequest, False)):
        err = refused(model, body, strict=strict)
        assert err.param == param and words in err.message, err.message


def test_the_bounds_are_checked_before_the_body_is_parsed() -> None:
    """130,000 messages, each of them malformed: the count is what answers, so no message was
    looked at (parsed, the first message's missing role would be the error)."""
    err = refused(ChatCompletionRequest, {"messages": [{"x": 1}] * 130_000})
    assert err.message == f"messages: at most {MAX_MESSAGES} items, not 130000"


@pytest.mark.parametrize("prompt", [["a", "b"], [[1, 2], [3]]])
def test_a_batch_of_prompts_is_refused(prompt: list[Any]) -> None:
    err = refused(CompletionRequest, {"prompt": prompt})
    assert err.param == "prompt" and "one prompt per request" in err.message


def test_what_is_within_the_bounds_passes() -> None:
    body = {"messages": [USER] * MAX_MESSAGES, "stop": ["x"] * MAX_STOP, "n": 1, "best_of": 1,
            "tools": [{"type": "function"}] * MAX_TOOLS}
    assert len(parse(ChatCompletionRequest, body, strict=True).messages) == MAX_MESSAGES
    parts = {"messages": [{"role": "user", "content": [PART] * MAX_PARTS}]}
    assert parse(api.ChatCompletionRequest, parts).messages[0].text() == "a" * MAX_PARTS
    assert parse(CompletionRequest, {"prompt": list(range(50_000))}).prompt[-1] == 49_999
