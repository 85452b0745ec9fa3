"""Reading and writing the traffic trace format (core/traffic/trace.py, docs/traffic.md): JSON
Lines, one turn a line. A bad line is refused with the file and its line number."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

from chatfleet.core.traffic.columns import Trace
from chatfleet.core.traffic.trace import Tokenize, TraceError, TraceRow, parse_row, row_to_json
from chatfleet.data.tokenizer import load_qwen_tokenizer
from chatfleet.io import write_atomic

__all__ = ["json_lines", "read_trace", "trace_rows", "write_trace"]


def json_lines(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, where, object) for each non-blank line of a JSON Lines file; a line
    that is not a JSON object raises TraceError naming the file and the line."""
    if path.is_dir():
        raise TraceError(f"{path} is a folder: give the path of a file")
    try:
        f = path.open("rb")
    except FileNotFoundError:
        raise TraceError(f"{path}: file not found") from None
    except OSError as exc:
        raise TraceError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    with f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}, line {lineno}"
            try:
                row = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise TraceError(f"{where}: bad JSON ({exc})") from None
            if not isinstance(row, dict):
                text = line.decode("utf-8", "replace").strip()[:60]
                raise TraceError(f"{where}: expected a JSON object, got {text!r}")
            yield lineno, where, row


def trace_rows(path: Path, context_tokens: int | None = None
               ) -> Iterator[tuple[int, TraceRow]]:
    """The file's rows, each checked (core/traffic/trace.parse_row), with its line number.
    `text` prompts are tokenized with the Qwen3 tokenizer (loaded at the first one)."""
    tokenizer: list[Tokenize] = []

    def tokenize(text: str) -> list[int]:
        if not tokenizer:
            tokenizer.append(load_qwen_tokenizer().encode)
        return tokenizer[0](text)

    for lineno, where, rec in json_lines(path):
        yield lineno, parse_row(rec, where, context_tokens, tokenize)


def read_trace(path: str | os.PathLike[str], context_tokens: int | None = None,
               keep_ids: bool = False) -> Trace:
    """A trace file in columns (core/traffic/columns.Trace)."""
    p = Path(path)
    return Trace.build(trace_rows(p, context_tokens), str(p), keep_ids=keep_ids)


def write_trace(path: str | os.PathLike[str], rows: Iterable[TraceRow]) -> int:
    """Write the rows in the format (one file, whole or not at all); how many."""
    lines = [orjson.dumps(row_to_json(r)) for r in rows]
    write_atomic(path, b"\n".join(lines) + (b"\n" if lines else b""))
    return len(lines)
