"""Prompts of an exact, checked token count: text of real vocabulary words
(:func:`text_of_exact_tokens`) and system prompts whose system block costs exactly n tokens
through Qwen3's chat template (:func:`system_prompt_of_exact_tokens`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from chatfleet.data.tokenizer import QwenTokenizer

__all__ = ["system_block_overhead", "system_prompt_of_exact_tokens", "text_of_exact_tokens"]


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
