"""usage.prompt_tokens against an independent count: transformers' AutoTokenizer and chat
template over the same tokenizer files."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import chat, hf_chat_ids, post

pytestmark = pytest.mark.timeout(60)

SYSTEM = "You are a helpful assistant for a travel agency. Answer briefly and politely."
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "book_hotel", "description": "Book a hotel room.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "nights": {"type": "integer"}},
            "required": ["city", "nights"]}}},
]

CONVERSATIONS: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = {
    "system+user": ([
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Which month is best to visit Lisbon?"}], None),
    "user only": ([{"role": "user", "content": "Hello! ¿Qué tal? 你好 🙂"}], None),
    "multi-turn": ([
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "I want to go to Rome."},
        {"role": "assistant", "content": "Rome is lovely in spring. How many nights?"},
        {"role": "user", "content": "Four nights, in April."}], None),
    "multi-turn with reasoning": ([
        {"role": "user", "content": "What is 17 * 3?"},
        {"role": "assistant", "content": "<think>\n17*3 = 51\n</think>\n\n51"},
        {"role": "user", "content": "And 51 + 9?"}], None),
    "tools": ([
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What's the weather in Oslo?"}], TOOLS),
    "tool call and result": ([
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What's the weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": -3, "sky": "snow"}'},
        {"role": "user", "content": "Then book two nights there."}], TOOLS),
}


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_prompt_tokens_match_transformers(url: str, hf_tokenizer: Any, name: str,
                                          thinking: bool) -> None:
    messages, tools = CONVERSATIONS[name]
    body: dict[str, Any] = {"max_tokens": 1}
    if tools is not None:
        body["tools"] = tools
    if not thinking:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    got = chat(url, messages, **body)["usage"]["prompt_tokens"]
    kw: dict[str, Any] = {"enable_thinking": thinking}
    if tools is not None:
        kw["tools"] = tools
    want = len(hf_chat_ids(hf_tokenizer, messages, **kw))
    assert got == want


def test_thinking_off_adds_the_empty_think_block(url: str) -> None:
    messages = CONVERSATIONS["system+user"][0]
    on = chat(url, messages, max_tokens=1)["usage"]["prompt_tokens"]
    off = chat(url, messages, max_tokens=1,
               chat_template_kwargs={"enable_thinking": False})["usage"]["prompt_tokens"]
    assert off == on + 4  # <think> \n\n </think> \n\n


def test_text_parts_count_as_their_joined_text(url: str, hf_tokenizer: Any) -> None:
    parts = [{"type": "text", "text": "Which month is best "},
             {"type": "text", "text": "to visit Lisbon?"}]
    got = chat(url, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": parts}],
               max_tokens=1)["usage"]["prompt_tokens"]
    want = len(hf_chat_ids(hf_tokenizer, CONVERSATIONS["system+user"][0]))
    assert got == want


def test_completion_prompt_tokens_are_the_raw_text_tokens(url: str, hf_tokenizer: Any) -> None:
    prompt = "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    r = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    assert r.status_code == 200, r.text
    want = hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert r.json()["usage"]["prompt_tokens"] == len(want) == 10
