"""Traces from the logs people have: an OpenAI-style request log (sessions named, or chained
by the conversation each request resends) and a chatfleet run's records (retries as
attempts, a sweep's runs one after another)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from chatfleet.core.records import RequestRecord, record_to_json
from chatfleet.core.traffic.trace import TraceError
from chatfleet.data.traffic_import import from_openai_log, from_records


def jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def chat(t: Any, msgs: list[tuple[str, str]], answer: str, prompt: int, completion: int,
         **extra: Any) -> dict[str, Any]:
    return {"timestamp": t, "request": {"messages": [{"role": r, "content": c}
                                                     for r, c in msgs]},
            "response": {"choices": [{"message": {"role": "assistant", "content": answer}}],
                         "usage": {"prompt_tokens": prompt, "completion_tokens": completion}},
            **extra}


def test_a_conversation_resent_with_its_answer_is_one_session(tmp_path: Path) -> None:
    sys_msg = ("system", "You help.")
    rows = [
        chat("2026-12-01T10:00:00Z", [sys_msg, ("user", "hi")], "hello", 20, 5),
        chat("2026-12-01T10:00:03Z", [sys_msg, ("user", "other")], "yes", 21, 4),
        chat("2026-12-01T10:00:30Z", [sys_msg, ("user", "hi"), ("assistant", "hello"),
                                      ("user", "more")], "sure", 40, 6, api_key="team-a"),
        {"timestamp": 1796119240, "error": {"message": "rate limited"}, "status_code": 429},
        {"created": 1796119235000, "usage": {"prompt_tokens": 9, "completion_tokens": 3},
         "metadata": {"session_id": "named"}, "priority": 2},
    ]
    got = from_openai_log(jsonl(tmp_path / "log.jsonl", rows))
    by = {(r.session, r.turn): r for r in got.rows}
    first = by[("line-1", 0)]
    assert first.time == 0.0 and (first.prompt_tokens, first.output_tokens) == (20, 5)
    again = by[("line-1", 1)]  # its history resent: the same session's next turn
    assert again.time == 30.0 and again.api_key == "team-a"
    assert by[("line-2", 0)].time == 3.0
    named = by[("named", 0)]  # milliseconds since the epoch, a named session
    assert named.time == 35.0 and named.priority == 2
    assert got.skipped == {"failed request without usage": 1}


@pytest.mark.parametrize(("row", "message"), [
    ({"usage": {"prompt_tokens": 3, "completion_tokens": 1}}, "line 1: no time"),
    ({"timestamp": "yesterday", "usage": {"prompt_tokens": 3, "completion_tokens": 1}},
     "neither a number nor an ISO 8601"),
    ({"timestamp": 1, "model": "x"}, "line 1: no usage"),
    ({"timestamp": 1, "usage": {"prompt_tokens": 0, "completion_tokens": 1}},
     "usage.prompt_tokens must"),
])
def test_a_bad_log_line_is_refused_with_its_line(tmp_path: Path, row: dict[str, Any],
                                                 message: str) -> None:
    with pytest.raises(TraceError, match=message):
        from_openai_log(jsonl(tmp_path / "log.jsonl", [row]))


def record(rid: str, session: str, send: float, outcome: str = "ok",
           output: int = 8) -> dict[str, Any]:
    ok = outcome == "ok"
    return record_to_json(RequestRecord(
        rid, session, 0, scheduled_time=send, send_time=send,
        first_token_time=send + 0.1 if ok else None,
        token_times=[send + 0.1 + i * 0.01 for i in range(output)] if ok else [],
        prompt_tokens=300, output_tokens=output if ok else 0, outcome=outcome))  # type: ignore[arg-type]


def test_a_runs_records_are_its_traffic_retries_included(tmp_path: Path) -> None:
    run = jsonl(tmp_path / "live" / "records.jsonl", [
        record("r1", "s1", 0.0, "shed"), record("r1#1", "s1", 1.0, output=7),
        record("r2", "s2", 0.5, "shed"),
    ])
    got = from_records(run.parent)  # the folder holding records.jsonl
    rows = {(r.session, r.attempt): r for r in got.rows}
    assert rows[("s1", 0)].output_tokens == 7  # the length its served retry had
    assert rows[("s1", 1)].time == 1.0 and rows[("s1", 1)].attempt == 1
    assert rows[("s2", 0)].output_tokens is None  # never served: the reader's default


def test_a_sweeps_runs_follow_one_another(tmp_path: Path) -> None:
    for i in range(2):
        jsonl(tmp_path / "runs" / f"{i:03d}" / "records.jsonl",
              [record("r1", "s1", 0.0), record("r2", "s2", 2.0)])
    got = from_records(tmp_path)
    assert [r.session for r in got.rows] == ["000/s1", "000/s2", "001/s1", "001/s2"]
    assert got.rows[2].time > got.rows[1].time + 60.0
    with pytest.raises(TraceError, match=r"no records\.jsonl"):
        from_records(tmp_path / "runs")
    bad = jsonl(tmp_path / "bad" / "records.jsonl", [{"outcome": "ok"}, {}])
    with pytest.raises(Exception, match=r"records.jsonl:1"):
        from_records(bad)
