"""Files chatfleet writes: whole or not at all, and its JSON documents in one shape.

`write_atomic` writes a temporary file beside the target, fsyncs it and renames it over the
target, so a reader (or a crash) sees the old file or the new one, never half of one. The file's
mode is what a plain `open` would give (0o666 less the umask). `dumps` is how every document
chatfleet writes is serialised: indented by two, numpy scalars and arrays as plain numbers.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import orjson

from chatfleet.core.documents.sweep import SweepPoint
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.records import RequestRecord, record_from_json


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace `path` with `data` (text as UTF-8) in one rename; parent folders are made."""
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def dumps(doc: Any) -> bytes:
    """A document as chatfleet writes it: JSON indented by two, numpy values as numbers. A
    typed document (a dataclass) is refused: write its `to_json()`, which holds the file's
    keys (orjson would write the dataclass's own fields instead)."""
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
                        | orjson.OPT_PASSTHROUGH_DATACLASS)


def write_json(path: str | os.PathLike[str], doc: Any) -> None:
    """`write_atomic(path, dumps(doc))`: a JSON document that is never seen half-written."""
    write_atomic(path, dumps(doc))


def read_records(path: str | os.PathLike[str]) -> list[RequestRecord]:
    """A run's records.jsonl (one request a line). A bad line is refused with the file and the
    line number; a truncated last line (a run killed mid-write) is left out."""
    p = Path(path)
    try:
        lines = p.read_bytes().splitlines()
    except OSError as exc:
        raise ChatfleetError(f"cannot read {p}: {exc.strerror or exc}") from None
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = orjson.loads(line)
            if not isinstance(row, dict):
                raise ChatfleetError("not a JSON object")
            out.append(record_from_json(row))
        except (orjson.JSONDecodeError, ChatfleetError) as exc:
            if i == len(lines) and isinstance(exc, orjson.JSONDecodeError):
                break  # the last line cut short
            raise ChatfleetError(f"{p}:{i}: {exc}") from None
    return out


def run_file(base: Path, point: SweepPoint, kind: str) -> Path | None:
    """Where a live sweep's point keeps its `kind` file (records, engine, telemetry): the path
    the point names (relative to the sweep's folder), else runs/NNN/<kind>.jsonl if there."""
    files = None if point.live is None else point.live.files
    named = None if files is None else files.get(kind)
    if named is not None:
        p = Path(named)
        return p if p.is_absolute() else base / p
    idx = point.run_index
    if idx is not None:
        guess = base / "runs" / f"{idx:03d}" / f"{kind}.jsonl"
        if guess.is_file():
            return guess
    return None
