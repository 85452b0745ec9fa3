"""chatfleet twin calibrate: fitting the twin to a sweep recovers the engine that made it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.core.calibration import L4_CALIBRATION
from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.calibrate import calibrate, load_profile, workload_from_json
from chatfleet.twin.sweep import TwinSweep


def twin_sweep(tmp_path: Path) -> Path:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
    wcfg = WorkloadConfig(lengths=LengthSpec("fixed", 512, 128))
    loads = [ClosedLoad(c) for c in (1, 4, 16)]
    doc = TwinSweep(spec, wcfg, SLO(), duration_s=120.0, warmup_s=10.0,
                    seed=3).run(loads).to_json()
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.timeout(120)
def test_calibrating_on_the_twins_own_sweep_recovers_its_constants(tmp_path: Path) -> None:
    prof = calibrate(twin_sweep(tmp_path))
    cal = prof["calibration"]
    assert prof["gpu"] == "l4" and prof["weights"] == "fp8"
    assert cal["bandwidth_eff"] == pytest.approx(L4_CALIBRATION.bandwidth_eff, rel=0.03)
    assert cal["prefill_fixed_s"] == pytest.approx(L4_CALIBRATION.prefill_fixed_s, rel=0.25)
    # the other points: the fitted twin replays the sweep closely
    for row in prof["fit_error"]:
        assert abs(row["tpot_p50"]["rel_error"]) < 0.05, row
        assert abs(row["output_tok_s"]["rel_error"]) < 0.05, row


@pytest.mark.timeout(120)
def test_calibrate_cli_writes_a_profile_the_twin_uses(tmp_path: Path) -> None:
    sweep = twin_sweep(tmp_path)
    out = tmp_path / "profile.json"
    runner = CliRunner()
    res = runner.invoke(app, ["twin", "calibrate", "--from", str(sweep), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "fit error" in res.output
    cal, doc = load_profile(out)
    assert cal.gpu == "l4"
    assert doc["schema"] == "chatfleet.profile/1"
    res = runner.invoke(app, ["twin", "sweep", "--gpu", "l4", "--weights", "fp8", "--kv-cache",
                              "fp8", "--concurrency", "1", "--duration", "30", "--warmup", "0",
                              "--profile", str(out), "--print-json"])
    assert res.exit_code == 0, res.output
    target = json.loads(res.output)["target"]
    assert target["calibration"] == "calibrated"
    assert "fitted to the concurrency-1 point" in target["calibration_source"]


def test_calibrate_refuses_a_sweep_without_a_concurrency_one_point(tmp_path: Path) -> None:
    doc = {"schema": "chatfleet.sweep/1", "target": {"gpu": "l4", "weights": "bf16",
                                                       "kv_cache": "bf16"},
           "workload": {"lengths": {"kind": "fixed", "input_len": 10, "output_len": 5}},
           "points": [{"load": {"mode": "closed", "concurrency": 4}, "valid": True}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="concurrency-1"):
        calibrate(path)
    res = CliRunner().invoke(app, ["twin", "calibrate", "--from", str(tmp_path / "none.json"),
                                   "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 2


def test_a_sweeps_group_draw_is_replayed_and_older_sweeps_read_as_round_robin() -> None:
    wcfg = WorkloadConfig(prompt_groups=8, group_draw="request",
                          lengths=LengthSpec("fixed", 64, 16))
    again, _ = workload_from_json(wcfg.to_json())
    assert again == wcfg
    older = {k: v for k, v in wcfg.to_json().items() if k != "group_draw"}
    assert workload_from_json(older)[0].group_draw == "round-robin"
