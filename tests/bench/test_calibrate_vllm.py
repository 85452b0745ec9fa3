"""`chatfleet twin calibrate --engine-model vllm`: two points (1 and N users) fix the vLLM
model's constants, so the rest of a sweep can be predicted."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.core.calibration import vllm_calibration_for
from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.calibrate import calibrate, load_profile
from chatfleet.twin.sweep import TwinSweep

pytestmark = pytest.mark.timeout(180)
WCFG = WorkloadConfig(lengths=LengthSpec("fixed", 512, 128))
TRUE_PER_SEQ_S = 0.0003


def vllm_sweep(tmp_path: Path, gpu: str = "l4", users: tuple[int, ...] = (1, 4, 16, 32),
               **spec_kw: Any) -> tuple[Path, dict[str, Any]]:
    """A sweep of the vLLM model itself with a known per-sequence cost (BF16: its GEMM and
    attention efficiencies are the ones fit_point assumes, so every constant is recoverable)."""
    card = get_gpu(gpu)
    truth = replace(vllm_calibration_for(card), per_seq_s=TRUE_PER_SEQ_S, calibrated=True)
    spec = EngineSpec(card, builtin_model("qwen3-8b"), precision("bf16", "bf16"),
                      engine_model="vllm", calibration=truth, **spec_kw)
    doc = TwinSweep(spec, WCFG, SLO(), duration_s=120.0, warmup_s=10.0, seed=3).run(
        [ClosedLoad(c) for c in users]).to_json()
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(doc))
    return path, doc


def test_the_fit_recovers_the_vllm_models_constants_and_predicts_the_other_points(
        tmp_path: Path) -> None:
    path, _ = vllm_sweep(tmp_path)
    prof = calibrate(path)
    assert prof["engine_model"] == "vllm"  # from the twin sweep's target
    assert prof["fit_points"] == [1, 16]  # 1 and the largest tested <= 16
    cal = prof["calibration"]
    truth = vllm_calibration_for(get_gpu("l4"))
    assert cal["decode_fixed_s"] == pytest.approx(truth.decode_fixed_s, rel=0.01)
    assert cal["prefill_fixed_s"] == pytest.approx(truth.prefill_fixed_s, rel=0.01)
    assert cal["per_seq_s"] == pytest.approx(TRUE_PER_SEQ_S, rel=0.10)
    for row in prof["fit_error"]:  # 4 and 32 users were not fitted on, and come out right
        for key in ("ttft_p50", "tpot_p50", "output_tok_s"):
            assert abs(row[key]["rel_error"]) < 0.03, row


def test_fit_points_choose_the_second_point(tmp_path: Path) -> None:
    path, _ = vllm_sweep(tmp_path)
    prof = calibrate(path, fit_points=[1, 32])
    assert prof["fit_points"] == [1, 32]
    assert prof["calibration"]["per_seq_s"] == pytest.approx(TRUE_PER_SEQ_S, rel=0.10)
    with pytest.raises(ValueError, match="start with 1"):
        calibrate(path, fit_points=[4, 16])
    with pytest.raises(ValueError, match="no valid closed-loop point at concurrency 8"):
        calibrate(path, fit_points=[1, 8])
    with pytest.raises(ValueError, match="one point"):
        calibrate(path, engine_model="sglang", fit_points=[1, 16])


def test_a_live_vllm_sweeps_engine_is_replayed_with_its_own_pool_and_budget(
        tmp_path: Path) -> None:
    # an H200 with an L4-sized pool (24,080 tokens), as a live vLLM sweep's target records it
    path, doc = vllm_sweep(tmp_path, gpu="h200", users=(1, 8, 16), pool_tokens=24094)
    doc["target"] = {
        "engine": "vllm", "gpu": "h200", "weights": "bf16", "kv_cache": "bf16",
        "engine_info": {"engine": "vllm", "version": "0.26.0", "flags": {
            "num_gpu_blocks": 1505, "block_size": 16, "max_num_batched_tokens": 8192,
            "max_num_seqs": 1024}},
        "engine_log": {"pool_tokens": 24080}}
    path.write_text(json.dumps(doc))
    prof = calibrate(path)
    assert prof["engine_model"] == "vllm" and prof["fit_points"] == [1, 16]
    assert prof["engine_settings"] == {"pool_tokens": 24080, "max_num_batched_tokens": 8192,
                                       "max_running_requests": 1024}
    assert prof["calibration"]["per_seq_s"] == pytest.approx(TRUE_PER_SEQ_S, rel=0.10)
    for row in prof["fit_error"]:
        assert abs(row["tpot_p50"]["rel_error"]) < 0.03, row


def test_cli_calibrates_and_the_sweep_uses_the_profile(tmp_path: Path) -> None:
    path, _ = vllm_sweep(tmp_path, users=(1, 16))
    out = tmp_path / "profile.json"
    runner = CliRunner()
    res = runner.invoke(app, ["twin", "calibrate", "--from", str(path), "--out", str(out),
                              "--fit-points", "1,16"])
    assert res.exit_code == 0, res.output
    assert "vllm model" in res.output and "per sequence" in res.output
    cal, doc = load_profile(out)
    assert doc["engine_model"] == "vllm" and cal.per_seq_s > 0
    res = runner.invoke(app, ["twin", "sweep", "--engine-model", "vllm", "--concurrency", "1",
                              "--duration", "30", "--warmup", "0", "--profile", str(out),
                              "--print-json"])
    assert res.exit_code == 0, res.output
    target = json.loads(res.output)["target"]
    assert target["calibration"] == "calibrated"
    assert "fitted to the concurrency-1/16 points" in target["calibration_source"]
    res = runner.invoke(app, ["twin", "calibrate", "--from", str(path), "--out",
                              str(tmp_path / "p2.json"), "--fit-points", "1,x"])
    assert res.exit_code == 2


def test_a_given_front_end_time_is_taken_out_of_the_prefill_step(tmp_path: Path) -> None:
    # the truth spends 30 ms per request in the API server before the engine sees it
    card = get_gpu("l4")
    truth = replace(vllm_calibration_for(card), per_seq_s=TRUE_PER_SEQ_S, frontend_s=0.03,
                    calibrated=True)
    spec = EngineSpec(card, builtin_model("qwen3-8b"), precision("bf16", "bf16"),
                      engine_model="vllm", calibration=truth)
    doc = TwinSweep(spec, WCFG, SLO(), duration_s=120.0, warmup_s=10.0, seed=3).run(
        [ClosedLoad(c) for c in (1, 8, 16)]).to_json()
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(doc))
    given = calibrate(path, frontend_s=0.03)
    cal = given["calibration"]
    assert cal["frontend_s"] == 0.03 and given["assumptions"]["frontend_s"] == 0.03
    assert cal["prefill_fixed_s"] == pytest.approx(truth.prefill_fixed_s, rel=0.01)
    assert cal["per_seq_s"] == pytest.approx(TRUE_PER_SEQ_S, rel=0.10)
    without = calibrate(path)["calibration"]  # the same TTFT, all of it in the prefill step
    assert without["prefill_fixed_s"] == pytest.approx(cal["prefill_fixed_s"] + 0.03, rel=1e-6)
    # auto: the search matches the second point's median TTFT (what it claims, no more)
    auto = calibrate(path, frontend_s="auto")
    row = next(r for r in auto["fit_error"] if r["load"]["concurrency"] == 16)
    assert abs(row["ttft_p50"]["rel_error"]) <= 0.10
    assert 0 <= auto["calibration"]["frontend_s"] <= 0.75 * doc["points"][0]["ttft_ms"]["p50"]
    with pytest.raises(ValueError, match="vllm model"):
        calibrate(path, engine_model="sglang", frontend_s="auto")
    res = CliRunner().invoke(app, ["twin", "calibrate", "--from", str(path), "--out",
                                   str(tmp_path / "p.json"), "--frontend-ms", "soon"])
    assert res.exit_code == 2 and "--frontend-ms" in res.output
