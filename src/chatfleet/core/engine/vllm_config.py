"""vLLM 0.26's engine arguments that the vLLM engine model follows (vllm_scheduler.py), with
their defaults, from vllm/config/scheduler.py, vllm/config/cache.py and
vllm/engine/arg_utils.py."""

from __future__ import annotations

from dataclasses import dataclass

from chatfleet.core.engine.block_pool import BLOCK_SIZE
from chatfleet.core.errors import ChatfleetError


@dataclass(frozen=True, slots=True)
class VLLMConfig:
    """vLLM's engine arguments that the model follows (names as vLLM spells them)."""

    num_gpu_blocks: int  # the pool, null block included ('GPU KV cache size' / block_size)
    block_size: int = BLOCK_SIZE
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0
    max_model_len: int = 40960
    enable_prefix_caching: bool = True
    scheduler_reserve_full_isl: bool = True
    # the next step is scheduled while this one runs (0.26's default, "Asynchronous
    # scheduling is enabled" in its log): a request that reaches the engine core after a step
    # started joins the step after the next
    async_scheduling: bool = True
    # the API server's work per request before the engine core sees it (chat template,
    # tokenization, hand-off), one request after another: calibration.py's frontend_s
    frontend_s: float = 0.0
    # the latency on top that requests do not queue for (the hop to the engine core and the
    # first token's way back): calibration.py's frontend_delay_s
    frontend_delay_s: float = 0.0

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 2:
            raise ChatfleetError("the KV pool must hold at least 2 blocks")
        if self.max_num_seqs < 1:
            raise ChatfleetError("max_num_seqs must be at least 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM's SchedulerConfig refuses it too: every running decode needs a token
            raise ChatfleetError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                                 f"at least max_num_seqs ({self.max_num_seqs})")
        if self.long_prefill_token_threshold < 0:
            raise ChatfleetError("long_prefill_token_threshold must not be negative")
        if self.max_model_len < 1:
            raise ChatfleetError("max_model_len must be positive")
        if self.frontend_s < 0 or self.frontend_delay_s < 0:
            raise ChatfleetError("the front-end time must not be negative")

    @property
    def pool_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size
