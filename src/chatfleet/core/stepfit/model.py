"""The vLLM engine model's step time over many observed steps at once, by parameter.

`StepParams` names the constants a live sweep can fit, each with its physical meaning (the
terms of core/engine/mixed_step.py):

- `decode_fixed_s`: host work every step waits for (scheduling, input preparation, sampling,
  output processing);
- `prefill_extra_s`: what a step with prefill tokens adds to that (prefill_fixed - decode_fixed);
- `per_seq_s`: host work per sequence in the step beyond the first;
- `launch_s`: host time that overlaps the GPU's (eager mode's kernel launches): the step lasts
  the slower of the two;
- `bandwidth_eff`, `gemm_eff`, `attn_eff`: the shares of the card's datasheet bandwidth, dense
  TFLOPS of the weights' dtype, and dense BF16 TFLOPS that the kernels reach (the GPU's time);
- `kv_read_eff`: the share of datasheet bandwidth the attention kernels reach reading the KV
  cache (each sequence's context, paged, every decode step; a prefill's cached prefix). It is
  the weights' bandwidth until a fit tells them apart, which takes steps over long contexts:
  on the H200 with CUDA graphs a 64-128-user batch on 2,600-token contexts reads 25-50 GB of
  KV a step, several times the weights (docs/device/vllm/README.md).

`step_times` evaluates MixedStepModel.step_s's formula over arrays (a test checks the two agree
on random steps); `engine_constants` builds the MixedStepModel itself, so the twin runs exactly
what was fitted.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from chatfleet.core.calibration import Calibration
from chatfleet.core.engine.mixed_step import MixedStepModel
from chatfleet.core.engine.step_time import StepConstants
from chatfleet.core.specs import GPU, Model, Precision
from chatfleet.core.stepfit.samples import FloatArray, StepSamples


@dataclass(frozen=True)
class StepParams:
    decode_fixed_s: float
    prefill_extra_s: float
    per_seq_s: float
    launch_s: float
    bandwidth_eff: float
    gemm_eff: float
    attn_eff: float
    kv_read_eff: float

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def values(self) -> tuple[float, ...]:
        return tuple(float(getattr(self, n)) for n in self.names())

    @classmethod
    def of(cls, values: tuple[float, ...] | list[float] | FloatArray) -> StepParams:
        return cls(*(float(v) for v in values))

    @classmethod
    def from_calibration(cls, cal: Calibration, weights: str) -> StepParams:
        return cls(decode_fixed_s=cal.decode_fixed_s,
                   prefill_extra_s=max(0.0, cal.prefill_fixed_s - cal.decode_fixed_s),
                   per_seq_s=cal.per_seq_s, launch_s=cal.launch_s,
                   bandwidth_eff=cal.bandwidth_eff,
                   gemm_eff=cal.gemm_eff.get(weights, cal.gemm_eff["bf16"]),
                   attn_eff=cal.attn_eff,
                   kv_read_eff=cal.bandwidth_eff if cal.kv_read_eff is None
                   else cal.kv_read_eff)

    def calibration(self, base: Calibration, weights: str, source: str) -> Calibration:
        """`base` with these constants (eager_s 0: a fitted launch time holds eager mode)."""
        return replace(base, bandwidth_eff=self.bandwidth_eff,
                       decode_fixed_s=self.decode_fixed_s,
                       prefill_fixed_s=self.decode_fixed_s + self.prefill_extra_s,
                       gemm_eff={**base.gemm_eff, weights: self.gemm_eff},
                       attn_eff=self.attn_eff, eager_s=0.0, per_seq_s=self.per_seq_s,
                       launch_s=self.launch_s, kv_read_eff=self.kv_read_eff,
                       calibrated=True, source=source)


@dataclass(frozen=True)
class Hardware:
    """What a step's GPU time is computed from: the card, the model, the precision."""

    gpu: GPU
    model: Model
    precision: Precision

    def step_model(self, p: StepParams, max_num_batched_tokens: int = 8192,
                   cuda_graph_max_bs: int = 512) -> MixedStepModel:
        c = StepConstants(bandwidth_eff=p.bandwidth_eff, gemm_eff=p.gemm_eff,
                          attn_eff=p.attn_eff, decode_fixed_s=p.decode_fixed_s,
                          prefill_fixed_s=p.decode_fixed_s + p.prefill_extra_s, eager_s=0.0,
                          cuda_graph_max_bs=cuda_graph_max_bs,
                          chunked_prefill_size=max_num_batched_tokens,
                          kv_read_eff=p.kv_read_eff)
        return MixedStepModel(self.model, self.gpu, self.precision, c, p.per_seq_s,
                              max_num_batched_tokens, cuda_graph_max_bs, launch_s=p.launch_s)


@dataclass(frozen=True)
class StepTerms:
    """Each term's seconds per sample (their sum is the step time)."""

    fixed: FloatArray
    prefill_extra: FloatArray
    per_seq: FloatArray
    launch_over_gpu: FloatArray  # the host's launch time where it outlasts the GPU
    gpu: FloatArray

    def total(self) -> FloatArray:
        return self.fixed + self.prefill_extra + self.per_seq + np.maximum(
            self.launch_over_gpu, 0.0) + self.gpu


def step_terms(hw: Hardware, p: StepParams, s: StepSamples) -> StepTerms:
    """MixedStepModel.step_s over every sample, term by term (SM and memory clocks as fitted)."""
    m = hw.step_model(p)
    has_prefill = s.prefill_tokens > 0
    seqs = s.num_decode + s.num_prefill
    memory = m.weights_s + s.decode_context_tokens * m.kv_read_s_per_token
    compute = ((s.num_decode + s.prefill_tokens) * m.linear_flop_s_per_token
               + (s.num_decode + s.num_prefill) * m.lm_head_flop_s_per_token)
    gpu = np.maximum(memory, compute) + np.where(
        has_prefill, s.prefill_pairs * m.attn_flops_per_pair / m.attn_flops_per_s
        + s.prefill_cached_tokens * m.kv_read_s_per_token, 0.0)
    n = len(s)
    return StepTerms(
        fixed=np.full(n, p.decode_fixed_s),
        prefill_extra=np.where(has_prefill, p.prefill_extra_s, 0.0),
        per_seq=p.per_seq_s * np.maximum(seqs - 1, 0.0),
        launch_over_gpu=np.maximum(p.launch_s - gpu, 0.0),
        gpu=gpu)


def step_times(hw: Hardware, p: StepParams, s: StepSamples) -> FloatArray:
    return step_terms(hw, p, s).total()
