"""Specs and KV pool sizing: expected values are docs/facts.md's facts or worked out by hand."""

from __future__ import annotations

import math

import pytest

from chatfleet.core.calibration import calibration_for
from chatfleet.core.memory import (
    CALIBRATED_GPUS,
    default_mem_fraction_static,
    kv_pool_tokens,
    plan_pool,
)
from chatfleet.core.specs import (
    GIB,
    GPUS,
    QWEN3_8B_CONFIG,
    SpecError,
    builtin_model,
    get_gpu,
    model_from_config,
)

QWEN = builtin_model("qwen3-8b")
L4 = get_gpu("l4")

# Llama-3-70B-shaped config: ~141 GB of BF16 weights, far beyond an L4.
LLAMA_70B_LIKE = {
    "model_type": "llama",
    "num_hidden_layers": 80,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}


# ------------------------------------------------------------------------------------------
# parameter counts and bytes


def test_qwen3_8b_parameter_counts_match_design() -> None:
    assert QWEN.total_params == 8_190_735_360
    assert QWEN.non_embedding_params == 6_946_075_648


def test_qwen3_8b_parameter_count_by_hand() -> None:
    # one layer: q (4096x4096), k and v (1024x4096 each), o (4096x4096), gate/up/down
    # (3 x 4096x12288), two RMSNorms (2 x 4096) and q/k norms (2 x 128)
    attn = 4096 * 4096 * 2 + 1024 * 4096 * 2
    mlp = 3 * 4096 * 12288
    norms = 2 * 4096 + 2 * 128
    per_layer = attn + mlp + norms
    non_embedding = 36 * per_layer + 4096  # final norm
    embeddings = 2 * 151_936 * 4096  # untied: input table and lm_head
    assert non_embedding == 6_946_075_648
    assert non_embedding + embeddings == 8_190_735_360


def test_weight_gib_bf16_and_fp8() -> None:
    assert round(QWEN.weight_bytes("bf16") / GIB, 3) == 15.256
    assert round(QWEN.weight_bytes("fp8") / GIB, 3) == 8.789


def test_fp8_weights_by_hand() -> None:
    # linear weights 1 byte each plus one float32 scale per 128x128 block; embeddings,
    # lm_head and norms in bf16
    blocks_per_layer = (32 * 32) + 2 * (8 * 32) + (32 * 32) + 2 * (96 * 32) + (32 * 96)
    linear = 6_946_075_648 - (36 * (2 * 4096 + 2 * 128) + 4096)
    other = 8_190_735_360 - linear
    expected = linear + 4 * 36 * blocks_per_layer + 2 * other
    assert QWEN.weight_bytes("fp8") == expected


def test_kv_bytes_per_token() -> None:
    # layers x kv_heads x head_dim x 2 (K and V) x dtype bytes
    assert QWEN.kv_bytes_per_token("bf16") == 36 * 8 * 128 * 2 * 2 == 147_456
    assert QWEN.kv_bytes_per_token("fp8") == 73_728


def test_model_from_config_reads_hf_keys() -> None:
    m = model_from_config("q", QWEN3_8B_CONFIG)
    assert (m.num_layers, m.hidden_size, m.num_kv_heads, m.head_dim) == (36, 4096, 8, 128)
    assert m.total_params == 8_190_735_360
    # head_dim defaults to hidden / heads, kv heads to heads
    cfg = {k: v for k, v in QWEN3_8B_CONFIG.items() if k not in ("head_dim",
                                                                 "num_key_value_heads")}
    m2 = model_from_config("q2", cfg)
    assert m2.head_dim == 4096 // 32
    assert m2.num_kv_heads == 32


# ------------------------------------------------------------------------------------------
# SGLang's default mem_fraction_static


def test_default_mem_fraction_l4_by_hand() -> None:
    # 23,034 MiB sits in the 20-35 GiB tier: chunked prefill 2048, CUDA graphs up to 24
    reserved = 512 + 2048 * 1.5 + 24 * 2 + 1 * 1 / 8 * 1024
    assert reserved == 3760
    assert round((23034 - reserved) / 23034, 3) == 0.837
    assert default_mem_fraction_static(23034) == 0.837


