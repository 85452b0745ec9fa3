"""GSM8K: the rows of a JSON Lines file, the final answer of an answer key, and the number a
model's output ends with. The test split ships with chatfleet
(:func:`chatfleet.data.paths.gsm8k_test_path`, MIT licence, notice beside it).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.jsonl import json_objects

__all__ = ["extract_model_answer", "gsm8k_answer", "load_gsm8k"]

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
