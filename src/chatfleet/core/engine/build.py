"""Build an engine model (scheduler + step time + optional thermal state) for a GPU, model and
precision: the one recipe the twin and the simserver share. `engine_model` picks SGLang v0.5's
prefill-first scheduler or vLLM 0.26's token-budget scheduler (protocol.EngineModel)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from chatfleet.core.calibration import (
    Calibration,
    ThermalProfile,
    calibration_for,
    step_constants,
    thermal_profile,
    vllm_calibration_for,
)
from chatfleet.core.engine.host_tier import DEFAULT_WRITE_POLICY, check_host_tier
from chatfleet.core.engine.mixed_step import MixedStepModel
from chatfleet.core.engine.protocol import EngineModel
from chatfleet.core.engine.scheduler import Scheduler, SchedulerConfig
from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.engine.thermal import ThermalState
from chatfleet.core.engine.vllm_config import VLLMConfig
from chatfleet.core.engine.vllm_scheduler import VLLMScheduler
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.memory import CALIBRATED_GPUS, PoolPlan, VLLMPoolPlan, plan_pool, plan_vllm_pool
from chatfleet.core.provenance import Provenance, provenance
from chatfleet.core.specs import GPU, Model, Precision

ENGINE_MODELS = ("sglang", "vllm")
# what each model was read from (the sweep document's target names it)
ENGINE_MODEL_VERSIONS = {"sglang": "sglang-0.5", "vllm": "vllm-0.26.0"}


@dataclass(frozen=True, slots=True)
class EngineSpec:
    gpu: GPU
    model: Model
    precision: Precision
    mem_fraction: float | None = None  # SGLang mem_fraction_static, vLLM gpu_memory_utilization
    pool_tokens: int | None = None  # override the planned pool (what-ifs; vLLM --kv-cache-memory)
    max_running_requests: int | None = None  # SGLang --max-running-requests, vLLM --max-num-seqs
    schedule_policy: str = "fcfs"
    eviction_policy: str = "lru"
    host_pool_tokens: int = 0  # SGLang's HiCache host pool (0: off); core/memory.py sizes it
    hicache_write_policy: str = DEFAULT_WRITE_POLICY
    thermal: bool = False
    calibration: Calibration | None = None
    cooling: ThermalProfile | None = None  # replace the card's thermal profile (what-ifs)
    engine_model: str = "sglang"
    max_num_batched_tokens: int | None = None  # vLLM's token budget (None: its default)
    long_prefill_token_threshold: int = 0  # vLLM (0: off, its default)

    def __post_init__(self) -> None:
        if self.pool_tokens is not None and self.pool_tokens < 1:
            # 0 is no pool at all, not "the planned one": a replica that never admits a request
            raise ChatfleetError(f"--pool-tokens {self.pool_tokens}: the KV pool must hold at "
                                 "least one token (leave it out for the planned pool)")
        if self.max_running_requests is not None and self.max_running_requests < 1:
            raise ChatfleetError(f"--max-running-requests {self.max_running_requests}: the "
                                 "engine cap must be at least 1 (leave it out for no cap)")
        if self.engine_model not in ENGINE_MODELS:
            raise ChatfleetError(f"unknown engine model {self.engine_model!r}: "
                                 f"{' or '.join(ENGINE_MODELS)}")
        if self.engine_model == "vllm":
            if self.host_pool_tokens or self.hicache_write_policy != DEFAULT_WRITE_POLICY:
                raise ChatfleetError("the vLLM model has no host tier (HiCache is SGLang's)")
            if self.schedule_policy != "fcfs" or self.eviction_policy != "lru":
                raise ChatfleetError("the vLLM model schedules FCFS and evicts from its free-block "
                                     "queue: --schedule-policy and --eviction are SGLang's")
        elif self.max_num_batched_tokens is not None or self.long_prefill_token_threshold:
            raise ChatfleetError("--max-num-batched-tokens and --long-prefill-token-threshold are "
                                 "vLLM's: pick --engine-model vllm")
        else:  # a host tier SGLang would start with, or none (the pool is planned only here)
            check_host_tier(self.kv_pool_tokens() if self.host_pool_tokens > 0 else 0,
                            self.host_pool_tokens, self.hicache_write_policy)

    @property
    def is_calibrated(self) -> bool:
        """The L4's built-in fit, or a profile fitted on this very card (the vLLM model has no
        built-in fit: only a profile calibrates it)."""
        if self.calibration is not None:
            return self.calibration.calibrated and self.calibration.gpu == self.gpu.name
        return self.engine_model == "sglang" and self.gpu.name in CALIBRATED_GPUS

    def pool_plan(self) -> PoolPlan:
        """SGLang's pool for this card (the SGLang model's; cache analysis and plans use it)."""
        return plan_pool(self.gpu, self.model, self.precision.weights, self.precision.kv_cache,
                         mem_fraction=self.mem_fraction if self.engine_model == "sglang"
                         else None, request_tokens=1, system_prompt_tokens=0)

    def vllm_pool_plan(self) -> VLLMPoolPlan:
        return plan_vllm_pool(self.gpu, self.model, self.precision.weights,
                              self.precision.kv_cache, gpu_memory_utilization=self.mem_fraction,
                              max_num_batched_tokens=self.max_num_batched_tokens,
                              max_num_seqs=self.max_running_requests,
                              pool_tokens=self.pool_tokens)

    def kv_pool_tokens(self) -> int:
        """The pool the engine model gets (the override where one is set)."""
        if self.engine_model == "vllm":
            return self.vllm_pool_plan().kv_pool_tokens
        return self.pool_tokens or self.pool_plan().kv_pool_tokens

    def to_json(self) -> dict[str, object]:
        base: dict[str, object] = {
            "gpu": self.gpu.name,
            "model": self.model.name,
            "weights": self.precision.weights,
            "kv_cache": self.precision.kv_cache,
        }
        if self.engine_model == "vllm":
            plan = self.vllm_pool_plan()
            return {**base,
                    "mem_fraction_static": None,
                    "gpu_memory_utilization": plan.gpu_memory_utilization,
                    "max_total_num_tokens": plan.kv_pool_tokens,
                    "num_gpu_blocks": plan.num_gpu_blocks, "block_size": plan.block_size,
                    "max_running_requests": self.max_running_requests,
                    "max_num_seqs": plan.max_num_seqs,
                    "max_num_batched_tokens": plan.max_num_batched_tokens,
                    "long_prefill_token_threshold": self.long_prefill_token_threshold,
                    "enable_prefix_caching": True, "thermal": self.thermal}
        return {
            **base,
            "mem_fraction_static": self.pool_plan().mem_fraction_static,
            "max_total_num_tokens": self.pool_tokens or self.pool_plan().kv_pool_tokens,
            "max_running_requests": self.max_running_requests,
            "schedule_policy": self.schedule_policy,
            "radix_eviction_policy": self.eviction_policy,
            "host_pool_tokens": self.host_pool_tokens,
            # only with a host tier, so that documents without one keep their bytes
            **({"hicache_write_policy": self.hicache_write_policy}
               if self.host_pool_tokens else {}),
            "thermal": self.thermal,
        }


def thermal_profile_of(spec: EngineSpec) -> ThermalProfile:
    """The card's thermal profile, or the one the spec puts in its place."""
    return spec.cooling or thermal_profile(spec.gpu)


