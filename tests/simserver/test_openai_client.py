"""The official `openai` client against the simserver: chat and completions, streamed and not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from chatfleet.simserver.server import RunningServer

from .conftest import MODEL

pytestmark = pytest.mark.timeout(60)

MESSAGES = [{"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name three rivers of Europe."}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[openai.OpenAI]:
    c = openai.OpenAI(base_url=server.urls[0] + "/v1", api_key="unused", timeout=30,
                      max_retries=0)
    yield c
    c.close()


def assert_vocabulary_words(text: str, vocab: dict[str, int], hf_tokenizer: Any) -> int:
    """`text` is a run of " word" pieces, each one vocabulary token; returns the word count."""
    assert text.startswith(" "), repr(text)
    words = text[1:].split(" ")
    assert all(words), repr(text)
    for w in words:
        assert "\u0120" + w in vocab, w  # byte-level BPE spells a leading space as "Ġ"
    ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(words)
    return len(words)


def test_chat_non_streamed_thinking_by_default(client: openai.OpenAI, vocab: dict[str, int],
                                               hf_tokenizer: Any) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=40,
                                       extra_body={"ignore_eos": True})
    ch = r.choices[0]
    assert ch.finish_reason == "length"
    assert ch.message.role == "assistant"
    reasoning = ch.message.model_extra.get("reasoning_content")
    assert reasoning, "Qwen3 thinks by default: reasoning_content expected"
    assert "<think>" not in reasoning and "</think>" not in reasoning
    assert "<think>" not in (ch.message.content or "")
    n_reason = assert_vocabulary_words(reasoning, vocab, hf_tokenizer)
    n_content = assert_vocabulary_words(ch.message.content or "", vocab, hf_tokenizer)
    # <think> \n ... </think> \n\n: four tag tokens with no visible text
    assert n_reason + n_content + 4 == 40
    assert r.usage is not None
    assert r.usage.completion_tokens == 40
    assert r.usage.total_tokens == r.usage.prompt_tokens + 40
    assert r.model == MODEL


def test_chat_non_streamed_without_thinking(client: openai.OpenAI, vocab: dict[str, int],
                                            hf_tokenizer: Any) -> None:
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=25,
                                       extra_body={**NO_THINK, "ignore_eos": True})
    msg = r.choices[0].message
    assert (msg.model_extra or {}).get("reasoning_content") is None
    assert assert_vocabulary_words(msg.content or "", vocab, hf_tokenizer) == 25
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 25


def _delta_fields(chunk: Any) -> tuple[str | None, str | None]:
    d = chunk.choices[0].delta
    return (d.model_extra or {}).get("reasoning_content"), d.content


def test_chat_streamed_reasoning_first_then_content(client: openai.OpenAI, vocab: dict[str, int],
                                                    hf_tokenizer: Any) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=30, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    token_chunks = [c for c in chunks if c.choices and c.choices[0].finish_reason is None]
    assert len(token_chunks) == 30  # one chunk per token, tags included
    assert token_chunks[0].choices[0].delta.role == "assistant"
    kinds = []
    reasoning, content = "", ""
    for c in token_chunks:
        r, t = _delta_fields(c)
        assert (r is None) != (t is None), c
        kinds.append("r" if r is not None else "c")
        reasoning += r or ""
        content += t or ""
    assert kinds[0] == "r" and "c" in kinds
    assert kinds == sorted(kinds, reverse=True), "every reasoning chunk precedes the content"
    assert_vocabulary_words(reasoning, vocab, hf_tokenizer)
    assert_vocabulary_words(content, vocab, hf_tokenizer)
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    # include_usage: one last chunk with usage and no choices
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None and last.usage.completion_tokens == 30
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_streamed_without_thinking_has_no_reasoning(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=12,
                                            stream=True, extra_body=NO_THINK)
    chunks = list(stream)
    assert chunks, "no chunk"
    assert all(_delta_fields(c)[0] is None for c in chunks if c.choices)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_continuous_usage_counts_one_token_per_chunk(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert all(c.usage is not None for c in chunks), "usage on every chunk"
    token_chunks = [c for c in chunks if c.choices and c.choices[0].finish_reason is None]
    counts = [c.usage.completion_tokens for c in token_chunks]  # type: ignore[union-attr]
    assert counts == list(range(1, 21))
    prompt = {c.usage.prompt_tokens for c in chunks}  # type: ignore[union-attr]
    assert len(prompt) == 1 and prompt.pop() > 0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20  # type: ignore[union-attr]


def test_completions_string_prompt(client: openai.OpenAI, vocab: dict[str, int],
                                   hf_tokenizer: Any) -> None:
    prompt = "The quick brown fox jumps over the lazy dog."
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert assert_vocabulary_words(r.choices[0].text, vocab, hf_tokenizer) == 10
    assert r.usage is not None
    assert r.usage.prompt_tokens == len(hf_tokenizer(prompt, add_special_tokens=False)
                                        ["input_ids"])
    assert r.usage.completion_tokens == 10


def test_completions_default_max_tokens_is_16(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Once upon a time",
                                  extra_body={"ignore_eos": True})
    assert r.usage is not None and r.usage.completion_tokens == 16
    assert r.choices[0].finish_reason == "length"


def test_completions_token_id_prompt_streamed(client: openai.OpenAI, vocab: dict[str, int],
                                              hf_tokenizer: Any) -> None:
    ids = [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13]
    stream = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, stream=True,
                                       stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices and
             c.choices[0].finish_reason is None]
    assert len(texts) == 8
    assert_vocabulary_words("".join(texts), vocab, hf_tokenizer)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == len(ids)
    assert chunks[-1].usage.completion_tokens == 8


def test_models_list(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