@pytest.mark.parametrize("total_mib", [81920, 81559])
def test_default_mem_fraction_80gb_reserves_at_least_10_gib(total_mib: int) -> None:
    m = default_mem_fraction_static(total_mib)
    assert m <= (total_mib - 10240) / total_mib
    # by hand: tier 60-160 GiB, chunk 8192, graphs 256: 512 + 12288 + 512 + 128 = 13440 MiB
    assert m == round((total_mib - 13440) / total_mib, 3)


# ------------------------------------------------------------------------------------------
# pool sizing


def test_plan_pool_l4_bf16_matches_measurement() -> None:
    plan = plan_pool(L4, QWEN, "bf16", "bf16")
    assert plan.kv_pool_tokens == pytest.approx(24_094, rel=0.005)
    assert plan.mem_fraction_static == 0.837
    assert plan.kv_bytes_per_token == 147_456
    assert round(plan.free_gib * plan.mem_fraction_static, 3) == 18.565
    assert plan.calibrated is True


def test_plan_pool_l4_fp8_matches_measurement() -> None:
    plan = plan_pool(L4, QWEN, "fp8", "fp8")
    assert plan.kv_pool_tokens == pytest.approx(142_369, rel=0.005)
    assert round(plan.free_gib * plan.mem_fraction_static, 3) == 18.565


def test_mixed_precisions_follow_the_same_rule() -> None:
    bf16 = plan_pool(L4, QWEN, "bf16", "bf16")
    fp8 = plan_pool(L4, QWEN, "fp8", "fp8")
    mixed = plan_pool(L4, QWEN, "fp8", "bf16")
    # same P and m as the pure plans
    assert mixed.free_gib == bf16.free_gib == fp8.free_gib
    assert mixed.mem_fraction_static == bf16.mem_fraction_static
    p_m = mixed.free_gib * mixed.mem_fraction_static
    w_fp8 = QWEN.weight_bytes("fp8") / GIB
    assert mixed.kv_pool_tokens == math.floor((p_m - w_fp8) * GIB / 147_456)
    # by hand from the rounded figures of docs/facts.md#sglang-kv-pool-sizing:
    # (18.565 - 8.789) GiB / 147,456 B = 71,188
    assert mixed.kv_pool_tokens == pytest.approx((18.565 - 8.789) * GIB / 147_456, rel=1e-3)
    assert bf16.kv_pool_tokens < mixed.kv_pool_tokens < fp8.kv_pool_tokens
    # the other mix: BF16 weights with an FP8 KV cache
    other = plan_pool(L4, QWEN, "bf16", "fp8")
    assert other.kv_pool_tokens == pytest.approx((18.565 - 15.256) * GIB / 73_728, rel=1e-3)
    assert bf16.kv_pool_tokens < other.kv_pool_tokens < fp8.kv_pool_tokens


def test_kv_pool_tokens_formula_small_numbers() -> None:
    # (10 GiB * 0.5 - 3 GiB) = 2 GiB over 1 MiB per token = 2048 tokens
    assert kv_pool_tokens(10.0, 0.5, 3.0, 1 << 20) == 2048
    assert kv_pool_tokens(10.0, 0.5, 6.0, 1 << 20) == 0  # never negative


def test_requests_and_prompts_fit() -> None:
    plan = plan_pool(L4, QWEN, "bf16", "bf16")
    pool = plan.kv_pool_tokens
    assert plan.requests_fit == (pool - 2048) // 640
    assert plan.prompts_fit == pool // 2048
    # with the measured 24,094-token pool: 22,046 / 640 = 34.4 and 24,094 / 2,048 = 11.8
    assert plan.requests_fit == 34
    assert plan.prompts_fit == 11
    other = plan_pool(L4, QWEN, "bf16", "bf16", request_tokens=1000, system_prompt_tokens=4000)
    assert other.requests_fit == (pool - 4000) // 1000 == 20
    assert other.prompts_fit == pool // 4000 == 6