def calibration_of(spec: EngineSpec) -> Calibration | None:
    """The constants the engine model runs on (None: the card's built-in SGLang ones)."""
    if spec.calibration is not None or spec.engine_model == "sglang":
        return spec.calibration
    return vllm_calibration_for(spec.gpu)


def scaled_spec(spec: EngineSpec, k: float) -> EngineSpec:
    """The same engine with every step k times as long (Calibration.scaled): the twin's
    figures at the edges of its error band."""
    cal = calibration_of(spec) or calibration_for(spec.gpu)
    return replace(spec, calibration=cal.scaled(k))


def provenance_of(spec: EngineSpec) -> Provenance:
    """What the spec's constants were fitted on, borrow and assume, and their error band."""
    return provenance(spec.engine_model, spec.gpu, spec.calibration)


def step_time_model(spec: EngineSpec) -> StepTimeModel:
    """The deployment's step-time model (the gateway prices a spill with it)."""
    constants = step_constants(spec.gpu, spec.model, spec.precision, calibration_of(spec))
    if spec.engine_model == "vllm":
        plan = spec.vllm_pool_plan()
        cal = calibration_of(spec)
        assert cal is not None
        return MixedStepModel(spec.model, spec.gpu, spec.precision, constants, cal.per_seq_s,
                              plan.max_num_batched_tokens,
                              min(2 * plan.max_num_seqs, 512), launch_s=cal.launch_s)
    return StepTimeModel(spec.model, spec.gpu, spec.precision, constants)


def build_engine(spec: EngineSpec) -> EngineModel:
    """The engine model the spec names."""
    if spec.engine_model == "vllm":
        return build_vllm_scheduler(spec)
    return build_scheduler(spec)


def build_scheduler(spec: EngineSpec) -> Scheduler:
    plan = spec.pool_plan()
    step_model = step_time_model(spec)
    constants = step_model.constants
    cfg = SchedulerConfig(
        pool_tokens=spec.pool_tokens or plan.kv_pool_tokens,
        chunked_prefill_size=constants.chunked_prefill_size,
        max_running_requests=spec.max_running_requests,
        schedule_policy=spec.schedule_policy,
        eviction_policy=spec.eviction_policy,
        host_pool_tokens=spec.host_pool_tokens,
        hicache_write_policy=spec.hicache_write_policy,
        context_length=spec.model.max_position_embeddings,
    )
    thermal = ThermalState(thermal_profile_of(spec)) if spec.thermal else None
    return Scheduler(cfg, step_model, thermal)


def build_vllm_scheduler(spec: EngineSpec) -> VLLMScheduler:
    """vLLM on the card: its pool rule, its batch defaults, and max_model_len the model's own
    unless the pool is smaller (vLLM then refuses to start without --max-model-len; the plan's
    launch command passes the pool)."""
    plan = spec.vllm_pool_plan()
    step_model = step_time_model(spec)
    assert isinstance(step_model, MixedStepModel)
    cal = calibration_of(spec)
    assert cal is not None
    usable = (plan.num_gpu_blocks - 1) * plan.block_size
    cfg = VLLMConfig(
        num_gpu_blocks=plan.num_gpu_blocks,
        block_size=plan.block_size,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        max_num_seqs=plan.max_num_seqs,
        long_prefill_token_threshold=spec.long_prefill_token_threshold,
        max_model_len=min(spec.model.max_position_embeddings, usable),
        frontend_s=cal.frontend_s,
        frontend_delay_s=cal.frontend_delay_s,
    )
    thermal = ThermalState(thermal_profile_of(spec)) if spec.thermal else None
    return VLLMScheduler(cfg, step_model, thermal)
