"""`chatfleet plan --trace FILE` from the CLI: the fewest replicas for a trace, the fleet one
fewer failing it, the doubled traffic, the thermal verdict, and bad input as one line."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.core.traffic.synthetic import DayShape, day_trace
from chatfleet.data.traffic import write_trace

# a short twin sweep for the knee and cap: the replays are what these tests are about
SWEEP = ["--precisions", "fp8", "--grid", "1,8,32", "--rates", "1", "--duration", "20",
         "--warmup", "5"]


def busy_hour(path: Path) -> Path:
    """An hour of 1,200 sessions, the busiest minutes in its middle: more than one card."""
    write_trace(path, day_trace(DayShape(sessions=1200, span_s=3600, peak_hour=0.5,
                                         think_s=10), random.Random(3)))
    return path


def plan(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["plan", *args])
    return res.exit_code, res.output


def plan_json(*args: str) -> dict[str, Any]:
    code, text = plan(*args, *SWEEP, "--json")
    assert code == 0, text
    doc: dict[str, Any] = json.loads(text)
    return doc


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_answer_is_the_fewest_replicas_and_one_fewer_fails(tmp_path: Path) -> None:
    trace = busy_hour(tmp_path / "hour.jsonl")
    doc = plan_json("--trace", str(trace))
    rec, t = doc["recommendation"], doc["trace"]
    assert t["lines"] == t["turns"] > 4000 and t["segments"] == 1
    fp8 = t["precisions"]["fp8"]
    target = fp8["target"]
    r = rec["replicas"]
    assert rec["precision"] == "fp8" and r == target["replicas"] == rec["cards"] >= 2
    assert target["verified"] and target["meets_target"] and target["shed"] == 0
    assert target["attainment"] >= 0.99 and target["offered"] == t["lines"]
    assert [r - 1, False] in target["search"]  # the search judged one fewer: it failed
    assert doc["target_users"] == target["peak_users"] > 0
    assert rec["users_per_card"] == -(-target["peak_users"] // r)
    # the doubled traffic needs at least as many, and the fleet sized for the trace sheds it
    assert fp8["doubled"]["replicas"] >= r
    assert fp8["doubled_on_target_fleet"]["replicas"] == r
    # the gateway config is the answer's fleet
    assert len(doc["gateway_config"]["replicas"]) == r
    assert doc["gateway_config"]["cap"] == rec["gateway_cap"]
    # the thermal verdict of the busiest hour, and the cooling the recommendation assumes
    cooling = t["thermal"]["cooling"]
    assert rec["cooling"]["modelled_cooling_holds"] == cooling["held_clock"]
    if not cooling["held_clock"]:
        held = t["thermal"]["held_clock"]
        assert held["clock_mhz"] < cooling["profile"]["loaded_mhz"]
        assert held["replicas"] >= r  # a slower card serves the trace on no fewer
        assert 0 <= cooling["slowdown_after_s"] <= 3600 + t["lead_in_s"]
    # one fewer, replayed as a given fleet, does not meet the target
    fewer = plan_json("--trace", str(trace), "--replicas", str(r - 1))
    lvl = fewer["trace"]["precisions"]["fp8"]["target"]
    assert lvl["replicas"] == r - 1 and lvl["offered"] == t["lines"]
    assert not lvl["meets_target"]
    assert lvl["shed"] > 0 or lvl["attainment"] < 0.99
    code, text = plan("--trace", str(trace), "--replicas", str(r - 1), *SWEEP)
    assert code == 0 and "this fleet does not meet the target" in text, text


@pytest.mark.timeout(120)
def test_the_text_answer_has_the_fleet_the_commands_and_the_config(tmp_path: Path) -> None:
    trace = tmp_path / "few.jsonl"
    write_trace(trace, day_trace(DayShape(sessions=60, span_s=1800, peak_hour=0.2),
                                 random.Random(1)))
    out = tmp_path / "plan.json"
    code, text = plan("--trace", str(trace), *SWEEP, "--out", str(out))
    assert code == 0, text
    assert "recommended: fp8" in " ".join(text.split())
    assert "sglang.launch_server" in text and "gateway config:" in text
    doc = json.loads(out.read_text())
    assert doc["schema"] == "chatfleet.plan/1" and doc["trace"]["lines"] > 0


@pytest.mark.parametrize(("extra", "line", "message"), [
    (["--users", "10"], None, "give one"),
    (["--window", "5-3"], None, "the end must come after the start"),
    (["--window", "soon"], None, "give START-END"),
    (["--time-scale", "0"], None, "--time-scale must be positive"),
    (["--replicas", "0"], None, "--replicas must be between"),
    (["--trace-format", "csv"], None, "--trace-format 'csv'"),
    ([], '{"session": "a", "turn": 0, "time": 1, "prompt_tokens": 10}\n'
         '{"session": "a", "turn": 1, "time": -2, "prompt_tokens": 10}\n', "line 2"),
    ([], '{"session": "a", "turn": 0, "time": 1}\n', "line 1: give 'prompt_tokens'"),
    ([], "not json\n", "line 1: bad JSON"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, extra: list[str], line: str | None,
                                         message: str) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(line or '{"session": "a", "turn": 0, "time": 1, "prompt_tokens": 10}\n')
    code, text = plan("--trace", str(trace), *extra, *SWEEP)
    assert code == 2, text
    assert message in " ".join(text.split()), text
    assert "Traceback" not in text


def test_trace_flags_without_a_trace_and_a_missing_file_are_refused(tmp_path: Path) -> None:
    for flag, value in (("--window", "0-10"), ("--replicas", "3"), ("--cap", "4")):
        code, text = plan("--users", "10", flag, value)
        assert code == 2 and f"{flag} is for --trace" in text, text
    code, text = plan("--trace", str(tmp_path / "nothing.jsonl"))
    assert code == 2 and "file not found" in text, text
