"""How long one vLLM V1 engine step takes: D decodes and prefill chunks in one forward pass.

vLLM builds one batch per step from every scheduled token (decodes and prefill chunks alike,
under `max_num_batched_tokens`), so the weights are streamed once for all of them:

    decode_fixed_s                                  every step (scheduling, sampling,
                                                    bookkeeping: host work the GPU waits for)
    + (prefill_fixed_s - decode_fixed_s)            when the step carries prefill tokens
    + per_seq_s x (sequences in the step - 1)       per-request work beyond the first
    + max(launch_s,                                 host time that overlaps the GPU's work
          GPU time)
    + eager_s when the decode batch exceeds the CUDA-graph capture size

    GPU time = max(streamed weights + decode KV read, over effective bandwidth;
                   GEMM FLOPs of all D + P tokens and the lm_head of the sampled ones, over
                   effective FLOPS)
               + attention of the prefill chunks (causal pairs, BF16 FLOPS) + their cached
                 prefix's KV read

`launch_s` is what eager mode costs: PyTorch launches a step's kernels one by one from Python,
and the GPU runs each as soon as it is launched, so the step lasts as long as the slower of the
two, not their sum. With CUDA graphs (one launch a step) it is about 0 and the step is the fixed
costs plus the GPU's time, as in the SGLang model (0 unless a calibration fits it:
twin/calibrate.py).

With no prefill this is StepTimeModel.decode_s plus the per-sequence term; with no decodes it
is StepTimeModel.prefill_s plus the same term. The constants are StepConstants (calibration.py)
and `per_seq_s`; compute-bound parts scale with the SM clock, memory-bound ones with the
memory clock, as in step_time.py.
"""

from __future__ import annotations

from chatfleet.core.engine.step_time import StepConstants, StepTimeModel, attention_pairs
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.specs import GPU, Model, Precision


class MixedStepModel(StepTimeModel):
    def __init__(self, model: Model, gpu: GPU, prec: Precision, c: StepConstants,
                 per_seq_s: float, max_num_batched_tokens: int, cuda_graph_max_bs: int,
                 launch_s: float = 0.0) -> None:
        super().__init__(model, gpu, prec, c)
        if per_seq_s < 0:
            raise ChatfleetError("the per-sequence cost must not be negative")
        if launch_s < 0:
            raise ChatfleetError("the launch time must not be negative")
        self.launch_s = launch_s
        if max_num_batched_tokens <= 0:
            raise ChatfleetError("max_num_batched_tokens must be positive")
        self.per_seq_s = per_seq_s
        self.max_num_batched_tokens = max_num_batched_tokens
        self.cuda_graph_max_bs = cuda_graph_max_bs
        self.chunked_prefill_size = max_num_batched_tokens  # recompute_s chunks by the budget
        self.lm_head_flop_s_per_token = (2.0 * model.vocab_size * model.hidden_size
                                         / self.gemm_flops_per_s)
        self.linear_flop_s_per_token = 2.0 * model.linear_params / self.gemm_flops_per_s

    def step_s(self, num_decode: int, decode_kv_tokens: int, prefill_tokens: int,
               prefill_pairs: float, prefill_cached_read: int, num_prefill_seqs: int,
               num_prefill_logits: int, sm_factor: float = 1.0, mem_factor: float = 1.0
               ) -> float:
        """One step: `num_decode` decodes whose contexts hold `decode_kv_tokens` in all (this
        step's token included), and `num_prefill_seqs` prefill chunks of `prefill_tokens` new
        tokens with `prefill_pairs` causal query-key pairs after `prefill_cached_read` earlier
        tokens; `num_prefill_logits` of the chunks end their prompt (a token is sampled)."""
        gpu = self.gpu_s(num_decode, decode_kv_tokens, prefill_tokens, prefill_pairs,
                         prefill_cached_read, num_prefill_logits, sm_factor, mem_factor)
        serial = self.host_s(num_decode, prefill_tokens, num_prefill_seqs) - self.launch_s
        return serial + (gpu if gpu > self.launch_s else self.launch_s)

    def host_s(self, num_decode: int, prefill_tokens: int, num_prefill_seqs: int) -> float:
        """The host's part of a step: its fixed and per-sequence work and the kernel launches
        (with async scheduling the engine schedules the next step once this is done)."""
        c = self.constants
        t = c.decode_fixed_s + self.launch_s
        if prefill_tokens:
            t += c.prefill_fixed_s - c.decode_fixed_s
        seqs = num_decode + num_prefill_seqs
        if seqs > 1:
            t += self.per_seq_s * (seqs - 1)
        if num_decode > self.cuda_graph_max_bs:
            t += c.eager_s
        return t

    def gpu_s(self, num_decode: int, decode_kv_tokens: int, prefill_tokens: int,
              prefill_pairs: float, prefill_cached_read: int, num_prefill_logits: int,
              sm_factor: float = 1.0, mem_factor: float = 1.0) -> float:
        """The GPU's part of a step: weights and KV read, GEMMs, the prefill's attention."""
        memory = (self.weights_s + decode_kv_tokens * self.kv_read_s_per_token) * mem_factor
        compute = ((num_decode + prefill_tokens) * self.linear_flop_s_per_token
                   + (num_decode + num_prefill_logits) * self.lm_head_flop_s_per_token
                   ) * sm_factor
        gpu = memory if memory > compute else compute
        if prefill_tokens:
            gpu += (prefill_pairs * self.attn_flops_per_pair / self.attn_flops_per_s * sm_factor
                    + prefill_cached_read * self.kv_read_s_per_token * mem_factor)
        return gpu

    def decode_s(self, batch: int, kv_tokens: int, sm_factor: float = 1.0,
                 mem_factor: float = 1.0) -> float:
        return self.step_s(batch, kv_tokens, 0, 0.0, 0, 0, 0, sm_factor, mem_factor)

    def prefill_s(self, new_tokens: int, attn_pairs: float, cached_read_tokens: int,
                  logits_tokens: int, load_back_tokens: int = 0, sm_factor: float = 1.0,
                  mem_factor: float = 1.0) -> float:
        """A prefill-only step of one chunk (vLLM has no host tier: load_back must be 0)."""
        if load_back_tokens:
            raise ValueError("the vLLM model has no host tier to load back from")
        return self.step_s(0, 0, new_tokens, attn_pairs, cached_read_tokens, 1, logits_tokens,
                           sm_factor, mem_factor)


__all__ = ["MixedStepModel", "attention_pairs"]
