"""`chatfleet demo`: the plan through the twin, the live proof behind the gateway, the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_demo_answers_proves_it_live_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    res = CliRunner().invoke(app, ["demo", "--out", str(out), "--users", "50",
                                   "--live-seconds", "15"])
    assert res.exit_code == 0, res.output
    text = res.output
    assert "recommended: fp8" in text and "sglang.launch_server" in text
    assert f"report: {out / 'report.html'}" in " ".join(text.split())
    html = (out / "report.html").read_text()
    assert "<svg" in html
    plan = json.loads((out / "plan.json").read_text())
    cap = plan["recommendation"]["gateway_cap"]
    assert cap == plan["recommendation"]["users_per_card"]  # no think time: users in flight
    summary = json.loads((out / "demo.json").read_text())
    live = summary["live"]
    assert live["users"] == 2 * 2 * cap  # twice the fleet's cap
    assert all(n <= cap for n in live["max_in_flight_seen_by_replicas"].values())
    s = live["live"]
    assert s["shed"] > 0 and s["failed"] == 0  # past the knee: sheds, nothing lost
    assert s["attempts"] == s["completed"] + s["shed"] + s["failed"]
    assert s["admitted_attainment"] is not None
    assert s["shed_with_retry_after"] == s["shed"]  # every 429 says when to come back
    # the live run is a proof in its own section, not a sweep with a failed knee
    proof = json.loads((out / "live" / "proof.json").read_text())
    assert proof["schema"] == "chatfleet.live-proof/1" and proof["cap_per_replica"] == cap
    assert proof["live"]["peak_in_flight"] == live["max_in_flight_seen_by_replicas"]
    assert set(proof["twin"]["peak_in_flight"]) == set(proof["live"]["peak_in_flight"])
    assert 'id="live-proof"' in html and "The cap held with 2× the fleet" in html
    assert "L4 FP8 (live)" not in html and f"fails {live['users']} users" not in html
    assert (out / "live" / "sweep.json").is_file()  # kept for machines
    for name in ("bf16", "fp8"):
        doc = json.loads((out / f"twin-{name}.json").read_text())
        assert doc["schema"] == "chatfleet.sweep/1"
        modes = {p["load"]["mode"] for p in doc["points"]}
        assert modes == {"closed", "open"}  # a closed-loop and a fixed-rate sweep
        assert doc["workload"]["system_prompt_tokens"] == 2048
        assert doc["workload"]["lengths"]["kind"] == "uniform"
