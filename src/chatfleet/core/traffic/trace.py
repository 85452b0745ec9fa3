"""The traffic trace format: JSON Lines, one turn a line (docs/traffic.md).

    {"session": "u17", "turn": 3, "time": 412.5, "prompt_tokens": 2900, "output_tokens": 180,
     "api_key": "team-a", "priority": 1, "attempt": 0}

- `session` (string or integer), `turn` (integer >= 0: a session's turns are taken in this
  order), `time` (seconds >= 0, when the turn was sent; any origin, an epoch included);
- the prompt: `prompt_tokens` as a count or a list of token ids, or `text` (the shell
  tokenizes it and passes the ids here);
- optional: `output_tokens` (the answer's length; the reader's default when absent),
  `api_key` (a string: the gateway's per-key limits apply to it), `priority` (an integer,
  kept and counted: the gateway has no priority classes beyond returning sessions),
  `attempt` (an integer >= 0, 0 when absent: a client's retry of the same turn after a 429,
  as a gateway saw it). Other keys are ignored.

`chatfleet cache --trace` and `chatfleet plan --trace` read the same format. This module
checks one row (`parse_row`); a shell reads the lines (chatfleet.data.traffic).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from chatfleet.core.errors import ChatfleetError

# the keys a row may carry (others are ignored)
ROW_KEYS = ("session", "turn", "time", "prompt_tokens", "text", "output_tokens", "api_key",
            "priority", "attempt")

Tokenize = Callable[[str], list[int]]


class TraceError(ChatfleetError):
    """A trace line or trace that cannot be replayed (one line, with the file and line)."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One line of a trace. `prompt` is the prompt's token ids where the line gave them (as
    ids, or as text the shell tokenized), else None; `prompt_tokens` is its length either
    way."""

    session: str
    turn: int
    time: float
    prompt_tokens: int
    prompt: array[int] | None
    output_tokens: int | None
    api_key: str | None = None
    priority: int | None = None
    attempt: int = 0


def _int_field(rec: Mapping[str, Any], key: str, where: str, minimum: int,
               maximum: int | None = None) -> int:
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise TraceError(f"{where}: {key!r} must be an integer >= {minimum}, got {v!r}")
    if maximum is not None and v > maximum:
        raise TraceError(f"{where}: {key!r} is {v} tokens, more than the model's context "
                         f"of {maximum}")
    return v


def parse_row(rec: Mapping[str, Any], where: str, context_tokens: int | None = None,
              tokenize: Tokenize | None = None) -> TraceRow:
    """One line's object, checked (`where`: "FILE, line N", for the error). A count above
    `context_tokens` (the model's context) is refused: no engine serves it. `text` needs
    `tokenize` (the shell's tokenizer)."""
    for key in ("session", "turn", "time"):
        if key not in rec:
            raise TraceError(f"{where}: missing {key!r}")
    session = rec["session"]
    if not isinstance(session, (str, int)) or isinstance(session, bool):
        raise TraceError(f"{where}: 'session' must be a string or an integer")
    turn = _int_field(rec, "turn", where, 0)
    t = rec["time"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise TraceError(f"{where}: 'time' must be a number of seconds >= 0, got {t!r}")
    out_tokens = (_int_field(rec, "output_tokens", where, 1, context_tokens)
                  if rec.get("output_tokens") is not None else None)
    ids: array[int] | None = None
    if "prompt_tokens" in rec:
        p = rec["prompt_tokens"]
        if isinstance(p, list):
            if not p or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                for x in p):
                raise TraceError(f"{where}: 'prompt_tokens' must be a non-empty list of token "
                                 "ids (integers >= 0) or a count")
            ids = array("q", p)
            count = len(ids)
        else:
            count = _int_field(rec, "prompt_tokens", where, 1, context_tokens)
    elif "text" in rec:
        if not isinstance(rec["text"], str) or not rec["text"]:
            raise TraceError(f"{where}: 'text' must be a non-empty string")
        if tokenize is None:
            raise TraceError(f"{where}: 'text' needs the tokenizer")
        ids = array("q", tokenize(rec["text"]))
        if not ids:
            raise TraceError(f"{where}: 'text' tokenizes to nothing")
        count = len(ids)
    else:
        raise TraceError(f"{where}: give 'prompt_tokens' (ids or a count) or 'text'")
    if context_tokens is not None and ids is not None and count > context_tokens:
        raise TraceError(f"{where}: the prompt is {count} tokens, more than the model's "
                         f"context of {context_tokens}")
    api_key = rec.get("api_key")
    if api_key is not None and (not isinstance(api_key, str) or not api_key):
        raise TraceError(f"{where}: 'api_key' must be a non-empty string")
    priority = rec.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise TraceError(f"{where}: 'priority' must be an integer, got {priority!r}")
    attempt = _int_field(rec, "attempt", where, 0) if rec.get("attempt") is not None else 0
    return TraceRow(str(session), turn, float(t), count, ids, out_tokens, api_key, priority,
                    attempt)


def row_to_json(row: TraceRow) -> dict[str, Any]:
    """A row as the format writes it (a count for the prompt when no ids are known)."""
    out: dict[str, Any] = {"session": row.session, "turn": row.turn, "time": row.time,
                           "prompt_tokens": (row.prompt_tokens if row.prompt is None
                                             else list(row.prompt))}
    if row.output_tokens is not None:
        out["output_tokens"] = row.output_tokens
    if row.api_key is not None:
        out["api_key"] = row.api_key
    if row.priority is not None:
        out["priority"] = row.priority
    if row.attempt:
        out["attempt"] = row.attempt
    return out
