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
