"""Accuracy of a precision choice: datasets, per-question scoring and the paired statistics.

Pure: no files, sockets or clocks. Shells read the dataset file and pass its lines in, pass the
number extractor (``chatfleet.check.gsm8k.extract_model_answer``) and a ``random.Random`` for the
question sample. Formulas (docs/accuracy.md states them too), with z = 1.959963984540054, the
0.975 quantile of the standard normal:

* Wilson score interval for k correct of n (Wilson 1927)::

      centre = (k + z^2/2) / (n + z^2),  half = z / (n + z^2) * sqrt(k (n - k) / n + z^2 / 4)

  clipped to [0, 1]; it never collapses to a point at k = 0 or k = n.
* Exact McNemar test (two-sided, conditional on the discordant pairs): with b questions only A
  answered correctly and c only B, under "no difference" b ~ Binomial(b + c, 1/2), so
  p = min(1, 2 * sum_{i <= min(b, c)} C(b + c, i) / 2^(b + c)), and p = 1 when b + c = 0. It is
  computed with exact integers (the same as ``scipy.stats.binomtest(b, b + c).pvalue``).
* Confidence interval of the paired difference d = acc_B - acc_A: Newcombe's square-and-add
  interval for paired proportions (Newcombe 1998, Statistics in Medicine 17:2635, method 10).
  With Wilson intervals (l_A, u_A), (l_B, u_B) and the table (both, a_only, b_only, neither)::

      L = d - sqrt((p_B - l_B)^2 + (u_A - p_A)^2 - 2 phi (p_B - l_B)(u_A - p_A))
      U = d + sqrt((u_B - p_B)^2 + (p_A - l_A)^2 - 2 phi (u_B - p_B)(p_A - l_A))

  where phi is the correlation of the two outcomes with Newcombe's continuity correction:
  A = both * neither - a_only * b_only; phi = (A - n/2) / sqrt(r1 r2 c1 c2) when A > n/2,
  0 when 0 <= A <= n/2, A / sqrt(r1 r2 c1 c2) when A < 0, and 0 when a margin is empty
  (r1, r2 = A's correct and wrong counts, c1, c2 = B's).
* Non-inferiority of B against A within a margin m: ``within_margin`` is true when L >= -m.
  McNemar's p answers "is there a difference?"; a large p does not show the targets equal, the
  interval and the margin do.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from statistics import NormalDist
from typing import Any, Literal

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.jsonl import json_objects

__all__ = [
    "DIFF_METHOD",
    "GSM8K_SUFFIX",
    "MCNEMAR_METHOD",
    "Z95",
    "AccuracyError",
    "Dataset",
    "Item",
    "PairedTable",
    "Score",
    "compare",
    "final_answer_span",
    "gsm8k_prompt",
    "mcnemar_exact_p",
    "normalize_text",
    "paired_diff_ci",
    "parse_dataset_lines",
    "parse_number",
    "score_answer",
    "select_indices",
    "summarize_target",
    "wilson_interval",
]

Z95 = NormalDist().inv_cdf(0.975)
DIFF_METHOD = "newcombe-square-and-add (Newcombe 1998 method 10, Wilson score, corrected phi)"
MCNEMAR_METHOD = "exact conditional (two-sided binomial on the discordant pairs)"

GSM8K_SUFFIX = ('\n\nSolve the problem step by step, then give the final answer on the last line '
                'as "The answer is N." where N is a number.')
"""What the accuracy client appends to each GSM8K question (a prompts file is sent verbatim)."""


class AccuracyError(ChatfleetError):
    """Bad dataset or bad input to the statistics."""


# --------------------------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Item:
    """One question: ``index`` in the file (0-based, blank lines not counted), ``question`` the
    text an oracle matches, ``prompt`` what the client sends, ``expected`` the normalised answer."""

    index: int
    question: str
    prompt: str
    expected: str


@dataclass(frozen=True, slots=True)
class Dataset:
    kind: Literal["gsm8k", "prompts"]
    source: str
    items: tuple[Item, ...]

    def by_question(self) -> dict[str, Item]:
        """Question text to item (the first one where a question repeats)."""
        out: dict[str, Item] = {}
        for it in self.items:
            out.setdefault(it.question, it)
        return out


def gsm8k_prompt(question: str) -> str:
    return question + GSM8K_SUFFIX


def parse_dataset_lines(lines: Iterable[str], source: str,
                        gsm8k_key: Callable[[str], str | None]) -> Dataset:
    """Parse a JSON Lines dataset.

    Two shapes, told apart by the first row: GSM8K rows ``{"question": str, "answer": str}``
    whose answer ends with ``#### N`` (``gsm8k_key`` reads N, as ``check.gsm8k.gsm8k_answer``),
    or a prompts file with ``{"prompt": str, "answer": str | number}`` per line. Blank lines are
    skipped; other keys are ignored. Every row must have the shape of the first.
    """
    items: list[Item] = []
    kind: Literal["gsm8k", "prompts"] | None = None
    for where, row in json_objects(lines, source, AccuracyError):
        if kind is None:
            kind = "gsm8k" if "question" in row and "prompt" not in row else "prompts"
        if kind == "gsm8k":
            q, a = row.get("question"), row.get("answer")
            if not isinstance(q, str) or not isinstance(a, str):
                raise AccuracyError(f"{where}: a GSM8K row needs string 'question' and 'answer'")
            key = gsm8k_key(a)
            if key is None:
                raise AccuracyError(f"{where}: the answer has no '#### N' final answer")
            items.append(Item(len(items), q, gsm8k_prompt(q), key))
        else:
            p, a = row.get("prompt"), row.get("answer")
            if not isinstance(p, str) or not p.strip():
                raise AccuracyError(f"{where}: needs a non-empty string 'prompt' (a prompts file "
                                    "has {\"prompt\": ..., \"answer\": ...} per line)")
            if isinstance(a, bool) or not isinstance(a, str | int | float) or str(a).strip() == "":
                raise AccuracyError(f"{where}: needs an 'answer' (a string or a number)")
            items.append(Item(len(items), p, p, _expected(a)))
    if not items:
        raise AccuracyError(f"{source}: no questions")
    assert kind is not None
    return Dataset(kind, source, tuple(items))


def _expected(answer: str | int | float) -> str:
    if isinstance(answer, int | float):
        return _number_text(Decimal(str(answer)))
    num = parse_number(answer)
    return _number_text(num) if num is not None else answer.strip()


def select_indices(total: int, n: int | None, rng: random.Random) -> list[int]:
    """Which questions to ask: all of them (n None or >= total), else a sorted sample of n."""
    if n is not None and n < 1:
        raise AccuracyError("n must be at least 1")
    if n is None or n >= total:
        return list(range(total))
    return sorted(rng.sample(range(total), n))


# --------------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------------

_NUMBER_FULL = re.compile(r"-?\d+(?:\.\d+)?")
_MARKER = re.compile(r"the\s+final\s+answer\s+is|the\s+answer\s+is|final\s+answer\s*:|####|"
                     r"\\boxed\{", re.IGNORECASE)
_CLAUSE_BREAK = re.compile(r"[,;.]\s")


def parse_number(text: str) -> Decimal | None:
    """A whole string that is a number (commas, a leading $ and a trailing . ignored)."""
    s = text.strip().replace(",", "").removeprefix("$").rstrip(".").strip()
    if not _NUMBER_FULL.fullmatch(s):
        return None
    try:
        return Decimal(s)
    except InvalidOperation:  # pragma: no cover (the pattern admits only valid decimals)
        return None


def _number_text(d: Decimal) -> str:
    """18, 18.0 and 18.00 read "18"; 2.50 reads "2.5"."""
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def final_answer_span(text: str) -> str | None:
    """The answer the output states after its last marker ("The answer is", "Final answer:",
    "####", "\\boxed{"): the first non-empty line after it, up to the first clause break (", ",
    "; " or ". "; a box ends at its "}"), or None when the output has no marker."""
    last = None
    for m in _MARKER.finditer(text):
        last = m
    if last is None:
        return None
    tail = text[last.end():]
    if last.group(0).startswith("\\boxed"):
        tail = tail.split("}", 1)[0]
    tail = tail.lstrip(" \t\r\n:=*")
    return _CLAUSE_BREAK.split(tail.split("\n", 1)[0], maxsplit=1)[0]


_PUNCT = " \t\r\n.,;:!?\"'`*()[]{}"


def normalize_text(text: str) -> str:
    """Case-folded, whitespace collapsed, surrounding punctuation and quotes removed."""
    return " ".join(text.casefold().split()).strip(_PUNCT)


@dataclass(frozen=True, slots=True)
class Score:
    correct: bool
    extracted: str | None


def score_answer(expected: str, output: str | None,
                 extract: Callable[[str], str | None]) -> Score:
    """Is ``output`` right? A numeric ``expected`` is compared numerically with the number the
    output states after its last answer marker, else (no marker, or no number after it) with the
    last number of the whole output (``extract``: ``check.gsm8k.extract_model_answer``). Any other
    answer is an exact match after :func:`normalize_text` against the text after the last
    marker, else the output's last non-empty line."""
    if output is None or not output.strip():
        return Score(False, None)
    span = final_answer_span(output)
    want = parse_number(expected)
    if want is not None:
        got = extract(span) if span is not None else None
        if got is None:
            got = extract(output)
        if got is None:
            return Score(False, None)
        num = parse_number(got)
        return Score(num is not None and num == want, got)
    if span is None:
        lines = [ln for ln in output.splitlines() if ln.strip()]
        span = lines[-1] if lines else ""
    got = normalize_text(span)
    return Score(got == normalize_text(expected), got)


