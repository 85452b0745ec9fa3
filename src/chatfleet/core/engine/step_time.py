"""How long one scheduler step takes on a given GPU, model and precision.

Decode step (one token for each of `batch` running requests):

    fixed_decode
    + max(streamed weight bytes + KV bytes read, over effective bandwidth;
          dense FLOPs of `batch` tokens over effective FLOPS)
    + eager cost when batch > cuda_graph_max_bs (no CUDA graph: kernels launched one by one)

Prefill step (a batch of at most chunked_prefill_size new tokens):

    fixed_prefill
    + max(streamed weight bytes over effective bandwidth, dense FLOPs over effective FLOPS)
    + attention: causal QK^T/PV FLOPs over effective BF16 FLOPS, plus the cached prefix's KV read

    With a host-tier load-back (HiCache), the copy of the loaded KV over PCIe runs on its own
    stream layer by layer, and each layer's attention waits for its layer's copy
    (cache_controller.py's LayerDoneCounter): of the forward pass F (everything after the fixed
    cost) and the copy C, the step takes max(F, C) + min(F, C) / layers (`overlap_layers`).
    The copy's rate is the card's PCIe link (one direction) times `host_io_eff`.

Compute-bound parts scale with the SM clock and memory-bound parts with the memory clock
(`sm_factor` and `mem_factor`, both >= 1 as slow-down multipliers; 1 at the calibration clock).
The constants come from `chatfleet.core.calibration`.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatfleet.core.specs import GPU, Model, Precision


@dataclass(frozen=True, slots=True)
class StepConstants:
    """Per GPU x model x precision. See calibration.py for where each value comes from."""

    bandwidth_eff: float  # share of datasheet memory bandwidth achieved by streaming kernels
    gemm_eff: float  # share of datasheet dense TFLOPS (of the weight dtype) achieved by GEMMs
    attn_eff: float  # share of dense BF16 TFLOPS achieved by attention kernels
    decode_fixed_s: float
    prefill_fixed_s: float
    eager_s: float  # added per decode step above the CUDA-graph batch limit
    cuda_graph_max_bs: int
    chunked_prefill_size: int
    # share of the PCIe link's rate a host-tier copy reaches (calibration.py's
    # ASSUMED_HOST_IO_EFF; 1.0 here is the link's whole rate, for hand-made constants)
    host_io_eff: float = 1.0
    # share of datasheet bandwidth the attention kernels reach reading the KV cache (paged,
    # per sequence); None: bandwidth_eff's, as the built-in calibrations assume
    kv_read_eff: float | None = None


class StepTimeModel:
    def __init__(self, model: Model, gpu: GPU, prec: Precision, c: StepConstants) -> None:
        self.model = model
        self.gpu = gpu
        self.precision = prec
        self.constants = c
        bw = gpu.bandwidth_gbs * 1e9 * c.bandwidth_eff  # bytes/s
        self.bytes_per_s = bw
        self.weights_s = model.streamed_weight_bytes(prec.weights) / bw
        self.kv_bytes_per_token = model.kv_bytes_per_token(prec.kv_cache)
        kv_bw = bw if c.kv_read_eff is None else gpu.bandwidth_gbs * 1e9 * c.kv_read_eff
        self.kv_read_s_per_token = self.kv_bytes_per_token / kv_bw
        self.gemm_flops_per_s = gpu.tflops(prec.weights) * 1e12 * c.gemm_eff
        self.attn_flops_per_s = gpu.bf16_tflops * 1e12 * c.attn_eff
        self.decode_flop_s_per_token = 2.0 * (model.linear_params + model.vocab_size
                                              * model.hidden_size) / self.gemm_flops_per_s
        self.attn_flops_per_pair = (4.0 * model.num_layers * model.num_attention_heads
                                    * model.head_dim)
        self.host_bytes_per_s = gpu.pcie_gbs * 1e9 * c.host_io_eff  # host <-> device copies
        self.cuda_graph_max_bs = c.cuda_graph_max_bs
        self.chunked_prefill_size = c.chunked_prefill_size
        # a prefill's FLOPs per new token and per sampled token (Model.linear_params sums
        # the layer's shapes each time it is read)
        self.prefill_flops_per_token = 2.0 * model.linear_params
        self.logits_flops_per_token = 2.0 * model.vocab_size * model.hidden_size

    def decode_s(self, batch: int, kv_tokens: int, sm_factor: float = 1.0,
                 mem_factor: float = 1.0) -> float:
        """One decode step for `batch` requests whose contexts hold `kv_tokens` in all."""
        c = self.constants
        memory = (self.weights_s + kv_tokens * self.kv_read_s_per_token) * mem_factor
        compute = batch * self.decode_flop_s_per_token * sm_factor
        t = c.decode_fixed_s + (memory if memory > compute else compute)
        if batch > self.cuda_graph_max_bs:
            t += c.eager_s
        return t

    def prefill_s(self, new_tokens: int, attn_pairs: float, cached_read_tokens: int,
                  logits_tokens: int, load_back_tokens: int = 0, sm_factor: float = 1.0,
                  mem_factor: float = 1.0) -> float:
        """One prefill step.

        new_tokens: tokens computed in this step (all requests of the batch);
        attn_pairs: sum over the batch of query x key pairs (causal), see attention_pairs();
        cached_read_tokens: KV tokens read from the cache (the prefix before each chunk);
        logits_tokens: requests whose last prompt token is in this step (lm_head is run there);
        load_back_tokens: tokens the host tier copies back for this step (see the module
        docstring: the copy overlaps the forward pass layer by layer).
        """
        c = self.constants
        weights = self.weights_s * mem_factor
        flops = (self.prefill_flops_per_token * new_tokens
                 + self.logits_flops_per_token * logits_tokens)
        gemm = flops / self.gemm_flops_per_s * sm_factor
        attn = attn_pairs * self.attn_flops_per_pair / self.attn_flops_per_s * sm_factor
        kv_read = cached_read_tokens * self.kv_read_s_per_token * mem_factor
        if not load_back_tokens:
            return c.prefill_fixed_s + (weights if weights > gemm else gemm) + attn + kv_read
        forward = (weights if weights > gemm else gemm) + attn + kv_read
        return c.prefill_fixed_s + overlap_layers(
            forward, self.host_transfer_s(load_back_tokens), self.model.num_layers)

    def host_transfer_s(self, tokens: int) -> float:
        """Copying `tokens` of KV between host and device memory, one way."""
        return tokens * self.kv_bytes_per_token / self.host_bytes_per_s

    def recompute_s(self, tokens: int, cached: int = 0) -> float:
        """Prefill time of `tokens` after `cached` ones, in chunks, alone in its batches: what
        a session pays to recompute its history on a replica that does not hold it."""
        total = 0.0
        done = cached
        end = cached + tokens
        chunk = self.chunked_prefill_size
        while done < end:
            n = min(chunk, end - done)
            total += self.prefill_s(n, attention_pairs(done, n), done, 1 if done + n >= end
                                    else 0)
            done += n
        return total


def overlap_layers(compute_s: float, copy_s: float, num_layers: int) -> float:
    """A forward pass of `compute_s` whose layer i waits for layer i of a copy of `copy_s`
    issued when it starts, both split evenly over `num_layers`: the longer of the two, plus
    one layer of the shorter (the first layer's copy, or the last layer's compute)."""
    longer, shorter = (compute_s, copy_s) if compute_s >= copy_s else (copy_s, compute_s)
    return longer + shorter / num_layers


def attention_pairs(context_before: float, new_tokens: float) -> float:
    """Query-key pairs of `new_tokens` attending causally after `context_before` tokens."""
    return new_tokens * context_before + new_tokens * (new_tokens + 1) / 2
