"""The step fit (issue 22): every request's token gaps are the engine's steps, and the vLLM
model's constants come back from them. The twin with known constants stands in for a live
engine: its records hold exactly what a live sweep's do (token arrival times, prompt and cached
tokens), so a fit that recovers its constants reads a live sweep the same way."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from chatfleet.core.calibration import vllm_calibration_for
from chatfleet.core.documents.sweep import ClosedLoad, OpenLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.records import RequestRecord
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.stepfit.fit import fit_steps
from chatfleet.core.stepfit.model import Hardware, StepParams, step_times
from chatfleet.core.stepfit.samples import StepSamples, step_samples
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.run import run_point

WCFG = WorkloadConfig(system_prompt_tokens=0,
                      lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm"))
TRUTH = StepParams(decode_fixed_s=0.004, prefill_extra_s=0.003, per_seq_s=0.0002,
                   launch_s=0.018, bandwidth_eff=0.7, gemm_eff=0.55, attn_eff=0.3,
                   kv_read_eff=0.7)


# an H200: its GPU time (weights ~5 ms a step) is below the launch time at small batches and
# above it at large ones and in long prefills, so both sides of the max() are seen
def hardware() -> Hardware:
    return Hardware(get_gpu("h200"), builtin_model("qwen3-8b"), precision("bf16", "bf16"))


def test_the_vectorised_step_is_mixed_step_models_own() -> None:
    hw = hardware()
    rng = random.Random(7)
    for _ in range(200):
        p = StepParams(*(rng.uniform(0.0, 0.03) for _ in range(4)),
                       rng.uniform(0.1, 1.0), rng.uniform(0.1, 1.0), rng.uniform(0.05, 1.0),
                       rng.uniform(0.1, 1.0))
        n, pf, k = rng.randint(0, 200), rng.choice([0, 0, rng.randint(1, 8000)]), 0
        k = rng.randint(1, 8) if pf else 0
        ctx = n * rng.randint(100, 4000)
        cached = rng.randint(0, 3000) if pf else 0
        pairs = pf * cached + pf * (pf + 1) / 2
        s = StepSamples(*(np.array([v], dtype=float) for v in (
            0.0, 1.0, n, ctx, pf, pairs, cached, k, 0.0)), 0, 0.0)
        expected = hw.step_model(p).step_s(n, ctx, pf, pairs, cached, k, k)
        assert step_times(hw, p, s)[0] == pytest.approx(expected, rel=1e-12)


def rec(rid: str, times: list[float], prompt: int = 100, cached: int = 0) -> RequestRecord:
    return RequestRecord(rid, token_times=times, first_token_time=times[0],
                         prompt_tokens=prompt, cached_tokens=cached, output_tokens=len(times))


def test_gaps_carry_the_batch_and_the_prefills_of_their_step() -> None:
    # steps end at 0.1, 0.2, ..., A decodes from the first; B's prompt (300 tokens, 100 of them
    # cached) is prefilled in the step ending at 0.3; C skips the step ending at 0.5
    a = rec("a", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], prompt=50)
    b = rec("b", [0.3, 0.4, 0.5, 0.6], prompt=300, cached=100)
    c = rec("c", [0.2, 0.3, 0.4, 0.6], prompt=80)
    s = step_samples([a, b, c])
    rows = sorted(zip(s.end_time.round(3), s.num_decode, s.prefill_tokens, s.num_prefill,
                      s.decode_context_tokens, strict=True))
    # a's gap ending at 0.2 is a step of a alone, which also finished c's prefill
    assert rows[0] == (0.2, 1.0, 80.0, 1.0, 50 + 2)
    # the step ending at 0.3: a and c decoding, b's 200 new tokens prefilled
    at3 = [r for r in rows if r[0] == 0.3]
    assert {r[1:4] for r in at3} == {(2.0, 200.0, 1.0)}
    assert at3[0][4] == (50 + 3) + (80 + 2)
    # c's gap from 0.4 to 0.6 spans the step ending at 0.5: left out
    assert s.num_dropped == 1
    assert len(s) == 5 + 3 + 2
    assert s.weight[s.end_time.round(3) == 0.6].tolist() == [1 / 3] * 2  # a and b; not c


def test_stray_arrivals_do_not_cut_a_step_in_two() -> None:
    # four requests decode in steps 30 ms apart; a fifth request's first token arrives alone
    # 12 ms after a step (a late hand-over): it is no step of its own, and its gap to the next
    # step is no whole step either
    base = [0.03 * k for k in range(1, 11)]
    recs = [rec(f"r{i}", [t + 0.0001 * i for t in base]) for i in range(4)]
    recs.append(rec("late", [0.162, 0.18, 0.21, 0.24]))
    s = step_samples(recs)
    assert s.num_dropped == 1  # 0.162 -> 0.18
    assert len(s) == 4 * 9 + 2
    assert np.all(np.abs(s.gap_s - 0.03) < 0.001)


def twin_runs(truth: StepParams, loads: list[ClosedLoad | OpenLoad],
              wcfg: WorkloadConfig = WCFG) -> list[tuple[str, StepSamples, bool]]:
    base = vllm_calibration_for(get_gpu("h200"))
    cal = truth.calibration(base, "bf16", "test truth")
    hw = hardware()
    spec = EngineSpec(hw.gpu, hw.model, hw.precision, engine_model="vllm", calibration=cal)
    runs = []
    for i, load in enumerate(loads):
        recs = run_point(spec, wcfg, load, duration_s=40.0, warmup_s=5.0, seed=i + 1).records
        runs.append((str(load.value), step_samples(recs), True))
    return runs


@pytest.mark.slow
def test_the_fit_recovers_the_engines_constants_from_its_records() -> None:
    hw = hardware()
    runs = twin_runs(TRUTH, [ClosedLoad(1), ClosedLoad(8), ClosedLoad(48), ClosedLoad(128),
                             OpenLoad(6.0)])
    prior = replace(TRUTH, decode_fixed_s=0.02, prefill_extra_s=0.01, per_seq_s=0.0,
                    launch_s=0.001, attn_eff=0.5)
    fit = fit_steps(hw, prior, runs, held=("bandwidth_eff", "gemm_eff"))
    got = fit.params
    assert got.launch_s == pytest.approx(TRUTH.launch_s, rel=0.05)
    assert got.decode_fixed_s == pytest.approx(TRUTH.decode_fixed_s, rel=0.10)
    assert got.per_seq_s == pytest.approx(TRUTH.per_seq_s, rel=0.10)
    assert got.prefill_extra_s == pytest.approx(TRUTH.prefill_extra_s, abs=0.0015)
    for p in fit.points:  # the twin has no noise: every point's mean step is the model's
        assert abs(p.rel_error) < 0.01, p
    assert fit.band < 0.01
    assert fit.rms_rel_residual < 0.05


@pytest.mark.slow
def test_the_kv_caches_read_rate_is_told_from_the_weights_only_over_long_contexts() -> None:
    # an engine whose attention reads the KV cache at half the weights' rate (as Triton's
    # paged attention on the H200 with CUDA graphs: 0.36 against 0.67)
    hw = hardware()
    truth = replace(TRUTH, launch_s=0.0005, kv_read_eff=0.35)
    held = ("bandwidth_eff", "gemm_eff")
    prior = replace(truth, kv_read_eff=truth.bandwidth_eff, decode_fixed_s=0.01)
    long = WorkloadConfig(system_prompt_tokens=2048,
                          lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm"))
    runs = twin_runs(truth, [ClosedLoad(8), ClosedLoad(48)], long)
    fit = fit_steps(hw, prior, runs, held=held)
    assert fit.params.kv_read_eff == pytest.approx(0.35, rel=0.05)
    assert "kv_read_eff" not in fit.held
    # steps that read no KV cache at all (their contexts taken out): nothing tells its rate,
    # and the fit holds it at the weights' instead of leaving it where a flat direction did
    blind = [(label, replace(s, decode_context_tokens=s.decode_context_tokens * 0.0,
                             prefill_cached_tokens=s.prefill_cached_tokens * 0.0), on)
             for label, s, on in runs]
    fit = fit_steps(hw, prior, blind, held=held)
    assert "kv_read_eff" in fit.held
    assert fit.params.kv_read_eff == truth.bandwidth_eff


def test_a_fit_refuses_too_few_steps_and_unknown_constants() -> None:
    from chatfleet.core.errors import ChatfleetError

    hw = hardware()
    s = step_samples([rec("a", [0.1, 0.2, 0.3])])
    with pytest.raises(ChatfleetError, match="at least"):
        fit_steps(hw, TRUTH, [("one", s, True)])
    with pytest.raises(ChatfleetError, match="unknown constant"):
        fit_steps(hw, TRUTH, [("one", s, True)], held=("warp_speed",))
