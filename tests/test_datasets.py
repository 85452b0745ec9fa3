"""Tests for chatfleet.data and chatfleet.check.gsm8k: Qwen3 tokenizer/template, exact-token texts,
ShareGPT, GSM8K."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatfleet.check.gsm8k import extract_model_answer, gsm8k_answer, load_gsm8k
from chatfleet.data.exact_tokens import (
    system_block_overhead,
    system_prompt_of_exact_tokens,
    text_of_exact_tokens,
)
from chatfleet.data.lengths import load_length_file
from chatfleet.data.paths import gsm8k_test_path, qwen_tokenizer_dir
from chatfleet.data.sharegpt import (
    SHAREGPT_MAX_PROMPT_LEN,
    SHAREGPT_MAX_TOTAL_LEN,
    SHAREGPT_MIN_LEN,
    cached_sharegpt_length_pairs,
    load_sharegpt_conversations,
    sharegpt_length_pairs,
)
from chatfleet.data.tokenizer import QwenTokenizer, load_qwen_tokenizer

GSM8K_TEST = gsm8k_test_path()  # the split shipped with the package

TWO_TURNS = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "<think>\nAdd two and two.\n</think>\n\n4"},
    {"role": "user", "content": "And 3+3?"},
]
TWO_TURNS_HISTORY = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    "<|im_start|>assistant\n4<|im_end|>\n"
    "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


@pytest.fixture(scope="module")
def tok() -> QwenTokenizer:
    return load_qwen_tokenizer()


# -- tokenizer --------------------------------------------------------------------------------


def test_tokenizer_basics(tok: QwenTokenizer) -> None:
    assert load_qwen_tokenizer() is tok
    assert tok.vocab_size == 151_669
    assert tok.base_vocab_size == 151_643
    assert tok.eos_token_ids == (151_645, 151_643)
    assert tok.token_to_id("<|im_end|>") == 151_645
    ids = tok.encode("Hello world")
    assert ids == [9707, 1879]  # no special tokens added
    assert tok.decode(ids) == "Hello world"
    assert tok.decode([*ids, 151_645]) == "Hello world<|im_end|>"
    assert tok.decode([*ids, 151_645], skip_special_tokens=True) == "Hello world"
    assert tok.encode("<|im_start|>user\nhi<|im_end|>")[0] == tok.token_to_id("<|im_start|>")
    assert tok.encode_batch(["Hello world", "hi"]) == [ids, tok.encode("hi")]


def test_chat_template_thinking_on(tok: QwenTokenizer) -> None:
    text = tok.apply_chat_template(TWO_TURNS, enable_thinking=True)
    # The earlier assistant turn loses its <think> reasoning; no empty think block is added.
    assert text == TWO_TURNS_HISTORY
    assert "Add two and two" not in text


def test_chat_template_thinking_off(tok: QwenTokenizer) -> None:
    text = tok.apply_chat_template(TWO_TURNS, enable_thinking=False)
    assert text == TWO_TURNS_HISTORY + "<think>\n\n</think>\n\n"
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_chat_template_no_generation_prompt_and_last_reasoning(tok: QwenTokenizer) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "reasoning_content": "Greet back."},
    ]
    text = tok.apply_chat_template(messages, add_generation_prompt=False, enable_thinking=False)
    # The assistant turn after the last user query keeps its reasoning.
    assert text == (
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nGreet back.\n</think>\n\nhello<|im_end|>\n"
    )
    with pytest.raises(ValueError):
        tok.apply_chat_template([])


def test_chat_template_tools(tok: QwenTokenizer) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    text = tok.apply_chat_template([{"role": "user", "content": "weather?"}], tools=[tool])
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert json.dumps(tool) in text


def test_count_chat_tokens(tok: QwenTokenizer) -> None:
    text = tok.apply_chat_template(TWO_TURNS, enable_thinking=False)
    n = tok.count_chat_tokens(TWO_TURNS, enable_thinking=False)
    assert n == len(tok.encode(text))
    # The empty think block costs 4 tokens: <think>, "\n\n", </think>, "\n\n".
    assert n - tok.count_chat_tokens(TWO_TURNS) == 4


def test_template_matches_transformers(tok: QwenTokenizer) -> None:
    """Cross-check against transformers when it happens to be installed (not a dependency)."""
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    conversations = [
        TWO_TURNS,
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo", "thinking": "t"},
        ],
        [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "f", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": "sunny"},
        ],
    ]
    for messages in conversations:
        for thinking in (True, False):
            for tools in (None, [tool]):
                expected = ref.apply_chat_template(
                    messages,
                    tokenize=False,
                    add_generation_prompt=True,
                    enable_thinking=thinking,
                    tools=tools,
                )
                got = tok.apply_chat_template(messages, enable_thinking=thinking, tools=tools)
                assert got == expected
                assert tok.encode(got) == ref.encode(got, add_special_tokens=False)


# -- exact-token texts ------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 10, 77, 512, 4096])
def test_text_of_exact_tokens(tok: QwenTokenizer, n: int) -> None:
    for seed in (0, 1, 2):
        text = text_of_exact_tokens(tok, n, seed)
        assert len(tok.encode(text)) == n
        assert text == text_of_exact_tokens(tok, n, seed)  # deterministic
        assert text.replace(".", "").replace(" ", "").isalpha()
    if n > 3:
        assert text_of_exact_tokens(tok, n, 0) != text_of_exact_tokens(tok, n, 1)


def test_text_of_exact_tokens_prefix_and_errors(tok: QwenTokenizer) -> None:
    for prefix in ("Question:", "Hello world ", "Line\n", "id-42"):
        for n in (len(tok.encode(prefix)), 20, 300):
            text = text_of_exact_tokens(tok, n, 7, prefix=prefix)
            assert text.startswith(prefix)
            assert len(tok.encode(text)) == n
    with pytest.raises(ValueError):
        text_of_exact_tokens(tok, 0, 0)
    with pytest.raises(ValueError):
        text_of_exact_tokens(tok, 2, 0, prefix="a much longer prefix than two tokens")


def test_exact_text_is_exact_inside_chat_template(tok: QwenTokenizer) -> None:
    base = tok.count_chat_tokens([{"role": "user", "content": ""}])
    for n in (1, 5, 100):
        text = text_of_exact_tokens(tok, n, 3)
        assert tok.count_chat_tokens([{"role": "user", "content": text}]) == base + n


@pytest.mark.parametrize("n", [6, 7, 64, 1000, 8192])
def test_system_prompt_of_exact_tokens(tok: QwenTokenizer, n: int) -> None:
    content = system_prompt_of_exact_tokens(tok, n, seed=5)
    block = f"<|im_start|>system\n{content}<|im_end|>\n"
    assert len(tok.encode(block)) == n
    for user in ("", "Hi.", "What is the capital of France?"):
        u = {"role": "user", "content": user}
        with_system = tok.count_chat_tokens([{"role": "system", "content": content}, u])
        assert with_system - tok.count_chat_tokens([u]) == n
        rendered = tok.apply_chat_template([{"role": "system", "content": content}, u])
        assert rendered.startswith(block)


def test_system_prompt_too_small(tok: QwenTokenizer) -> None:
    assert system_block_overhead(tok) == 5
    for n in (-1, 0, 1, 5):
        with pytest.raises(ValueError, match="too small"):
            system_prompt_of_exact_tokens(tok, n, seed=0)


# -- ShareGPT ---------------------------------------------------------------------------------


def test_sharegpt_recovers_truncated_file() -> None:
    conversations = load_sharegpt_conversations()
    assert len(conversations) > 17_000
    assert all(isinstance(turn.get("value"), str) for turn in conversations[0])
    assert load_sharegpt_conversations(limit=10) == conversations[:10]


def test_sharegpt_length_pairs_filters(tok: QwenTokenizer) -> None:
    pairs = sharegpt_length_pairs(tok, limit=500)
    assert 300 < len(pairs) <= 500
    for p, o in pairs:
        assert SHAREGPT_MIN_LEN <= p <= SHAREGPT_MAX_PROMPT_LEN
        assert o >= SHAREGPT_MIN_LEN
        assert p + o <= SHAREGPT_MAX_TOTAL_LEN
    # The first pair is the first conversation's first two turns, counted with the tokenizer.
    first = load_sharegpt_conversations(limit=1)[0]
    expected = (len(tok.encode(first[0]["value"])), len(tok.encode(first[1]["value"])))
    assert pairs[0] == expected
    tight = sharegpt_length_pairs(tok, limit=500, max_prompt_len=64, max_total_len=256)
    assert tight and all(p <= 64 and p + o <= 256 for p, o in tight)
    assert len(tight) < len(pairs)


def _write_sharegpt(path: Path, *, truncate: bool = False) -> None:
    entries = [
        {"id": "a", "conversations": [
            {"from": "human", "value": "Tell me a short story about a brave little cat."},
            {"from": "gpt", "value": "Once upon a time a small cat climbed the tallest tree."},
        ]},
        {"id": "b", "conversations": [{"from": "human", "value": "only one turn here"}]},
        {"id": "c", "conversations": [
            {"from": "gpt", "value": "A reply that starts the split piece of a chat."},
            {"from": "human", "value": "Then a question from the human follows it here."},
            {"from": "gpt", "value": "And the answer to that question comes last."},
        ]},
        {"id": "d", "conversations": [
            {"from": "human", "value": "hi"},
            {"from": "gpt", "value": "Hello! How can I help you today, my friend?"},
        ]},
    ]  # fmt: skip
    text = json.dumps(entries, indent=2)
    if truncate:
        text = text[: text.rindex('"id": "d"') + 20]
    path.write_text(text, encoding="utf-8")


def test_sharegpt_user_file_and_truncation(tmp_path: Path, tok: QwenTokenizer) -> None:
    whole, cut = tmp_path / "whole.json", tmp_path / "cut.json"
    _write_sharegpt(whole)
    _write_sharegpt(cut, truncate=True)
    assert len(load_sharegpt_conversations(whole)) == 4
    assert len(load_sharegpt_conversations(cut)) == 3  # the cut-short last object is dropped
    pairs = sharegpt_length_pairs(tok, whole)
    # a: kept; b: one turn; c: vLLM takes turns 0 and 1 whatever their roles; d: "hi" < 4 tokens.
    assert len(pairs) == 2
    human = sharegpt_length_pairs(tok, whole, human_first=True)
    assert len(human) == 2 and human[0] == pairs[0] and human[1] != pairs[1]
    assert load_length_file(whole, tok) == pairs
    bad = tmp_path / "bad.json"
    bad.write_text('{"conversations": []}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.json"):
        load_sharegpt_conversations(bad)


def test_cached_sharegpt_length_pairs(tmp_path: Path, tok: QwenTokenizer) -> None:
    data = tmp_path / "sg.json"
    _write_sharegpt(data)
    cache = tmp_path / "cache"
    first = cached_sharegpt_length_pairs(cache, tok, data)
    assert first == sharegpt_length_pairs(tok, data)
    files = list(cache.glob("*.json"))
    assert len(files) == 1
    stored = json.loads(files[0].read_text())
    stored["pairs"] = [[11, 22]]  # prove the second call reads the cache
    files[0].write_text(json.dumps(stored))
    assert cached_sharegpt_length_pairs(cache, tok, data) == [(11, 22)]
    # A changed file (size and mtime) misses the cache.
    data.write_text(data.read_text() + "\n")
    assert cached_sharegpt_length_pairs(cache, tok, data) == first
    assert len(list(cache.glob("*.json"))) == 2


# -- length files -----------------------------------------------------------------------------


def test_load_length_file_jsonl(tmp_path: Path) -> None:
    f = tmp_path / "lens.jsonl"
    f.write_text(
        '{"input_len": 100, "output_len": 20}\n\n{"input_len": 5, "output_len": 1, "x": 0}\n'
    )
    assert load_length_file(f) == [(100, 20), (5, 1)]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"input_len": 100', r"line 2: bad JSON"),
        ('{"input_len": 100}', r"line 2: missing key\(s\) output_len"),
        ('{"output_len": 1}', r"line 2: missing key\(s\) input_len"),
        ('{"input_len": 0, "output_len": 5}', r"line 2: input_len must be a positive integer"),
        ('{"input_len": 3, "output_len": -1}', r"line 2: output_len must be a positive integer"),
        ('{"input_len": 3.5, "output_len": 4}', r"line 2: input_len must be a positive integer"),
        ('{"input_len": true, "output_len": 4}', r"line 2: input_len must be a positive integer"),
        ("[1, 2]", r"line 2: expected a JSON object"),
    ],
)
def test_load_length_file_errors(tmp_path: Path, line: str, message: str) -> None:
    f = tmp_path / "lens.jsonl"
    f.write_text('{"input_len": 10, "output_len": 20}\n' + line + "\n")
    with pytest.raises(ValueError, match=message) as err:
        load_length_file(f)
    assert str(f) in str(err.value)


def test_load_length_file_empty(tmp_path: Path) -> None:
    f = tmp_path / "empty.jsonl"
    f.write_text("\n")
    with pytest.raises(ValueError, match="no rows"):
        load_length_file(f)


# -- GSM8K ------------------------------------------------------------------------------------


def test_gsm8k_test_split() -> None:
    rows = load_gsm8k(GSM8K_TEST)
    assert len(rows) == 1319
    answers = [gsm8k_answer(r["answer"]) for r in rows]
    assert all(a is not None for a in answers)
    assert answers[0] == "18"
    assert all(a is not None and a.lstrip("-").replace(".", "").isdigit() for a in answers)


def test_gsm8k_answer_and_model_answer() -> None:
    assert gsm8k_answer("She makes 9 * 2 = $18.\n#### 18") == "18"
    assert gsm8k_answer("#### 1,000") == "1000"
    assert gsm8k_answer("#### -3") == "-3"
    assert gsm8k_answer("no marker 42") is None
    assert extract_model_answer("So 3 + 4 = 7, and the total is $1,234.") == "1234"
    assert extract_model_answer("The answer is 18.00") == "18"
    assert extract_model_answer("It is 2.5 hours") == "2.5"
    assert extract_model_answer("<think>\n5 + 5</think>\n\nThe answer is -10.") == "-10"
    assert extract_model_answer("no digits") is None
