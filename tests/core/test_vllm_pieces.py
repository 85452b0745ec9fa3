"""The vLLM model's pieces: its block pool (hash chain, free queue), its mixed-step time and its
memory rule."""

from __future__ import annotations

import pytest

from chatfleet.core.calibration import L4_CALIBRATION
from chatfleet.core.engine.block_pool import BlockPool, chain_keys, common_blocks, token_bytes
from chatfleet.core.engine.mixed_step import MixedStepModel
from chatfleet.core.engine.step_time import StepTimeModel, attention_pairs
from chatfleet.core.memory import plan_vllm_pool, vllm_defaults
from chatfleet.core.specs import SpecError, builtin_model, get_gpu, precision

QWEN = builtin_model("qwen3-8b")

# --- block pool ----------------------------------------------------------------------------


def test_block_hashes_chain_so_a_prefix_shares_keys_until_the_first_difference() -> None:
    a = token_bytes(range(64))
    b = token_bytes([*range(20), 999, *range(21, 64)])  # differs inside block 1
    ka, kb = chain_keys(a, [], 10), chain_keys(b, [], 10)
    assert len(ka) == len(kb) == 4  # only full blocks, never past the tokens
    assert ka[0] == kb[0] and ka[1] != kb[1]
    assert ka[2] != kb[2] and ka[3] != kb[3]  # the chain: every later block differs too
    assert chain_keys(a, [], 4) == ka  # deterministic
    assert chain_keys(a, ka[:2], 4) == ka  # extending a chain gives the same keys
    assert common_blocks(a, b, 10) == 1 and common_blocks(a, a, 3) == 3
    assert common_blocks(a, token_bytes(range(40)), 10) == 2  # only whole blocks


def test_free_queue_order_and_eviction_by_hand() -> None:
    pool = BlockPool(num_gpu_blocks=7)  # 6 usable
    assert pool.num_free() == 6 and pool.usage() == 0.0
    pool.take(3)  # a request's 3 blocks: two full ones get hashes, one stays partial
    held = pool.cache([11, 12])
    assert pool.usage() == pytest.approx(0.5)
    pool.free(held, 1)  # freed last first: 12 then 11 at the tail, the partial at the head
    assert [b.key for b in pool.cached_free] == [12, 11]
    assert pool.num_empty_free == 4 and pool.num_free() == 6
    assert [b.key for b in pool.longest_hit([11, 12], 2)] == [11, 12]
    assert pool.take(5) == 1  # 4 empty ones, then block 12 (the request's last) is evicted
    assert [b.key for b in pool.longest_hit([11, 12], 2)] == [11]
    assert pool.num_evicted_blocks == 1
    with pytest.raises(ValueError, match="cannot take"):
        pool.take(2)


def test_a_hit_takes_a_free_block_out_of_the_queue_and_reset_waits_for_holders() -> None:
    pool = BlockPool(num_gpu_blocks=5)
    pool.take(1)
    blocks = pool.cache([7])
    pool.free(blocks, 0)
    hit = pool.longest_hit([7], 1)
    assert pool.num_evictable(hit) == 1
    pool.touch(hit)
    assert pool.num_free() == 3 and not pool.cached_free
    assert not pool.reset()  # a request holds block 7
    pool.free(hit, 0)
    assert pool.reset() and pool.longest_hit([7], 1) == [] and pool.num_free() == 4


# --- the mixed step ------------------------------------------------------------------------

def mixed(per_seq_s: float = 0.0) -> tuple[MixedStepModel, StepTimeModel]:
    prec = precision("fp8", "fp8")
    c = L4_CALIBRATION.constants(get_gpu("l4"), "fp8")
    return (MixedStepModel(QWEN, get_gpu("l4"), prec, c, per_seq_s, 2048, 512),
            StepTimeModel(QWEN, get_gpu("l4"), prec, c))


def test_a_step_without_prefill_is_a_decode_step_and_without_decodes_a_prefill_step() -> None:
    m, sglang = mixed()
    assert m.step_s(16, 16 * 2600, 0, 0.0, 0, 0, 0) == pytest.approx(
        sglang.decode_s(16, 16 * 2600))
    pairs = attention_pairs(2048, 512)
    assert m.step_s(0, 0, 512, pairs, 2048, 1, 1) == pytest.approx(
        sglang.prefill_s(512, pairs, 2048, 1))


def test_a_mixed_step_streams_the_weights_once() -> None:
    m, _ = mixed()
    pairs = attention_pairs(2048, 512)
    decode = m.step_s(16, 16 * 2600, 0, 0.0, 0, 0, 0)
    prefill = m.step_s(0, 0, 512, pairs, 2048, 1, 1)
    both = m.step_s(16, 16 * 2600, 512, pairs, 2048, 1, 1)
    assert max(decode, prefill) < both < decode + prefill


def test_the_per_sequence_cost_counts_sequences_beyond_the_first() -> None:
    m0, _ = mixed(0.0)
    m1, _ = mixed(0.001)
    assert m1.decode_s(1, 2600) == m0.decode_s(1, 2600)
    assert m1.decode_s(9, 9 * 2600) - m0.decode_s(9, 9 * 2600) == pytest.approx(0.008)
    with pytest.raises(ValueError, match="negative"):
        mixed(-1.0)


# --- the memory rule -----------------------------------------------------------------------

def test_vllms_batch_defaults_follow_the_card() -> None:
    assert (vllm_defaults(get_gpu("l4")).max_num_batched_tokens,
            vllm_defaults(get_gpu("l4")).max_num_seqs) == (2048, 256)
    h200 = vllm_defaults(get_gpu("h200"))
    assert (h200.max_num_batched_tokens, h200.max_num_seqs) == (8192, 1024)
    assert vllm_defaults(get_gpu("a100-80gb")).max_num_batched_tokens == 2048  # A100 excepted
    assert h200.cuda_graph_max_bs == 512 and vllm_defaults(get_gpu("l4")).cuda_graph_max_bs == 512


def test_a_kv_cache_memory_override_matches_the_measured_h200_pool() -> None:
    # the device README: --kv-cache-memory of 24,094 BF16 tokens gave 'GPU KV cache size:
    # 24,080 tokens' (whole 16-token blocks)
    p = plan_vllm_pool(get_gpu("h200"), QWEN, "bf16", "bf16", pool_tokens=24094)
    assert p.kv_pool_tokens == 24080 and p.num_gpu_blocks == 1505


def test_the_pool_grows_with_the_utilization_and_shrinks_with_the_profile_run() -> None:
    card = get_gpu("l4")
    base = plan_vllm_pool(card, QWEN, "fp8", "fp8").kv_pool_tokens
    assert plan_vllm_pool(card, QWEN, "fp8", "fp8",
                          gpu_memory_utilization=0.95).kv_pool_tokens > base
    assert plan_vllm_pool(card, QWEN, "fp8", "fp8",
                          max_num_batched_tokens=8192).kv_pool_tokens < base
    assert plan_vllm_pool(card, QWEN, "bf16", "bf16").kv_pool_tokens < base
    with pytest.raises(SpecError, match="leave no KV cache"):
        plan_vllm_pool(card, QWEN, "bf16", "bf16", gpu_memory_utilization=0.6)
    with pytest.raises(SpecError, match="utilization"):
        plan_vllm_pool(card, QWEN, "bf16", "bf16", gpu_memory_utilization=1.5)
