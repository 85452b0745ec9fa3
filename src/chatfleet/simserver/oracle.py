"""Oracle mode: the simserver answers a dataset's questions right with a set probability.

`chatfleet simserver --oracle-dataset PATH --oracle-accuracy p [--seed S]` loads a GSM8K file or
a prompts file (the shapes `chatfleet accuracy` reads, see docs/accuracy.md). A chat request
whose last user message is a question of that file, exactly, or the question followed by the
GSM8K instruction `chatfleet accuracy` appends (`core.accuracy.GSM8K_SUFFIX`), or any text that
contains the question verbatim, gets a short answer that ends with "The answer is N.".

The draw, per question (index i in the file, 0-based, blank lines not counted)::

    rng = random.Random(f"{seed}:{i}")
    correct = rng.random() < p
    N = expected                    if correct
        expected + rng.randint(1, 9)  otherwise (a number; "not <expected>" for a text answer)

so it is the same for every replica of one server and on every request, and two oracles with
different seeds draw independently. The score a target gets over a set of questions is exactly
the fraction of those draws that came out correct. `/v1/completions` prompts are matched the
same way (the prompt text contains the question). Other requests get the usual filler answer.

Timing follows the engine model: the answer is a few tokens (about 20), with a short reasoning
part when thinking is on; `max_tokens` cuts it ("length"), `min_tokens` and `ignore_eos` pad it
with filler words before the final sentence.
"""

from __future__ import annotations

import random
from array import array
from decimal import Decimal
from pathlib import Path

from chatfleet.check.gsm8k import gsm8k_answer
from chatfleet.core.accuracy import (
    GSM8K_SUFFIX,
    Dataset,
    Item,
    parse_dataset_lines,
    parse_number,
)
from chatfleet.core.errors import ChatfleetError
from chatfleet.data.tokenizer import QwenTokenizer
from chatfleet.simserver.generation import (
    DOUBLE_NEWLINE,
    NEWLINE,
    THINK_CLOSE,
    THINK_OPEN,
    Answer,
    AnswerMaker,
    _apply_stop,
)

REASONING_TEXT = "Let me work through the problem step by step."
WORKING_TEXT = "Working through the problem step by step."


def oracle_draw(seed: int, index: int, p: float, expected: str) -> tuple[bool, str]:
    """The documented draw: (correct, the answer the oracle states)."""
    rng = random.Random(f"{seed}:{index}")
    correct = rng.random() < p
    if correct:
        return True, expected
    num = parse_number(expected)
    if num is None:
        return False, f"not {expected}"
    wrong = num + Decimal(rng.randint(1, 9))
    return False, str(int(wrong)) if wrong == wrong.to_integral_value() else format(wrong, "f")


class Oracle:
    def __init__(self, dataset: Dataset, accuracy: float, seed: int) -> None:
        if not 0.0 <= accuracy <= 1.0:
            raise ChatfleetError(f"--oracle-accuracy must lie in [0, 1], got {accuracy}")
        self.dataset = dataset
        self.accuracy = accuracy
        self.seed = seed
        self._index = dataset.by_question()
        # longest first, so that a question that contains a shorter one wins the substring scan
        self._by_length = sorted(self._index.values(), key=lambda it: -len(it.question))

    @classmethod
    def load(cls, path: str | Path, accuracy: float, seed: int) -> Oracle:
        file = Path(path)
        with file.open(encoding="utf-8") as f:
            ds = parse_dataset_lines(f, str(file), gsm8k_answer)
        return cls(ds, accuracy, seed)

    def match(self, text: str) -> Item | None:
        """The question a request's text asks, if any (see the module docstring)."""
        hit = self._index.get(text) or self._index.get(text.strip())
        if hit is None and text.endswith(GSM8K_SUFFIX):
            hit = self._index.get(text[: -len(GSM8K_SUFFIX)])
        if hit is None:
            hit = next((it for it in self._by_length if it.question in text), None)
        return hit

    def answer_text(self, item: Item) -> tuple[bool, str]:
        correct, stated = oracle_draw(self.seed, item.index, self.accuracy, item.expected)
        return correct, f"{WORKING_TEXT} The answer is {stated}."

    def make(self, item: Item, tok: QwenTokenizer, filler: AnswerMaker, rng: random.Random, *,
             max_tokens: int, min_tokens: int = 0, ignore_eos: bool = False,
             thinking: bool = False, stop: list[str] | None = None) -> Answer:
        _, text = self.answer_text(item)
        head: list[int] = []
        reasoning = 0
        if thinking:
            head = [THINK_OPEN, NEWLINE, *tok.encode(REASONING_TEXT), THINK_CLOSE, DOUBLE_NEWLINE]
            reasoning = len(head)
        work, final = text.split(" The answer is ", 1)
        body = tok.encode(work)
        tail = tok.encode(" The answer is " + final)
        want = max_tokens if ignore_eos else max(min_tokens, 0)
        pad = max(0, want - len(head) - len(body) - len(tail))
        words = [filler.word_ids[rng.randrange(len(filler.word_ids))] for _ in range(pad)]
        ids = head + body + words + tail
        reason = "stop"
        if len(ids) >= max_tokens:
            ids = ids[:max_tokens]
            reason = "length"
            reasoning = min(reasoning, len(ids))
        special = {THINK_OPEN: "", THINK_CLOSE: "", NEWLINE: "", DOUBLE_NEWLINE: ""}
        pieces = [special[i] if i in special else tok.decode([i]) for i in ids]
        if stop:
            ids, pieces, reasoning, reason = _apply_stop(ids, pieces, reasoning, reason, stop,
                                                         min_tokens)
        return Answer(array("q", ids), pieces, reasoning, reason)
