"""JSON Lines read line by line, with the line number in every error (pure: lines in)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from chatfleet.core.errors import ChatfleetError


def json_objects(lines: Iterable[str], source: str,
                 error: type[Exception] = ChatfleetError) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each non-blank line as a JSON object, with `where` ("SOURCE, line N") for the caller's
    own messages. A line that is not JSON, or not an object, raises `error` naming it."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}, line {lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise error(f"{where}: bad JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(row, dict):
            raise error(f"{where}: expected a JSON object, got {line.strip()[:60]!r}")
        yield where, row
