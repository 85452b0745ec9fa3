"""The twin with the vLLM engine model (`--engine-model vllm`): what mixed batches change
against SGLang's prefill-first scheduler under the same step constants, and the plumbing
(sweep document, CLI, fleet). Every figure is the twin's; none is written in."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.core.calibration import L4_CALIBRATION
from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.slo import SLO
from chatfleet.core.workload import WorkloadConfig
from chatfleet.twin.fleet import FleetConfig, run_fleet_point
from chatfleet.twin.sweep import TwinSweep
from tests.twin.conftest import MIXED, closed, engine

# the SGLang model's L4 constants, no per-sequence cost: the two schedulers on one GPU model
SAME = replace(L4_CALIBRATION, per_seq_s=0.0)


def both(prec: str = "fp8", **kw: Any) -> tuple[EngineSpec, EngineSpec]:
    return (engine(prec, calibration=SAME, **kw),
            engine(prec, calibration=SAME, engine_model="vllm", **kw))


def test_mixed_batches_break_the_waves_and_cut_ttft_at_16_users() -> None:
    # 16 users with fixed lengths finish together and send together. SGLang prefills their
    # prompts batch after batch while every decode waits, so they start decoding, finish and
    # come back together again: the wave re-forms and the last prompt waits for the whole
    # wave. vLLM decodes the first ones while it prefills the rest (mixed steps), so they finish
    # and come back apart: later waves are small and the first token comes sooner.
    sglang, vllm = both()
    ps, pv = closed(sglang, 16).point, closed(vllm, 16).point
    assert pv.ttft_ms.p50 < 0.8 * ps.ttft_ms.p50
    assert pv.ttft_ms.p99 < 0.6 * ps.ttft_ms.p99
    # the same work gets done: the same token rate within a few per cent
    assert pv.output_tok_s == pytest.approx(ps.output_tok_s, rel=0.05)


def test_decodes_ride_along_prefill_chunks_so_the_worst_gap_is_shorter() -> None:
    # with a real length mix there are no waves; a prompt arriving in SGLang stalls every
    # running decode for its whole prefill batch, in vLLM it shares the step with them
    sglang, vllm = both()
    ps = closed(sglang, 16, WorkloadConfig(lengths=MIXED)).point
    pv = closed(vllm, 16, WorkloadConfig(lengths=MIXED)).point
    assert pv.itl_ms.p99 < 0.8 * ps.itl_ms.p99


def test_concurrency_one_is_the_same_in_both_models_under_the_same_constants() -> None:
    sglang, vllm = both()
    wcfg = WorkloadConfig(system_prompt_tokens=0)
    ps, pv = closed(sglang, 1, wcfg).point, closed(vllm, 1, wcfg).point
    assert pv.ttft_ms.p50 == pytest.approx(ps.ttft_ms.p50, rel=1e-6)
    assert pv.tpot_ms.p50 == pytest.approx(ps.tpot_ms.p50, rel=1e-6)


def test_a_full_bf16_pool_preempts_and_every_request_still_finishes() -> None:
    run = closed(engine("bf16", engine_model="vllm"), 64, duration=120.0, warmup=10.0)
    e = run.point.engine
    assert e.num_retractions > 0  # vLLM preempts by recompute when blocks run out
    assert e.max_running < 64 and e.max_queue > 0
    assert e.peak_token_usage > 0.95
    done = [r for r in run.records if r.outcome == "ok"]
    assert done and all(len(r.token_times) == r.output_tokens for r in done)
    assert run.point.requests.failed == 0


def test_the_thermal_model_runs_under_the_vllm_model_too() -> None:
    # the same ThermalState, advanced at step completion and while idle
    p = closed(engine("fp8", engine_model="vllm", thermal=True), 16, duration=120.0,
               warmup=10.0).point
    g = p.gpu
    assert g.modelled.thermal_model is True and g.temp_c.max is not None
    assert g.sm_clock_mhz.min <= g.sm_clock_mhz.p50


def test_decode_runs_keep_a_lone_user_to_a_few_events_per_request() -> None:
    run = closed(engine("fp8", engine_model="vllm"), 1, duration=120.0, warmup=0.0)
    n = run.point.requests.completed
    assert n > 10 and run.num_events <= 4 * n


def test_the_sweep_document_names_the_vllm_model_and_its_settings() -> None:
    doc = TwinSweep(engine("fp8", engine_model="vllm"), WorkloadConfig(), SLO(),
                    duration_s=30.0, warmup_s=0.0).run([ClosedLoad(2)])
    t = doc.target.to_json()
    assert t["engine"] == "twin" and t["engine_model"] == "vllm"
    assert t["engine_models"] == "vllm-0.26.0"
    assert t["calibration"] == "uncalibrated"  # no vLLM run on an L4 was ever measured
    assert t["max_num_batched_tokens"] == 2048 and t["max_num_seqs"] == 256
    assert t["block_size"] == 16 and t["max_total_num_tokens"] == t["num_gpu_blocks"] * 16
    sglang = TwinSweep(engine("fp8"), WorkloadConfig(), SLO(), duration_s=30.0,
                       warmup_s=0.0).run([ClosedLoad(2)]).target.to_json()
    assert sglang["engine_model"] == "sglang" and sglang["engine_models"] == "sglang-0.5"
    assert sglang["calibration"] == "calibrated"


def test_the_fleet_runs_the_gateways_admission_in_front_of_vllm_replicas() -> None:
    fleet = FleetConfig(replicas=2, cap=8, queue_depth=8)
    p = run_fleet_point(engine("fp8", engine_model="vllm"), WorkloadConfig(lengths=MIXED),
                        ClosedLoad(40), fleet, duration_s=60.0,
                        warmup_s=10.0).point
    assert p.fleet.max_in_flight == (8, 8)
    assert p.engine.max_running <= 8 and p.requests.shed > 0


def test_cli_twin_sweep_with_the_vllm_model() -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["twin", "sweep", "--weights", "fp8", "--kv-cache", "fp8",
                              "--engine-model", "vllm", "--concurrency", "1,4",
                              "--duration", "30", "--warmup", "0",
                              "--max-num-batched-tokens", "4096", "--print-json"])
    assert res.exit_code == 0, res.output
    t = json.loads(res.output)["target"]
    assert t["engine_model"] == "vllm" and t["max_num_batched_tokens"] == 4096
    res = runner.invoke(app, ["twin", "sweep", "--engine-model", "vllm", "--concurrency", "1",
                              "--duration", "30", "--warmup", "0"])
    assert res.exit_code == 0, res.output
    assert "vllm model" in res.output and "(uncalibrated)" in " ".join(res.output.split())


@pytest.mark.parametrize(("args", "message"), [
    (["--engine-model", "trt"], "--engine-model"),
    (["--long-prefill-token-threshold", "64"], "--engine-model vllm"),
    (["--engine-model", "vllm", "--eviction", "lfu"], "SGLang's"),
    (["--engine-model", "vllm", "--weights", "fp8", "--kv-cache", "fp8",
      "--max-running-requests", "4096"], "must be at least max_num_seqs"),
    # its sampler's profile run over 4096 rows leaves BF16 weights no KV cache on an L4
    (["--engine-model", "vllm", "--max-running-requests", "4096"], "leave no KV cache"),
])
def test_cli_refuses_flags_the_model_does_not_have(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["twin", "sweep", "--concurrency", "1", "--duration", "10",
                                   *args])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split()) and "Traceback" not in res.output
