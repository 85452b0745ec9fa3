"""Step-time model and its L4 calibration, checked against the concurrency-1 points of
docs/facts.md#l4-calibration-points.

Hand figures used below (Qwen3-8B, docs/facts.md#qwen3-8b):
- streamed BF16 weights = all weights but the input embedding table
  = 2 x 8,190,735,360 - 2 x 151,936 x 4,096 = 15,136,811,008 bytes
- linear parameters = 6,946,075,648 - norms (36 x (2 x 4,096 + 2 x 128) + 4,096)
  = 6,945,767,424; lm_head = 151,936 x 4,096 = 622,329,856
- attention FLOPs per query-key pair = 4 x 36 layers x 32 heads x 128 = 589,824
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.calibration import (
    ASSUMED_DECODE_FIXED_S,
    ASSUMED_EAGER_S,
    ASSUMED_HOST_IO_EFF,
    L4_CALIBRATION,
    C1Point,
    fit_l4,
    step_constants,
)
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.scheduler import Scheduler, SchedulerConfig
from chatfleet.core.engine.step_time import StepTimeModel, attention_pairs
from chatfleet.core.specs import builtin_model, get_gpu, precision

QWEN = builtin_model("qwen3-8b")
L4 = get_gpu("l4")

STREAMED_BF16 = 15_136_811_008
LINEAR = 6_945_767_424
LM_HEAD = 622_329_856
ATTN_PER_PAIR = 589_824
KV_BF16 = 147_456

# docs/facts.md#l4-calibration-points: 512 in, 128 out at concurrency 1
BF16_TOK_S, BF16_TTFT = 13.42, 0.18916
FP8_TOK_S, FP8_TTFT = 24.53, 0.14072
BF16_ITL = (128 / BF16_TOK_S - BF16_TTFT) / 127  # 0.0736129 s
L4_CALIBRATION_POINT_BF16 = C1Point("bf16", "bf16", 512, 128, BF16_TOK_S, BF16_TTFT)


def model_for(weights: str, kv: str | None = None) -> StepTimeModel:
    prec = precision(weights, kv or weights)
    return StepTimeModel(QWEN, L4, prec, step_constants(L4, QWEN, prec))


BF16 = model_for("bf16")
FP8 = model_for("fp8")


def hand_bandwidth() -> float:
    """Bytes/s that make a BF16 decode step at the mean context (576) last BF16_ITL."""
    return (STREAMED_BF16 + 576 * KV_BF16) / (BF16_ITL - ASSUMED_DECODE_FIXED_S)


def test_hand_figures() -> None:
    assert STREAMED_BF16 == 2 * 8_190_735_360 - 2 * 151_936 * 4096
    assert QWEN.streamed_weight_bytes("bf16") == STREAMED_BF16
    assert QWEN.linear_params == LINEAR
    assert abs(BF16_ITL - 0.0736129) < 1e-7


def test_c1point_itl() -> None:
    p = C1Point("bf16", "bf16", 512, 128, BF16_TOK_S, BF16_TTFT)
    assert p.itl_s == pytest.approx(0.0736129, abs=1e-7)


# ------------------------------------------------------------------------------------------
# the fit reproduces its inputs


def test_bf16_decode_reproduces_the_measured_time_per_token() -> None:
    # the context grows from 513 to 639 over the 127 decode steps: mean 576
    assert BF16.decode_s(1, 576) == pytest.approx(BF16_ITL, rel=1e-9)
    mean = sum(BF16.decode_s(1, 513 + j) for j in range(127)) / 127
    assert mean == pytest.approx(BF16_ITL, rel=1e-9)


def test_bf16_prefill_reproduces_the_measured_ttft() -> None:
    pairs = 512 * 513 / 2
    assert attention_pairs(0, 512) == pairs
    assert BF16.prefill_s(512, pairs, 0, 1) == pytest.approx(BF16_TTFT, rel=1e-9)


def test_fp8_prefill_reproduces_the_measured_ttft() -> None:
    assert FP8.prefill_s(512, 512 * 513 / 2, 0, 1) == pytest.approx(FP8_TTFT, rel=1e-9)


def run_c1(weights: str) -> EngineRequest:
    """One 512-in / 128-out request alone on an L4 scheduler, in virtual time."""
    sched = Scheduler(SchedulerConfig(pool_tokens=24_093), model_for(weights))
    req = EngineRequest("c1", list(range(512)), list(range(1000, 1128)), 128)
    sched.add_request(req, 0.0)
    now = 0.0
    while sched.has_work():
        step = sched.schedule(now)
        assert step is not None
        sched.complete(step.end)
        now = step.end
    assert len(sched.token_times(req)) == 128
    return req


def test_concurrency_one_bf16_end_to_end() -> None:
    req = run_c1("bf16")
    assert req.first_token_time == pytest.approx(BF16_TTFT, rel=1e-9)
    assert req.finish_time is not None
    assert 128 / req.finish_time == pytest.approx(BF16_TOK_S, rel=1e-9)


def test_fp8_decode_is_predicted_within_10_percent() -> None:
    req = run_c1("fp8")
    assert req.first_token_time == pytest.approx(FP8_TTFT, rel=1e-9)
    assert req.finish_time is not None
    predicted = 128 / req.finish_time
    assert predicted == pytest.approx(FP8_TOK_S, rel=0.10)
    # and it is a prediction: nothing in the fit uses the FP8 token rate
    other = fit_l4(points=(L4_CALIBRATION_POINT_BF16,
                           C1Point("fp8", "fp8", 512, 128, 99.0, FP8_TTFT)))
    assert other.bandwidth_eff == L4_CALIBRATION.bandwidth_eff
    assert other.gemm_eff == L4_CALIBRATION.gemm_eff
    assert other.prefill_fixed_s == L4_CALIBRATION.prefill_fixed_s


@pytest.mark.parametrize(
    "kwargs",
    [
        {"decode_fixed_s": 0.08},  # more than the whole 73.6 ms per token
        {"bf16_gemm_eff": 0.05},  # 512-token GEMMs alone would take over 1 s
        {"bf16_gemm_eff": 1.0},  # leaves FP8's TTFT below its own weight streaming
    ],
)
def test_fit_rejects_impossible_assumptions(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        fit_l4(**kwargs)


# ------------------------------------------------------------------------------------------
# decode


def test_decode_time_per_kv_token_by_hand() -> None:
    slope = KV_BF16 / hand_bandwidth()  # ~0.70 us per token of context read
    assert BF16.decode_s(1, 10_576) - BF16.decode_s(1, 576) == pytest.approx(
        10_000 * slope, rel=1e-9)
    assert slope == pytest.approx(6.99e-7, rel=0.01)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 64), st.integers(0, 500_000), st.integers(1, 100_000))
def test_decode_time_grows_with_kv_tokens(batch: int, kv: int, more: int) -> None:
    assert BF16.decode_s(batch, kv + more) > BF16.decode_s(batch, kv)


def test_decode_eager_jump_above_cuda_graph_limit() -> None:
    assert BF16.cuda_graph_max_bs == 24  # SGLang's default on a 24 GB card
    kv = 24 * 2600
    # memory-bound at these sizes: the batch size alone does not change the time...
    assert BF16.decode_s(24, kv) == pytest.approx(BF16.decode_s(23, kv), abs=1e-12)
    # ...until the batch leaves the CUDA graph
    assert BF16.decode_s(25, kv) - BF16.decode_s(24, kv) == pytest.approx(ASSUMED_EAGER_S,
                                                                            abs=1e-12)
    assert ASSUMED_EAGER_S > 0


def test_decode_becomes_compute_bound_for_huge_batches() -> None:
    # per token: 2 x (linear + lm_head) FLOPs at 50% of 121 TFLOPS
    per_token = 2 * (LINEAR + LM_HEAD) / (121e12 * 0.5)
    batch = 20_000  # far beyond any real batch, so compute wins
    t = BF16.decode_s(batch, 0)
    assert t == pytest.approx(ASSUMED_DECODE_FIXED_S + ASSUMED_EAGER_S + batch * per_token,
                              rel=1e-9)


def test_memory_factor_scales_the_memory_part() -> None:
    base = BF16.decode_s(1, 1000) - ASSUMED_DECODE_FIXED_S
    slow = BF16.decode_s(1, 1000, mem_factor=2.0) - ASSUMED_DECODE_FIXED_S
    assert slow == pytest.approx(2 * base, rel=1e-12)
    # decode at batch 1 is memory-bound: an SM slowdown alone costs nothing
    assert BF16.decode_s(1, 1000, sm_factor=2.0) == pytest.approx(BF16.decode_s(1, 1000))


# ------------------------------------------------------------------------------------------
# prefill


def test_prefill_is_compute_bound_at_2048_tokens() -> None:
    fixed = L4_CALIBRATION.prefill_fixed_s
    pairs = 2048 * 2049 / 2
    attn = pairs * ATTN_PER_PAIR / (121e12 * 0.5)
    gemm = (2 * LINEAR * 2048 + 2 * LM_HEAD) / (121e12 * 0.5)  # ~0.470 s
    weights = STREAMED_BF16 / (hand_bandwidth())  # ~0.072 s
    assert gemm > weights
    assert BF16.prefill_s(2048, pairs, 0, 1) == pytest.approx(fixed + gemm + attn, rel=1e-9)
    assert gemm == pytest.approx(0.4703, abs=1e-3)


def test_prefill_is_weight_bound_at_one_token() -> None:
    fixed = L4_CALIBRATION.prefill_fixed_s
    weights = STREAMED_BF16 / hand_bandwidth()
    gemm = (2 * LINEAR + 2 * LM_HEAD) / (121e12 * 0.5)
    attn = 1 * ATTN_PER_PAIR / (121e12 * 0.5)
    assert weights > gemm
    assert BF16.prefill_s(1, 1, 0, 1) == pytest.approx(fixed + weights + attn, rel=1e-9)


def test_prefill_sm_factor_scales_compute() -> None:
    fixed = L4_CALIBRATION.prefill_fixed_s
    pairs = attention_pairs(0, 2048)
    base = BF16.prefill_s(2048, pairs, 0, 1) - fixed
    slow = BF16.prefill_s(2048, pairs, 0, 1, sm_factor=2.0) - fixed
    assert slow == pytest.approx(2 * base, rel=1e-12)


def test_prefill_reads_the_cached_prefix() -> None:
    pairs = attention_pairs(1000, 100)
    base = BF16.prefill_s(100, pairs, 0, 1)
    with_cache = BF16.prefill_s(100, pairs, 1000, 1)
    assert with_cache - base == pytest.approx(1000 * KV_BF16 / hand_bandwidth(), rel=1e-9)


def test_a_load_back_runs_beside_the_prefill_layer_by_layer() -> None:
    """HiCache copies the loaded KV on its own stream, layer by layer, and each layer waits
    for its own copy: the step takes the longer of the forward pass and the copy, plus one of
    the 36 layers' share of the shorter."""
    pairs = attention_pairs(1000, 100)
    fixed = L4_CALIBRATION.prefill_fixed_s
    forward = BF16.prefill_s(100, pairs, 0, 1) - fixed
    link = 64e9 / 2 * ASSUMED_HOST_IO_EFF  # the L4 datasheet's PCIe Gen4 x16, one direction
    assert BF16.host_transfer_s(1000) == pytest.approx(1000 * KV_BF16 / link, rel=1e-12)
    small = 1000 * KV_BF16 / link  # 5.8 ms, well under the forward pass (about 75 ms)
    assert BF16.prefill_s(100, pairs, 0, 1, load_back_tokens=1000) == pytest.approx(
        fixed + forward + small / 36, rel=1e-9)
    big = 20_000 * KV_BF16 / link  # 115 ms: now the copy is the longer
    assert big > forward
    assert BF16.prefill_s(100, pairs, 0, 1, load_back_tokens=20_000) == pytest.approx(
        fixed + big + forward / 36, rel=1e-9)
    # either way far less than copying first and computing after
    assert BF16.prefill_s(100, pairs, 0, 1, load_back_tokens=20_000) < fixed + forward + big


