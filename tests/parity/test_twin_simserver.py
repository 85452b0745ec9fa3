"""The simserver serves the twin's engine model: for the same workload and seed, its trace
matches the twin in virtual time (issue: simserver, parity).

What a wall-clock run can hold: the simserver runs `time_scale` times faster than the model,
so every wall millisecond its host holds up a replica or a stream costs `time_scale` model
milliseconds. With both cores of this machine busy (two CPU hogs), at time scale 10:

- a replica more than 50 ms (wall) behind its timeline starts from the present and loses the
  model time in between: 2-4 model s per run, TTFT p50 up 5-18%. The trace says when and how
  much (its "resync" rows), so `run_parity` reads the live side on a clock that stopped
  meanwhile: exactly the model time the twin never loses;
- tokens reach the client late: the emission lag's p99 was 25-48 ms (250-480 model ms), and
  the knee came out a step lower. That cannot be taken out, so a run counts only if the host
  delivered on time (`ParityResult.host_kept_up`: emission and client loop lag p99 within 100
  model ms, which at time scale 10 is the 10 ms this test asked of the emission lag before);
  otherwise the point runs again at time scale 2, where the same delays cost a fifth as much
  (measured with the hogs: figures within 0.3%).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.measure.knee import find_knee
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.jobs.parity import ParityResult, run_parity

# fastest first; the next one only when the host did not keep up with the one before
TIME_SCALES = (10.0, 2.0)


def parity_run(spec: EngineSpec, wcfg: WorkloadConfig, users: int, *, duration_s: float,
               warmup_s: float, seed: int, trace: Path) -> ParityResult:
    """run_parity at the first of TIME_SCALES whose run the host kept up with (or the last)."""
    for scale in TIME_SCALES:
        res = run_parity(spec, wcfg, users, duration_s=duration_s, warmup_s=warmup_s,
                         seed=seed, time_scale=scale, trace=trace)
        if res.host_kept_up():
            break
    return res


def host(res: ParityResult) -> str:
    return (f"time scale {res.time_scale}: {res.model_time_lost_s:.2f} model s lost, "
            f"emission lag {res.emission_lag_ms}")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_64_user_closed_loop_matches_the_twin(tmp_path: Path) -> None:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("bf16", "bf16"))
    res = parity_run(spec, WorkloadConfig(), 64, duration_s=60.0, warmup_s=10.0, seed=5,
                     trace=tmp_path / "trace.jsonl")
    assert res.host_kept_up(), host(res)  # else the figures below measure the machine
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


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_the_knee_is_the_same_through_the_simserver(tmp_path: Path) -> None:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
    wcfg = WorkloadConfig(lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm"))
    twin_pts, live_pts = [], []
    for i, users in enumerate((8, 16, 32)):
        res = parity_run(spec, wcfg, users, duration_s=90.0, warmup_s=10.0, seed=11 + i,
                         trace=tmp_path / f"t{users}.jsonl")
        assert res.host_kept_up(), host(res)
        twin_pts.append(res.twin)
        live_pts.append(res.live)
    twin_knee = find_knee(twin_pts, "closed", 0.99)
    live_knee = find_knee(live_pts, "closed", 0.99)
    assert twin_knee == live_knee
    assert twin_knee.meets is not None
