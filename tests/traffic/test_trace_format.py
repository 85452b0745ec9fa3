"""The traffic trace format: each line checked with its file and line number, the trace in
columns (its turns ranked, a repeated turn refused), its windows, time scales and segments."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from chatfleet.core.traffic.columns import Trace, busiest_first, subset
from chatfleet.core.traffic.trace import TraceError, TraceRow, parse_row, row_to_json
from chatfleet.data.traffic import read_trace, write_trace


def write(path: Path, rows: list[dict[str, Any] | str]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_a_row_with_every_field_and_one_with_the_fewest() -> None:
    full = parse_row({"session": 7, "turn": 2, "time": 1.5, "prompt_tokens": 300,
                      "output_tokens": 40, "api_key": "team-a", "priority": 2, "attempt": 1,
                      "other": "ignored"}, "t, line 1")
    assert full == TraceRow("7", 2, 1.5, 300, None, 40, "team-a", 2, 1)
    least = parse_row({"session": "s", "turn": 0, "time": 0, "prompt_tokens": [5, 6, 7]},
                      "t, line 2")
    assert (least.prompt_tokens, least.output_tokens, least.attempt) == (3, None, 0)
    assert least.prompt is not None and list(least.prompt) == [5, 6, 7]
    assert parse_row(row_to_json(full), "x") == full


@pytest.mark.parametrize(("row", "message"), [
    ({"session": "s", "turn": 0}, "missing 'time'"),
    ({"session": True, "turn": 0, "time": 0, "prompt_tokens": 5}, "'session' must"),
    ({"session": "s", "turn": 0, "time": float("nan"), "prompt_tokens": 5}, "'time' must"),
    ({"session": "s", "turn": 0, "time": 0, "prompt_tokens": 50_000}, "more than the model"),
    ({"session": "s", "turn": 0, "time": 0, "prompt_tokens": 5, "api_key": 3}, "'api_key'"),
    ({"session": "s", "turn": 0, "time": 0, "prompt_tokens": 5, "priority": "high"},
     "'priority' must"),
    ({"session": "s", "turn": 0, "time": 0, "prompt_tokens": 5, "attempt": -1}, "'attempt'"),
    ({"session": "s", "turn": 0, "time": 0, "text": "hi"}, "needs the tokenizer"),
])
def test_a_bad_row_says_where_and_what(row: dict[str, Any], message: str) -> None:
    with pytest.raises(TraceError, match=message) as err:
        parse_row(row, "f.jsonl, line 9", context_tokens=40_960)
    assert str(err.value).startswith("f.jsonl, line 9: ")


def test_a_file_is_refused_at_its_bad_line(tmp_path: Path) -> None:
    good = {"session": "a", "turn": 0, "time": 0, "prompt_tokens": 10}
    f = write(tmp_path / "t.jsonl", [good, "", "{not json"])
    with pytest.raises(TraceError, match=r"t.jsonl, line 3: bad JSON"):
        read_trace(f)
    f = write(tmp_path / "t.jsonl", [good, '["a list"]'])
    with pytest.raises(TraceError, match=r"t.jsonl, line 2: expected a JSON object"):
        read_trace(f)
    f = write(tmp_path / "t.jsonl", [good, {**good, "time": 5}])
    with pytest.raises(TraceError, match=r"t.jsonl, line 2: session 'a' turn 0 appears twice"):
        read_trace(f)
    with pytest.raises(TraceError, match="file not found"):
        read_trace(tmp_path / "missing.jsonl")
    with pytest.raises(TraceError, match="no turns"):
        read_trace(write(tmp_path / "empty.jsonl", [""]))


def test_a_retry_is_the_same_turn_another_attempt(tmp_path: Path) -> None:
    rows = [{"session": "a", "turn": 3, "time": 10, "prompt_tokens": 10},
            {"session": "a", "turn": 3, "time": 11, "prompt_tokens": 10, "attempt": 1},
            {"session": "a", "turn": 5, "time": 20, "prompt_tokens": 30},
            {"session": "b", "turn": 0, "time": 12, "prompt_tokens": 10}]
    t = read_trace(write(tmp_path / "t.jsonl", rows))
    # turn numbers need not start at 0 or follow each other: their order ranks them
    assert t.rank.tolist() == [0, 0, 1, 0]
    assert t.time.tolist() == [0.0, 1.0, 10.0, 2.0]  # from the first line on
    assert t.origin == 10.0


def trace_of(rows: list[TraceRow]) -> Trace:
    return Trace.build(enumerate(rows, start=1), "test")


def test_a_window_keeps_the_turns_sent_in_it_from_its_start() -> None:
    t = trace_of([TraceRow("a", i, 100.0 * i, 10, None, 5) for i in range(5)])
    w = t.windowed(150, 350)
    assert w.time.tolist() == [50.0, 150.0] and w.turn.tolist() == [2, 3]
    with pytest.raises(TraceError, match="no turn was sent in the window"):
        t.windowed(1000, 2000)


def test_a_time_scale_brings_sessions_sooner_and_keeps_their_pace() -> None:
    t = trace_of([TraceRow("a", 0, 0.0, 10, None, 5), TraceRow("a", 1, 30.0, 10, None, 5),
                  TraceRow("b", 0, 100.0, 10, None, 5), TraceRow("b", 1, 160.0, 10, None, 5)])
    s = t.scaled(2.0)
    assert s.time.tolist() == [0.0, 30.0, 50.0, 110.0]
    assert s.time_scale == 2.0 and t.scaled(1.0) is t


def test_segments_count_their_window_and_warm_up_on_the_minutes_before() -> None:
    rows = [TraceRow(f"s{i}", 0, 60.0 * i, 10, None, 5 + i) for i in range(150)]
    rows += [TraceRow("s10", 1, 7000.0, 10, None, 5)]  # a session that goes on for hours
    t = trace_of(rows)
    segs = t.segments(3600.0, 300.0)
    assert [s.index for s in segs] == [0, 1, 2]
    assert sum(s.num_counted for s in segs) == t.num_lines  # each line counted once
    second = segs[1]
    assert second.start == 3600.0
    warm = second.time[~second.counted]
    assert warm.size == 5 and warm.min() >= 3300.0  # five minutes of lead-in, uncounted
    assert second.continues[second.session_names.index("s55")] is np.False_
    first = segs[0]
    assert first.continues[first.session_names.index("s10")]  # its turn 1 comes later
    # the busiest first: the second hour makes the most answer tokens
    assert busiest_first(segs)[0] == 1
    part = subset(first, [0, 2])
    assert part.session_names == (first.session_names[0], first.session_names[2])
    assert part.offsets.tolist() == [0, 1, 2]


def test_written_rows_read_back(tmp_path: Path) -> None:
    rows = [TraceRow("a", 0, 0.5, 100, None, 20, "k", 1), TraceRow("a", 0, 1.5, 100, None,
                                                                   20, "k", 1, 1)]
    assert write_trace(tmp_path / "t.jsonl", rows) == 2
    t = read_trace(tmp_path / "t.jsonl")
    assert t.keys == ("k",) and t.attempt.tolist() == [0, 1] and t.priority.tolist() == [1, 1]