def test_attention_pairs_by_hand() -> None:
    assert attention_pairs(0, 1) == 1
    assert attention_pairs(0, 3) == 6  # 1 + 2 + 3
    assert attention_pairs(10, 3) == 36  # 11 + 12 + 13


def test_recompute_chunks_like_the_scheduler() -> None:
    # 5000 tokens in chunks of 2048: 2048 + 2048 + 904, logits only in the last one
    expected = (BF16.prefill_s(2048, attention_pairs(0, 2048), 0, 0)
                + BF16.prefill_s(2048, attention_pairs(2048, 2048), 2048, 0)
                + BF16.prefill_s(904, attention_pairs(4096, 904), 4096, 1))
    assert BF16.recompute_s(5000) == pytest.approx(expected, rel=1e-12)
    assert BF16.recompute_s(0) == 0


def test_recompute_after_a_cached_prefix_reads_it_and_attends_over_it() -> None:
    # 3000 new tokens after 1000 cached: chunks of 2048 + 952 starting at 1000
    expected = (BF16.prefill_s(2048, attention_pairs(1000, 2048), 1000, 0)
                + BF16.prefill_s(952, attention_pairs(3048, 952), 3048, 1))
    assert BF16.recompute_s(3000, cached=1000) == pytest.approx(expected, rel=1e-12)
    assert BF16.recompute_s(3000, cached=1000) > BF16.recompute_s(3000)
