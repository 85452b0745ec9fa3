"""`chatfleet twin calibrate --method steps` and `twin judge` from the CLI, on a sweep folder laid
out as a live sweep's (sweep.json, runs/NNN/records.jsonl) whose records the vLLM model with
known constants wrote: the constants come back, a point whose records are missing is left out
of the fit and still replayed, and the profile judges a sweep it was not fitted on."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.core.calibration import vllm_calibration_for
from chatfleet.core.documents.sweep import ClosedLoad, Load, OpenLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.records import record_to_json
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.stepfit.model import StepParams
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.run import run_point
from chatfleet.twin.sweep import TwinSweep

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
TRUTH = StepParams(decode_fixed_s=0.004, prefill_extra_s=0.003, per_seq_s=0.0002,
                   launch_s=0.018, bandwidth_eff=0.6741, gemm_eff=0.6828, attn_eff=0.5,
                   kv_read_eff=0.6741)
FRONTEND_S = 0.030


def live_like_sweep(folder: Path, wcfg: WorkloadConfig, loads: list[Load],
                    without_records: tuple[int, ...] = ()) -> Path:
    """A sweep of the vLLM model with TRUTH's constants on an H200, laid out as a live one:
    each point names its run, and its records are in runs/NNN/ (except `without_records`)."""
    card = get_gpu("h200")
    cal = replace(TRUTH.calibration(vllm_calibration_for(card), "bf16", "test truth"),
                  frontend_delay_s=FRONTEND_S)
    spec = EngineSpec(card, builtin_model("qwen3-8b"), precision("bf16", "bf16"),
                      engine_model="vllm", calibration=cal)
    doc = TwinSweep(spec, wcfg, SLO(), duration_s=30.0, warmup_s=5.0, seed=1).run(
        loads).to_json()
    doc["target"]["engine"] = "vllm"
    for i, point in enumerate(doc["points"]):
        point["run_index"] = i
        if i in without_records:
            continue
        records = run_point(spec, wcfg, loads[i], duration_s=30.0, warmup_s=5.0,
                            seed=point["seed"]).records
        run = folder / "runs" / f"{i:03d}"
        run.mkdir(parents=True)
        (run / "records.jsonl").write_bytes(
            b"".join(orjson.dumps(record_to_json(r)) + b"\n" for r in records))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sweep.json").write_text(json.dumps(doc))
    return folder


def test_a_steps_fit_leaves_out_points_without_records_and_judges_another_workload(
        tmp_path: Path) -> None:
    fixed = WorkloadConfig(system_prompt_tokens=0, lengths=LengthSpec("fixed", 512, 128))
    fitted = live_like_sweep(tmp_path / "fitted", fixed,
                             [ClosedLoad(1), ClosedLoad(8), ClosedLoad(48)],
                             without_records=(0,))
    runner = CliRunner()
    out = tmp_path / "profile.json"
    res = runner.invoke(app, ["twin", "calibrate", "--from", str(fitted), "--method", "steps",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    prof = json.loads(out.read_text())
    assert prof["method"] == "steps"
    assert prof["fit_points"] == ["8 users", "48 users"]
    notes = "\n".join(prof["fit_notes"])
    assert "1 users: no records, left out of the step fit" in notes
    assert "its summary" in notes  # the front end from the 1-user point's median first token
    # the twin has no noise: the fitted points' mean steps are the model's
    assert [p["label"] for p in prof["step_fit"]["points"]] == ["8 users", "48 users"]
    assert all(abs(p["rel_error"]) < 0.02 for p in prof["step_fit"]["points"])
    cal = prof["calibration"]
    assert cal["frontend_delay_s"] == pytest.approx(FRONTEND_S, abs=0.005)
    # every valid point is replayed, the one without records too, and marked as not fitted
    rows = {row["label"]: row["fitted_on"] for row in prof["fit_error"]}
    assert rows == {"1 users": False, "8 users": True, "48 users": True}

    # another workload (a shared prompt, mixed lengths, an open-loop rate): judged, held out
    shared = WorkloadConfig(system_prompt_tokens=2048,
                            lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm"))
    other = live_like_sweep(tmp_path / "other", shared, [ClosedLoad(16), OpenLoad(4.0)])
    judged = tmp_path / "judge.json"
    res = runner.invoke(app, ["twin", "judge", "--profile", str(out), "--against", str(other),
                              "--json", str(judged)])
    assert res.exit_code == 0, res.output
    assert "held out" in res.output
    verdict = json.loads(judged.read_text())
    assert verdict["sweeps"][0]["held_out"] is True
    assert [r["label"] for r in verdict["sweeps"][0]["points"]] == ["16 users", "4 rps"]
    # the engine the profile was fitted to wrote both: its other workload is within targets
    assert verdict["held_out"] == {"points": 2, "within_targets": 2, "knees": 2,
                                   "knees_within": 2}


def test_hold_takes_constant_names_and_refuses_unknown_ones(tmp_path: Path) -> None:
    fixed = WorkloadConfig(system_prompt_tokens=0, lengths=LengthSpec("fixed", 512, 128))
    folder = live_like_sweep(tmp_path / "s", fixed, [ClosedLoad(1), ClosedLoad(16)])
    runner = CliRunner()
    out = tmp_path / "p.json"
    res = runner.invoke(app, ["twin", "calibrate", "--from", str(folder), "--out", str(out),
                              "--hold", "gemm_eff,attn_eff"])
    assert res.exit_code == 0, res.output
    held = json.loads(out.read_text())["assumptions"]
    assert set(held) == {"gemm_eff", "attn_eff"}
    res = runner.invoke(app, ["twin", "calibrate", "--from", str(folder), "--out", str(out),
                              "--hold", "warp_speed"])
    assert res.exit_code == 2
    assert "unknown constant" in res.output and "Traceback" not in res.output
