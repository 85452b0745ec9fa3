"""What the simserver answers: real vocabulary tokens, a documented length, Qwen3's thinking.

Output length:
- with `ignore_eos`, exactly max_tokens (finish_reason "length");
- otherwise a seeded draw from a log-normal with median `median_tokens` (200) and sigma 0.8,
  at least min_tokens, at most max_tokens (finish_reason "stop" below max_tokens, "length" at
  it). `stop` strings end the answer where they first occur (the stop text is not returned).

Tokens: each answer token is a common English word that is one token with its leading space
(" word"), so the answer's text tokenizes back to exactly the ids it was made of and a later
turn that carries it finds it in the prefix cache.

Thinking (Qwen3, chat only, `enable_thinking` true by default): the answer starts with
`<think>`, "\\n", then reasoning words, `</think>`, "\\n\\n", then content words; the reasoning
share of the words is `reasoning_share` (0.5). Streamed as SGLang's qwen3 reasoning parser
does: the tokens up to `</think>\\n\\n` as `reasoning_content` (tags stripped), the rest as
`content`. Every token is its own chunk, even when its visible text is empty (a tag).
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from array import array
from dataclasses import dataclass

from chatfleet.data.tokenizer import QwenTokenizer

THINK_OPEN = 151667
THINK_CLOSE = 151668
NEWLINE = 198
DOUBLE_NEWLINE = 271


@dataclass(slots=True)
class Answer:
    ids: array[int]
    pieces: list[str]  # decoded text of each token
    reasoning_tokens: int  # tokens streamed as reasoning_content (tags included)
    finish_reason: str


class AnswerMaker:
    def __init__(self, tok: QwenTokenizer, median_tokens: float = 200.0, sigma: float = 0.8,
                 reasoning_share: float = 0.5) -> None:
        self.tok = tok
        self.median_tokens = median_tokens
        self.sigma = sigma
        self.reasoning_share = reasoning_share
        words = tok.filler_words
        self.word_ids = [tok.encode(" " + w)[0] for w in words]
        self.word_text = {i: " " + w for i, w in zip(self.word_ids, words, strict=True)}
        self.special_text = {THINK_OPEN: "", THINK_CLOSE: "", NEWLINE: "", DOUBLE_NEWLINE: ""}

    def length(self, rng: random.Random, max_tokens: int, min_tokens: int,
               ignore_eos: bool) -> tuple[int, str]:
        if ignore_eos:
            return max_tokens, "length"
        n = round(math.exp(math.log(self.median_tokens) + self.sigma * rng.gauss(0, 1)))
        n = max(1, min_tokens, n)
        if n >= max_tokens:
            return max_tokens, "length"
        return n, "stop"

    def make(self, rng: random.Random, *, max_tokens: int, min_tokens: int = 0,
             ignore_eos: bool = False, thinking: bool = False,
             stop: list[str] | None = None) -> Answer:
        n, reason = self.length(rng, max_tokens, min_tokens, ignore_eos)
        ids: list[int] = []
        reasoning = 0
        if thinking and n >= 6:
            words = n - 4
            r = max(1, int(words * self.reasoning_share))
            ids = [THINK_OPEN, NEWLINE]
            ids += [self.word_ids[rng.randrange(len(self.word_ids))] for _ in range(r)]
            ids += [THINK_CLOSE, DOUBLE_NEWLINE]
            reasoning = len(ids)
            ids += [self.word_ids[rng.randrange(len(self.word_ids))] for _ in range(words - r)]
        else:
            ids = [self.word_ids[rng.randrange(len(self.word_ids))] for _ in range(n)]
        pieces = [self.word_text.get(i, self.special_text.get(i, "")) for i in ids]
        if stop:
            ids, pieces, reasoning, reason = _apply_stop(ids, pieces, reasoning, reason, stop,
                                                         min_tokens)
        return Answer(array("q", ids), pieces, reasoning, reason)


def _apply_stop(ids: list[int], pieces: list[str], reasoning: int, reason: str,
                stop: list[str], min_tokens: int) -> tuple[list[int], list[str], int, str]:
    """Cut the answer at the first stop string in its content (not before min_tokens): the
    answer ends with the token that completes the stop string, whose text is not returned.
    One pass: the content is joined once and each stop string searched once."""
    content = pieces[reasoning:]
    text = "".join(content)
    ends = list(itertools.accumulate(len(p) for p in content))  # text end of each token
    floor_tok = max(1, min_tokens) - 1 - reasoning  # the first content token allowed to end
    best: tuple[int, int] | None = None  # (token index in content, characters kept)
    for s_ in stop:
        if not s_:
            continue
        start = 0
        while True:
            at = text.find(s_, start)
            if at < 0:
                break
            k = bisect.bisect_left(ends, at + len(s_))  # the token completing the match
            if k >= floor_tok:
                if best is None or k < best[0] or (k == best[0] and at < best[1]):
                    best = (k, at)
                break
            start = at + 1
    if best is None:
        return ids, pieces, reasoning, reason
    k, keep = best
    cut: list[str] = list(pieces[:reasoning])
    done = 0
    for j in range(k + 1):
        cut.append(content[j][: max(0, keep - done)])
        done += len(content[j])
    return ids[: reasoning + k + 1], cut, reasoning, "stop"
