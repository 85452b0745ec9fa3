"""The simserver serves the twin's engine model: for the same workload and seed, its trace
matches the twin in virtual time (issue: simserver, parity)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.metrics import find_knee
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.jobs.parity import run_parity


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_64_user_closed_loop_matches_the_twin(tmp_path: Path) -> None:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("bf16", "bf16"))
    res = run_parity(spec, WorkloadConfig(), 64, duration_s=60.0, warmup_s=10.0, seed=5,
                     time_scale=10.0, trace=tmp_path / "trace.jsonl")
    twin_engine = res.twin.engine
    # the pool fills and requests queue, exactly as in the twin
    assert res.live_engine.max_running == twin_engine.max_running
    assert abs(res.live_engine.max_queue - twin_engine.max_queue) <= 1
    assert res.live_engine.peak_token_usage == pytest.approx(
        twin_engine.peak_token_usage, abs=0.01)
    # the client's figures, in model time, agree within the wall clock's noise
    assert res.live.output_tok_s == pytest.approx(res.twin.output_tok_s, rel=0.05)
    assert res.live.ttft_ms.p50 == pytest.approx(res.twin.ttft_ms.p50, rel=0.05)
    assert res.live.tpot_ms.p50 == pytest.approx(res.twin.tpot_ms.p50, rel=0.02)
    assert res.live.attainment == pytest.approx(res.twin.attainment, abs=0.05)
    assert res.emission_lag_ms["p99"] < 10.0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_knee_is_the_same_through_the_simserver(tmp_path: Path) -> None:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
    wcfg = WorkloadConfig(lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm"))
    twin_pts, live_pts = [], []
    for i, users in enumerate((8, 16, 32)):
        res = run_parity(spec, wcfg, users, duration_s=90.0, warmup_s=10.0, seed=11 + i,
                         time_scale=10.0, trace=tmp_path / f"t{users}.jsonl")
        twin_pts.append(res.twin)
        live_pts.append(res.live)
    twin_knee = find_knee(twin_pts, "closed", 0.99)
    live_knee = find_knee(live_pts, "closed", 0.99)
    assert twin_knee == live_knee
    assert twin_knee.meets is not None