# --------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------


def wilson_interval(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of ``correct`` successes in ``n`` trials."""
    if n < 1:
        raise AccuracyError("the Wilson interval needs n >= 1")
    if not 0 <= correct <= n:
        raise AccuracyError(f"correct must lie in 0..{n}, got {correct}")
    z2 = z * z
    denom = n + z2
    centre = (correct + z2 / 2) / denom
    half = z / denom * math.sqrt(correct * (n - correct) / n + z2 / 4)
    lo = 0.0 if correct == 0 else max(0.0, centre - half)
    hi = 1.0 if correct == n else min(1.0, centre + half)
    return lo, hi


def mcnemar_exact_p(a_only: int, b_only: int) -> float:
    """Two-sided exact McNemar p from the discordant counts (see the module docstring)."""
    if a_only < 0 or b_only < 0:
        raise AccuracyError("discordant counts must be non-negative")
    m = a_only + b_only
    if m == 0:
        return 1.0
    k = min(a_only, b_only)
    tail = sum(math.comb(m, i) for i in range(k + 1))
    return float(min(Fraction(1), Fraction(2 * tail, 2**m)))


@dataclass(frozen=True, slots=True)
class PairedTable:
    """The paired 2x2 table of targets A and B over the same questions."""

    both: int
    a_only: int  # A right, B wrong
    b_only: int  # A wrong, B right
    neither: int

    @property
    def n(self) -> int:
        return self.both + self.a_only + self.b_only + self.neither

    @classmethod
    def from_outcomes(cls, a: Sequence[bool], b: Sequence[bool]) -> PairedTable:
        if len(a) != len(b):
            raise AccuracyError("paired outcomes must cover the same questions")
        both = sum(1 for x, y in zip(a, b, strict=True) if x and y)
        a_only = sum(1 for x, y in zip(a, b, strict=True) if x and not y)
        b_only = sum(1 for x, y in zip(a, b, strict=True) if y and not x)
        return cls(both, a_only, b_only, len(a) - both - a_only - b_only)


def paired_diff_ci(t: PairedTable, z: float = Z95) -> tuple[float, float]:
    """Newcombe's square-and-add interval for acc_B - acc_A (see the module docstring)."""
    n = t.n
    if n < 1:
        raise AccuracyError("the paired interval needs at least one question")
    ka, kb = t.both + t.a_only, t.both + t.b_only
    pa, pb = ka / n, kb / n
    la, ua = wilson_interval(ka, n, z)
    lb, ub = wilson_interval(kb, n, z)
    margins = (ka, n - ka, kb, n - kb)
    phi = 0.0
    if all(margins):
        cross = t.both * t.neither - t.a_only * t.b_only
        root = math.sqrt(math.prod(float(x) for x in margins))
        if cross > n / 2:
            phi = (cross - n / 2) / root
        elif cross < 0:
            phi = cross / root
    d = pb - pa
    dl = math.sqrt(max(0.0, (pb - lb) ** 2 + (ua - pa) ** 2 - 2 * phi * (pb - lb) * (ua - pa)))
    du = math.sqrt(max(0.0, (ub - pb) ** 2 + (pa - la) ** 2 - 2 * phi * (ub - pb) * (pa - la)))
    return max(-1.0, d - dl), min(1.0, d + du)


def summarize_target(outcomes: Sequence[bool], failed: int, z: float = Z95) -> dict[str, Any]:
    """``accuracy``, ``ci95``, ``n``, ``correct`` and ``failed`` of one target (a failed request
    counts as a wrong answer: it stays in n)."""
    n = len(outcomes)
    k = sum(1 for x in outcomes if x)
    lo, hi = wilson_interval(k, n, z)
    return {"accuracy": k / n, "ci95": [lo, hi], "n": n, "correct": k, "failed": failed}


def compare(a: str, a_outcomes: Sequence[bool], b: str, b_outcomes: Sequence[bool],
            margin: float, z: float = Z95) -> dict[str, Any]:
    """The paired comparison of B against A (the reference): the table, McNemar's p, the
    difference acc_B - acc_A with its interval, and non-inferiority within ``margin``."""
    t = PairedTable.from_outcomes(a_outcomes, b_outcomes)
    lo, hi = paired_diff_ci(t, z)
    n = t.n
    return {
        "a": a, "b": b, "n": n,
        "both": t.both, "a_only": t.a_only, "b_only": t.b_only, "neither": t.neither,
        "mcnemar_p": mcnemar_exact_p(t.a_only, t.b_only), "mcnemar_method": MCNEMAR_METHOD,
        "diff": (t.b_only - t.a_only) / n, "diff_ci95": [lo, hi], "diff_method": DIFF_METHOD,
        "margin": margin, "within_margin": lo >= -margin,
    }
