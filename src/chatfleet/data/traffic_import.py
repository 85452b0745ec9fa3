"""Traces from the logs people have (docs/traffic.md#importers): an OpenAI-style request log
with timestamps and usage, and a chatfleet run's own records (`runs/*/records.jsonl`: a live
sweep's points, the demo's live run), so that a live run replays in the twin.

Each importer returns the rows of the trace format (core/traffic/trace.TraceRow) with the
line each came from, and what it left out and why.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from chatfleet.core.records import RequestRecord
from chatfleet.core.traffic.trace import TraceError, TraceRow
from chatfleet.data.traffic import json_lines
from chatfleet.io import read_records

IMPORT_FORMATS = ("openai", "records")
MS_EPOCH = 1e11  # a timestamp above this is in milliseconds (1e11 s is the year 5138)
RUN_GAP_S = 60.0  # the pause put between two runs of a sweep


@dataclass(slots=True)
class Imported:
    """An importer's rows (with the line of the source each came from) and what it left
    out, by reason."""

    rows: list[TraceRow]
    skipped: dict[str, int] = field(default_factory=dict)

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


# --- a chatfleet run's records -----------------------------------------------------------------


def record_files(path: Path) -> list[Path]:
    """records.jsonl itself, a run's folder holding one, or a sweep's folder (its
    runs/NNN/records.jsonl, in order)."""
    if path.is_file():
        return [path]
    if (path / "records.jsonl").is_file():
        return [path / "records.jsonl"]
    runs = sorted((path / "runs").glob("*/records.jsonl")) if path.is_dir() else []
    if not runs:
        raise TraceError(f"{path}: no records.jsonl there (give a run's records.jsonl, its "
                         "folder, or a sweep's folder with runs/*/records.jsonl)")
    return runs


def from_records(path: Path) -> Imported:
    """Every request the client sent, a line each: the session, its turn, the time the
    request was sent, the prompt's and the answer's tokens; a retry after a 429 (request id
    `ID#k`) is attempt k of its turn. A shed request has no answer: its length is the one
    the turn's served attempt had, else absent (the reader's default). A sweep's runs follow
    one another with a minute between them, their sessions named `RUN/SESSION`."""
    files = record_files(path)
    out = Imported([])
    offset = 0.0
    for n, file in enumerate(files):
        records = read_records(file)
        prefix = f"{file.parent.name}/" if len(files) > 1 else ""
        served: dict[tuple[str, int], int] = {}
        for r in records:
            if r.outcome == "ok" and r.output_tokens > 0:
                served[(r.session_id, r.turn)] = r.output_tokens
        end = 0.0
        for r in records:
            if r.prompt_tokens < 1:
                out.skip("no prompt length (a request that never reached the server)")
                continue
            attempt = _attempt_of(r)
            output = (r.output_tokens if r.outcome == "ok" and r.output_tokens > 0
                      else served.get((r.session_id, r.turn)))
            out.rows.append(TraceRow(
                session=prefix + r.session_id, turn=r.turn, time=offset + r.send_time,
                prompt_tokens=r.prompt_tokens, prompt=None, output_tokens=output,
                attempt=attempt))
            end = max(end, r.send_time, r.last_token_time or 0.0)
        if n + 1 < len(files):
            offset += end + RUN_GAP_S
    return out


def _attempt_of(r: RequestRecord) -> int:
    _, _, attempt = r.request_id.partition("#")
    return int(attempt) if attempt.isdigit() else 0


# --- an OpenAI-style request log ---------------------------------------------------------------

TIME_KEYS = ("timestamp", "created", "start_time", "startTime", "request_time", "time")
SESSION_KEYS = ("session_id", "session", "conversation_id", "user")


def _get(rec: Mapping[str, Any], *path: str) -> Any:
    cur: Any = rec
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def _first(rec: Mapping[str, Any], paths: Sequence[tuple[str, ...]]) -> Any:
    for path in paths:
        v = _get(rec, *path)
        if v is not None:
            return v
    return None


def _seconds(value: Any, where: str) -> float:
    """A Unix time in seconds or milliseconds, or an ISO 8601 date-time."""
    if isinstance(value, bool):
        raise TraceError(f"{where}: the time {value!r} is not a time")
    if isinstance(value, (int, float)):
        t = float(value)
        if not math.isfinite(t) or t < 0:
            raise TraceError(f"{where}: the time {value!r} is not a time")
        return t / 1000.0 if t > MS_EPOCH else t
    if isinstance(value, str):
        try:
            stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise TraceError(f"{where}: the time {value!r} is neither a number nor an ISO "
                             "8601 date-time") from None
        return stamp.timestamp()
    raise TraceError(f"{where}: the time {value!r} is neither a number nor an ISO 8601 "
                     "date-time")


def _messages(rec: Mapping[str, Any]) -> list[tuple[str, str]] | None:
    msgs = _first(rec, (("request", "messages"), ("request_body", "messages"), ("messages",),
                        ("body", "messages")))
    if not isinstance(msgs, list):
        return None
    return [(str(m.get("role")), orjson.dumps(m.get("content")).decode())
            for m in msgs if isinstance(m, Mapping)]


def _answer(rec: Mapping[str, Any]) -> str | None:
    choices = _first(rec, (("response", "choices"), ("response_body", "choices"), ("choices",)))
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    msg = choices[0].get("message")
    return orjson.dumps(msg.get("content")).decode() if isinstance(msg, Mapping) else None


def _digest(messages: Sequence[tuple[str, str]]) -> bytes:
    return hashlib.blake2b(orjson.dumps(list(messages)), digest_size=16).digest()


def from_openai_log(path: Path) -> Imported:
    """One request a line, as logging proxies and gateways write them: its time
    (`timestamp`, `created`, `start_time`, ...: Unix seconds or milliseconds, or ISO 8601) and
    its usage (`usage` or `response.usage`: `prompt_tokens`, `completion_tokens`). Its session
    is the first of `session_id`, `session`, `conversation_id`, `user` (at the top, under
    `metadata` or under `request`), else the conversation it continues: a request whose
    messages are an earlier request's messages and that request's answer, plus a new user
    message, is that session's next turn (the history a chat client resends); else a session
    of its own. `api_key` (or `metadata.api_key`) and `priority` are kept. A line whose
    request failed (an `error`, or a `status`/`status_code` of 400 or more) and has no usage
    is left out, counted."""
    raw: list[tuple[int, float, Mapping[str, Any]]] = []
    out = Imported([])
    for lineno, where, line in json_lines(path):
        when = _first(line, [(k,) for k in TIME_KEYS] + [("request", k) for k in TIME_KEYS])
        if when is None:
            raise TraceError(f"{where}: no time (one of {', '.join(TIME_KEYS)})")
        usage = _first(line, (("usage",), ("response", "usage"), ("response_body", "usage")))
        if not isinstance(usage, Mapping):
            status = _first(line, (("status",), ("status_code",), ("response", "status_code")))
            if line.get("error") is not None or (isinstance(status, int) and status >= 400):
                out.skip("failed request without usage")
                continue
            raise TraceError(f"{where}: no usage (usage.prompt_tokens, "
                             "usage.completion_tokens)")
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        for name, v in (("prompt_tokens", prompt), ("completion_tokens", completion)):
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "prompt_tokens"
                                                                    else 0):
                raise TraceError(f"{where}: usage.{name} must be a whole number of tokens, "
                                 f"got {v!r}")
        if completion == 0:
            out.skip("no answer tokens (completion_tokens 0)")
            continue
        raw.append((lineno, _seconds(when, where), line))
    raw.sort(key=lambda x: (x[1], x[0]))
    chained: dict[bytes, tuple[str, int]] = {}  # history digest -> (session, its last turn)
    turns: dict[str, int] = {}
    for lineno, t, logged in raw:
        rec = logged
        where = f"{path}, line {lineno}"
        named = _first(rec, [(k,) for k in SESSION_KEYS] + [("metadata", k) for k in SESSION_KEYS]
                       + [("request", k) for k in SESSION_KEYS])
        msgs = _messages(rec)
        session: str
        if named is not None:
            session = str(named)
        elif msgs and len(msgs) > 1 and _digest(msgs[:-1]) in chained:
            session = chained[_digest(msgs[:-1])][0]
        else:
            session = f"line-{lineno}"
        turn = turns.get(session, -1) + 1
        turns[session] = turn
        answer = _answer(rec)
        if msgs is not None and answer is not None:
            chained[_digest([*msgs, ("assistant", answer)])] = (session, turn)
        key = _first(rec, (("api_key",), ("metadata", "api_key")))
        priority = _first(rec, (("priority",), ("metadata", "priority")))
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise TraceError(f"{where}: 'priority' must be an integer, got {priority!r}")
        counts = _first(rec, (("usage",), ("response", "usage"), ("response_body", "usage")))
        out.rows.append(TraceRow(session, turn, t, int(counts["prompt_tokens"]), None,
                                 int(counts["completion_tokens"]),
                                 None if key is None else str(key), priority))
    if not out.rows:
        raise TraceError(f"{path}: no request with usage in the log")
    t0 = min(r.time for r in out.rows)
    out.rows = [TraceRow(r.session, r.turn, r.time - t0, r.prompt_tokens, None,
                         r.output_tokens, r.api_key, r.priority) for r in out.rows]
    return out


def import_log(kind: str, path: Path) -> Imported:
    if kind == "openai":
        return from_openai_log(path)
    if kind == "records":
        return from_records(path)
    raise TraceError(f"unknown log format {kind!r}: one of {', '.join(IMPORT_FORMATS)}")
