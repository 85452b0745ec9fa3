"""A user's file of (input, output) lengths: JSON Lines, or a ShareGPT-shaped array."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.jsonl import json_objects
from chatfleet.data.sharegpt import sharegpt_length_pairs
from chatfleet.data.tokenizer import QwenTokenizer

__all__ = ["load_length_file"]

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
