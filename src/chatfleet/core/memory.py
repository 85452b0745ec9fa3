"""KV pool sizing, the way SGLang sizes it.

SGLang (model_runner.profile_max_num_token) measures P, the free GPU memory before the weights
load, and after loading them keeps `rest = available - P * (1 - m)` for the KV pool:

    max_total_num_tokens = floor((P * m - W) * 2**30 / kv_bytes_per_token)

with m = mem_fraction_static and W the weights in GiB. When the user does not set m, SGLang
derives it from the card's memory tier (server_args._handle_gpu_memory_settings, v0.5): the tier
fixes chunked_prefill_size and cuda_graph_max_bs, and

    reserved_mib = 512 + max(chunked_prefill_size, 2048) * 1.5 + cuda_graph_max_bs * 2
                   + tp * pp / 8 * 1024            (at least 10 GiB on cards above 60 GiB)
    m = round((total_mib - reserved_mib) / total_mib, 3)

P is the visible total minus what the CUDA context and PyTorch take before the weights load
(CONTEXT_OVERHEAD_MIB below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from chatfleet.core.defaults import SYSTEM_PROMPT_TOKENS
from chatfleet.core.specs import GIB, GPU, Model, SpecError

# Memory the CUDA context, cuBLAS/NCCL handles and PyTorch's allocator hold before SGLang loads
# the weights. Source: the L4 measurement of docs/facts.md#sglang-kv-pool-sizing (23,034 MiB
# visible, pools of 24,094 BF16 and 142,369 FP8 tokens) solved for P with SGLang's default
# m = 0.837: both pools give 321 MiB, which is the size of a CUDA 12 context on an Ada card.
# Used for every GPU (uncalibrated there).
CONTEXT_OVERHEAD_MIB = 321.0

# The GPUs whose figures come from a measurement (docs/facts.md#l4-calibration-points). Every
# other card is marked uncalibrated in every output until a calibration profile exists for it.
CALIBRATED_GPUS = frozenset({"l4"})

# The tokens one request adds to the pool when nothing else is said: the reference request,
# 512 user tokens in and 128 answer tokens out (docs/facts.md#l4-calibration-points).
REQUEST_TOKENS = 640


@dataclass(frozen=True, slots=True)
class TierDefaults:
    chunked_prefill_size: int
    cuda_graph_max_bs: int


def tier_defaults(total_mib: float, tp_size: int = 1) -> TierDefaults:
    """SGLang's per-memory-tier defaults (server_args, v0.5)."""
    if total_mib < 20 * 1024:
        return TierDefaults(2048, 8)
    if total_mib < 35 * 1024:
        return TierDefaults(2048, 24 if tp_size < 4 else 80)
    if total_mib < 60 * 1024:
        return TierDefaults(4096, 32 if tp_size < 4 else 160)
    if total_mib < 160 * 1024:
        return TierDefaults(8192, 256 if tp_size < 4 else 512)
    return TierDefaults(16384, 512)


def default_mem_fraction_static(total_mib: float, tp_size: int = 1, pp_size: int = 1) -> float:
    """SGLang's default mem_fraction_static for a card with `total_mib` of memory."""
    tier = tier_defaults(total_mib, tp_size)
    reserved = 512.0
    reserved += max(tier.chunked_prefill_size, 2048) * 1.5
    reserved += tier.cuda_graph_max_bs * 2
    reserved += tp_size * pp_size / 8 * 1024
    if total_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((total_mib - reserved) / total_mib, 3)


@dataclass(frozen=True, slots=True)
class PoolPlan:
    gpu: str
    model: str
    weights: str
    kv_cache: str
    visible_gib: float
    free_gib: float  # P
    mem_fraction_static: float  # m
    weights_gib: float  # W
    kv_bytes_per_token: int
    kv_pool_tokens: int
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    request_tokens: int
    system_prompt_tokens: int
    requests_fit: int
    prompts_fit: int
    calibrated: bool

    def to_json(self) -> dict[str, object]:
        return {
            "gpu": self.gpu,
            "model": self.model,
            "weights": self.weights,
            "kv_cache": self.kv_cache,
            "calibrated": self.calibrated,
            "visible_gib": round(self.visible_gib, 3),
            "free_gib": round(self.free_gib, 3),
            "mem_fraction_static": self.mem_fraction_static,
            "weights_gib": round(self.weights_gib, 3),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_pool_tokens": self.kv_pool_tokens,
            "kv_pool_gib": round(self.kv_pool_tokens * self.kv_bytes_per_token / GIB, 3),
            "chunked_prefill_size": self.chunked_prefill_size,
            "cuda_graph_max_bs": self.cuda_graph_max_bs,
            "request_tokens": self.request_tokens,
            "system_prompt_tokens": self.system_prompt_tokens,
            "requests_fit": self.requests_fit,
            "prompts_fit": self.prompts_fit,
        }


