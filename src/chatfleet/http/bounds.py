"""What one request may carry: item counts bounded before the body is parsed into a model, and
one sequence per request.

Checked on the decoded JSON with `len` alone, before pydantic builds anything: validating
130,000 one-word messages (a 3.9 MB body) took 0.46 s of CPU on the event loop and some
70 MiB, before any slot was taken (docs/reliability.md, the hostile-client probe). The limits
follow OpenAI's API where it has one (2,048 messages, 128 tools); the rest are far above what
a chat client sends.

One sequence per request: `n` and `best_of` above 1, or a batch of prompts, would run several
sequences at the engine in the one slot the gateway counted, past the cap. They are refused
(400), not counted as several slots: a client that wants n answers sends n requests, each
admitted, queued or shed on its own.
"""

from __future__ import annotations

from typing import Any

from chatfleet.http.errors import BadRequest

MAX_MESSAGES = 2048  # OpenAI's limit
MAX_TOOLS = 128  # OpenAI's limit
MAX_STOP = 64  # stop strings (OpenAI allows 4; the engines do not limit them)
MAX_PARTS = 2048  # content parts and tool calls of all the messages together


def check_bounds(body: dict[str, Any]) -> None:
    """BadRequest (400, its param the field) when `body` carries more items than the limits,
    or asks for more than one sequence; the types are the model's to check (a field of the
    wrong type is left alone here)."""
    _at_most(body, "messages", MAX_MESSAGES)
    _at_most(body, "tools", MAX_TOOLS)
    _at_most(body, "stop", MAX_STOP)
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = 0
        for m in messages:
            if isinstance(m, dict):
                for key in ("content", "tool_calls"):
                    value = m.get(key)
                    if isinstance(value, list):
                        parts += len(value)
        if parts > MAX_PARTS:
            raise BadRequest(f"messages: at most {MAX_PARTS} content parts and tool calls in "
                             f"all the messages together, not {parts}", "messages")
    for key in ("n", "best_of"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 1:
            raise BadRequest(f"{key}: one sequence per request ({key} = 1): each sequence "
                             f"takes a slot of its own, so send {value} requests", key)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], str | list):
        raise BadRequest(f"prompt: one prompt per request, not a batch of {len(prompt)}: each "
                         "prompt takes a slot of its own, so send one request per prompt",
                         "prompt")


def _at_most(body: dict[str, Any], key: str, limit: int) -> None:
    value = body.get(key)
    if isinstance(value, list) and len(value) > limit:
        raise BadRequest(f"{key}: at most {limit} items, not {len(value)}", key)