def test_explicit_mem_fraction_is_used() -> None:
    lo = plan_pool(L4, QWEN, "bf16", "bf16", mem_fraction=0.80)
    hi = plan_pool(L4, QWEN, "bf16", "bf16", mem_fraction=0.90)
    assert lo.mem_fraction_static == 0.80
    # 0.1 of P more memory, all of it KV
    extra = (hi.free_gib * 0.10) * GIB / 147_456
    assert hi.kv_pool_tokens - lo.kv_pool_tokens == pytest.approx(extra, abs=1)


@pytest.mark.parametrize("name", sorted(GPUS))
def test_only_the_l4_is_calibrated(name: str) -> None:
    gpu = get_gpu(name)
    plan = plan_pool(gpu, QWEN, "fp8", "fp8")
    expected = name == "l4"
    assert plan.calibrated is expected
    assert calibration_for(gpu).calibrated is expected
    assert (name in CALIBRATED_GPUS) is expected


def test_gpu_aliases_and_case() -> None:
    assert get_gpu(" L4 ").name == "l4"
    assert get_gpu("h100").name == "h100-sxm"
    assert get_gpu("A100").name == "a100-80gb"


# ------------------------------------------------------------------------------------------
# bad input


def test_unknown_gpu_and_model() -> None:
    with pytest.raises(SpecError, match="unknown GPU"):
        get_gpu("rtx-9090")
    with pytest.raises(SpecError, match="unknown model"):
        builtin_model("llama-3-70b")


def test_config_missing_fields() -> None:
    cfg = {k: v for k, v in QWEN3_8B_CONFIG.items() if k not in ("hidden_size", "vocab_size")}
    with pytest.raises(SpecError, match="hidden_size") as exc:
        model_from_config("broken", cfg)
    assert "vocab_size" in str(exc.value)


def test_config_non_integer_and_non_positive_fields() -> None:
    with pytest.raises(SpecError):
        model_from_config("x", {**QWEN3_8B_CONFIG, "hidden_size": "big"})
    with pytest.raises(SpecError):
        model_from_config("x", {**QWEN3_8B_CONFIG, "num_hidden_layers": 0})
    with pytest.raises(SpecError):
        model_from_config("x", {**QWEN3_8B_CONFIG, "num_key_value_heads": -8})


def test_config_zero_heads_is_a_spec_error() -> None:
    cfg = {k: v for k, v in QWEN3_8B_CONFIG.items() if k != "head_dim"}
    with pytest.raises(SpecError):
        model_from_config("x", {**cfg, "num_attention_heads": 0})


@pytest.mark.parametrize("tokens", [0, -1, -640])
def test_non_positive_request_tokens(tokens: int) -> None:
    with pytest.raises(SpecError):
        plan_pool(L4, QWEN, "bf16", "bf16", request_tokens=tokens)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_mem_fraction_outside_unit_interval(fraction: float) -> None:
    with pytest.raises(SpecError):
        plan_pool(L4, QWEN, "bf16", "bf16", mem_fraction=fraction)


def test_unknown_precision() -> None:
    with pytest.raises(SpecError):
        plan_pool(L4, QWEN, "fp16", "bf16")
    with pytest.raises(SpecError):
        plan_pool(L4, QWEN, "bf16", "int4")


def test_70b_on_an_l4_leaves_no_pool() -> None:
    big = model_from_config("llama-70b-like", LLAMA_70B_LIKE)
    assert big.weight_bytes("bf16") / GIB > 100
    with pytest.raises(SpecError, match="no KV pool"):
        plan_pool(L4, big, "bf16", "bf16")
    with pytest.raises(SpecError):
        plan_pool(L4, big, "fp8", "fp8")


def test_pool_smaller_than_one_request() -> None:
    # the BF16 pool holds ~24,094 tokens: 2,048 + 23,000 does not fit, 2,048 + 22,000 does
    with pytest.raises(SpecError, match="smaller than one request"):
        plan_pool(L4, QWEN, "bf16", "bf16", request_tokens=23_000)
    with pytest.raises(SpecError):
        plan_pool(L4, QWEN, "bf16", "bf16", request_tokens=30_000, system_prompt_tokens=0)
    ok = plan_pool(L4, QWEN, "bf16", "bf16", request_tokens=22_000)
    assert ok.requests_fit == 1  # 22,045 // 22,000