def kv_pool_tokens(free_gib: float, mem_fraction: float, weights_gib: float,
                   kv_bytes_per_token: int) -> int:
    """SGLang's formula: floor((P*m - W) * 2^30 / bytes_per_token), never below zero."""
    rest = free_gib * mem_fraction - weights_gib
    return max(0, math.floor(rest * GIB / kv_bytes_per_token))


def plan_pool(
    gpu: GPU,
    model: Model,
    weights: str,
    kv_cache: str,
    *,
    mem_fraction: float | None = None,
    request_tokens: int = REQUEST_TOKENS,
    system_prompt_tokens: int = SYSTEM_PROMPT_TOKENS,
    context_overhead_mib: float = CONTEXT_OVERHEAD_MIB,
) -> PoolPlan:
    """Size the KV pool and count what fits in it.

    requests_fit = (pool - one shared system prompt) // request_tokens: the shared prompt is
    cached once in the radix tree and every request adds its own tokens.
    prompts_fit = pool // system_prompt_tokens: distinct shared prompts the pool can hold.
    """
    if request_tokens <= 0:
        raise SpecError("request tokens must be positive")
    if system_prompt_tokens < 0:
        raise SpecError("system prompt tokens must not be negative")
    if mem_fraction is not None and not 0.0 < mem_fraction < 1.0:
        raise SpecError("mem fraction must be between 0 and 1")
    tier = tier_defaults(gpu.visible_mib)
    m = mem_fraction if mem_fraction is not None else default_mem_fraction_static(gpu.visible_mib)
    free_gib = (gpu.visible_mib - context_overhead_mib) / 1024
    w_gib = model.weight_bytes(weights) / GIB
    kvb = model.kv_bytes_per_token(kv_cache)
    pool = kv_pool_tokens(free_gib, m, w_gib, kvb)
    if pool <= 0:
        raise SpecError(
            f"{model.name} {weights} weights ({w_gib:.2f} GiB) leave no KV pool on {gpu.name} "
            f"(P*m = {free_gib * m:.2f} GiB)"
        )
    if pool < system_prompt_tokens + request_tokens:
        raise SpecError(
            f"the KV pool of {pool} tokens is smaller than one request "
            f"({system_prompt_tokens} system + {request_tokens} request tokens)"
        )
    return PoolPlan(
        gpu=gpu.name,
        model=model.name,
        weights=weights,
        kv_cache=kv_cache,
        visible_gib=gpu.visible_mib / 1024,
        free_gib=free_gib,
        mem_fraction_static=m,
        weights_gib=w_gib,
        kv_bytes_per_token=kvb,
        kv_pool_tokens=pool,
        chunked_prefill_size=tier.chunked_prefill_size,
        cuda_graph_max_bs=tier.cuda_graph_max_bs,
        request_tokens=request_tokens,
        system_prompt_tokens=system_prompt_tokens,
        requests_fit=max(0, (pool - system_prompt_tokens) // request_tokens),
        prompts_fit=pool // system_prompt_tokens if system_prompt_tokens else 0,
        calibrated=gpu.name in CALIBRATED_GPUS,
    )


# SGLang's HiCache host pool (mem_cache/memory_pool_host.py, HostKVCache): --hicache-size GB
# when given, else --hicache-ratio times the device pool (2 by default); it stores the KV in
# the device pool's dtype, so a token takes as many bytes as on the device; and it must be
# larger than the device pool.
HICACHE_DEFAULT_RATIO = 2.0


def hicache_host_tokens(pool_tokens: int, kv_bytes_per_token: int,
                        hicache_ratio: float = HICACHE_DEFAULT_RATIO,
                        hicache_size_gb: float = 0.0) -> int:
    """The host pool SGLang allocates for `--hicache-ratio` or `--hicache-size` (GB, 10^9
    bytes; it wins when > 0), in tokens (page size 1). Refused as SGLang refuses it: a host
    pool not larger than the device pool."""
    if not math.isfinite(hicache_ratio) or not math.isfinite(hicache_size_gb) \
            or hicache_size_gb < 0 or hicache_ratio <= 0:
        raise SpecError("--hicache-ratio must be positive and --hicache-size >= 0 (GB)")
    if hicache_size_gb > 0:
        size = int(hicache_size_gb * 1e9 // kv_bytes_per_token)
        given = f"--hicache-size {hicache_size_gb:g} GB ({size} tokens)"
    else:
        size = int(pool_tokens * hicache_ratio)
        given = f"--hicache-ratio {hicache_ratio:g} ({size} tokens)"
    if size <= pool_tokens:
        raise SpecError(f"{given} is not larger than the KV pool ({pool_tokens} tokens): "
                        "SGLang requires the host memory to be larger than the device memory")
    return size


# --------------------------------------------------------------------------------------------
# vLLM's rule (V1 engine, 0.26.0: vllm/v1/worker/gpu_worker.py determine_available_memory and
# vllm/v1/worker/utils.py request_memory; vllm/v1/core/kv_cache_utils.py get_num_blocks)
# --------------------------------------------------------------------------------------------
#
#     requested  = ceil(total * gpu_memory_utilization)              (0.9 by default)
#     kv_bytes   = requested - (weights + torch activation peak of the profile run
#                               + non-torch memory the profile run adds) - CUDA-graph estimate
#     num_gpu_blocks = kv_bytes // (block_size * kv_bytes_per_token),  pool = blocks * 16
#
# `total` is the card's whole memory (the CUDA context, created before vLLM's first snapshot,
# comes out of the 10% left over). The profile run is one forward pass of
# max_num_batched_tokens tokens and a sampler pass over max_num_seqs rows; the CUDA-graph
# estimate is on by default since v0.21 (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1).
# vLLM's own `--kv-cache-memory BYTES` skips all of it: `pool_tokens` overrides do the same.
#
# ASSUMED, not measured (no vLLM run on an L4 has been recorded): the three overheads below.
# The activation peak is estimated from the shapes of the profile run: per batched token the
# MLP's gate/up output (2 x intermediate), its activation (intermediate) and three hidden-size
# buffers (input, output, residual), BF16; per sampler row the FP32 logits twice (logits and
# probabilities). Non-torch memory (cuBLAS workspaces, NCCL buffers) and the CUDA-graph pool
# for capture sizes up to 512 are round figures for an 8B dense model.
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
VLLM_BLOCK_SIZE = 16
ASSUMED_VLLM_NON_TORCH_MIB = 200.0
ASSUMED_VLLM_CUDAGRAPH_MIB = 512.0
ASSUMED_VLLM_LOGITS_COPIES = 2


@dataclass(frozen=True, slots=True)
class VLLMDefaults:
    """vLLM's scheduler defaults for the OpenAI server (EngineArgs.get_batch_defaults):
    cards with at least 70 GiB (except A100s) get the larger ones."""

    max_num_batched_tokens: int
    max_num_seqs: int

    @property
    def cuda_graph_max_bs(self) -> int:
        """max_cudagraph_capture_size: min(2 x max_num_seqs, 512)."""
        return min(2 * self.max_num_seqs, 512)


def vllm_defaults(gpu: GPU) -> VLLMDefaults:
    if gpu.visible_mib >= 70 * 1024 and not gpu.name.startswith("a100"):
        return VLLMDefaults(8192, 1024)
    return VLLMDefaults(2048, 256)


@dataclass(frozen=True, slots=True)
class VLLMPoolPlan:
    gpu: str
    model: str
    weights: str
    kv_cache: str
    total_gib: float
    gpu_memory_utilization: float
    weights_gib: float
    activation_peak_gib: float
    non_torch_gib: float
    cudagraph_gib: float
    kv_cache_gib: float
    kv_bytes_per_token: int
    block_size: int
    num_gpu_blocks: int
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_cache_memory_override: bool

    @property
    def kv_pool_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def to_json(self) -> dict[str, object]:
        return {
            "engine": "vllm", "gpu": self.gpu, "model": self.model, "weights": self.weights,
            "kv_cache": self.kv_cache, "calibrated": False,
            "total_gib": round(self.total_gib, 3),
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "weights_gib": round(self.weights_gib, 3),
            "activation_peak_gib": round(self.activation_peak_gib, 3),
            "non_torch_gib": round(self.non_torch_gib, 3),
            "cudagraph_gib": round(self.cudagraph_gib, 3),
            "kv_cache_gib": round(self.kv_cache_gib, 3),
            "kv_bytes_per_token": self.kv_bytes_per_token, "block_size": self.block_size,
            "num_gpu_blocks": self.num_gpu_blocks, "kv_pool_tokens": self.kv_pool_tokens,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "kv_cache_memory_override": self.kv_cache_memory_override,
        }


def vllm_activation_peak_bytes(model: Model, max_num_batched_tokens: int,
                               max_num_seqs: int) -> float:
    """The profile run's torch peak, estimated from its shapes (see the assumption above)."""
    per_token = (3 * model.intermediate_size + 3 * model.hidden_size) * 2
    per_row = model.vocab_size * 4 * ASSUMED_VLLM_LOGITS_COPIES
    return float(max_num_batched_tokens * per_token + max_num_seqs * per_row)


def plan_vllm_pool(
    gpu: GPU,
    model: Model,
    weights: str,
    kv_cache: str,
    *,
    gpu_memory_utilization: float | None = None,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    pool_tokens: int | None = None,
) -> VLLMPoolPlan:
    """Size vLLM's KV pool on a card; `pool_tokens` plays `--kv-cache-memory` (the pool is
    then that many tokens, rounded down to whole blocks)."""
    util = (gpu_memory_utilization if gpu_memory_utilization is not None
            else VLLM_DEFAULT_GPU_MEMORY_UTILIZATION)
    if not 0.0 < util <= 1.0:
        raise SpecError("gpu memory utilization must be in (0, 1]")
    d = vllm_defaults(gpu)
    batched = max_num_batched_tokens or d.max_num_batched_tokens
    seqs = max_num_seqs or d.max_num_seqs
    kvb = model.kv_bytes_per_token(kv_cache)
    total = gpu.visible_mib * 2**20
    w = float(model.weight_bytes(weights))
    act = vllm_activation_peak_bytes(model, batched, seqs)
    non_torch = ASSUMED_VLLM_NON_TORCH_MIB * 2**20
    graphs = ASSUMED_VLLM_CUDAGRAPH_MIB * 2**20
    kv_bytes = math.ceil(total * util) - w - act - non_torch - graphs
    override = pool_tokens is not None
    if override:
        assert pool_tokens is not None
        if pool_tokens < 2 * VLLM_BLOCK_SIZE:
            raise SpecError(f"a vLLM pool needs at least {2 * VLLM_BLOCK_SIZE} tokens")
        blocks = pool_tokens // VLLM_BLOCK_SIZE
        kv_bytes = float(blocks * VLLM_BLOCK_SIZE * kvb)
    else:
        blocks = max(0, int(kv_bytes // (VLLM_BLOCK_SIZE * kvb)))
    if blocks < 2:
        raise SpecError(
            f"{model.name} {weights} weights ({w / GIB:.2f} GiB) leave no KV cache on "
            f"{gpu.name} at gpu_memory_utilization {util} (vLLM's rule, docs/twin.md)")
    return VLLMPoolPlan(
        gpu=gpu.name, model=model.name, weights=weights, kv_cache=kv_cache,
        total_gib=total / GIB, gpu_memory_utilization=util, weights_gib=w / GIB,
        activation_peak_gib=act / GIB, non_torch_gib=non_torch / GIB,
        cudagraph_gib=graphs / GIB, kv_cache_gib=kv_bytes / GIB, kv_bytes_per_token=kvb,
        block_size=VLLM_BLOCK_SIZE, num_gpu_blocks=blocks, max_num_batched_tokens=batched,
        max_num_seqs=seqs, kv_cache_memory_override=override)
