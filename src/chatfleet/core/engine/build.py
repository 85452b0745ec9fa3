"""Build an engine model (scheduler + step time + optional thermal state) for a GPU, model and
precision: the one recipe the twin and the simserver share."""

from __future__ import annotations

from dataclasses import dataclass

from chatfleet.core.calibration import (
    Calibration,
    ThermalProfile,
    step_constants,
    thermal_profile,
)
from chatfleet.core.engine.scheduler import Scheduler, SchedulerConfig
from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.engine.thermal import ThermalState
from chatfleet.core.memory import CALIBRATED_GPUS, PoolPlan, plan_pool
from chatfleet.core.specs import GPU, Model, Precision


@dataclass(frozen=True, slots=True)
class EngineSpec:
    gpu: GPU
    model: Model
    precision: Precision
    mem_fraction: float | None = None
    pool_tokens: int | None = None  # override the planned pool (what-ifs, cache analysis)
    max_running_requests: int | None = None
    schedule_policy: str = "fcfs"
    eviction_policy: str = "lru"
    host_pool_tokens: int = 0
    thermal: bool = False
    calibration: Calibration | None = None
    cooling: ThermalProfile | None = None  # replace the card's thermal profile (what-ifs)

    @property
    def is_calibrated(self) -> bool:
        """The L4's built-in fit, or a profile fitted on this very card."""
        if self.calibration is not None:
            return self.calibration.calibrated and self.calibration.gpu == self.gpu.name
        return self.gpu.name in CALIBRATED_GPUS

    def pool_plan(self) -> PoolPlan:
        return plan_pool(self.gpu, self.model, self.precision.weights, self.precision.kv_cache,
                         mem_fraction=self.mem_fraction, request_tokens=1,
                         system_prompt_tokens=0)

    def to_json(self) -> dict[str, object]:
        return {
            "gpu": self.gpu.name,
            "model": self.model.name,
            "weights": self.precision.weights,
            "kv_cache": self.precision.kv_cache,
            "mem_fraction_static": self.pool_plan().mem_fraction_static,
            "max_total_num_tokens": self.pool_tokens or self.pool_plan().kv_pool_tokens,
            "max_running_requests": self.max_running_requests,
            "schedule_policy": self.schedule_policy,
            "radix_eviction_policy": self.eviction_policy,
            "host_pool_tokens": self.host_pool_tokens,
            "thermal": self.thermal,
        }


def thermal_profile_of(spec: EngineSpec) -> ThermalProfile:
    """The card's thermal profile, or the one the spec puts in its place."""
    return spec.cooling or thermal_profile(spec.gpu)


def step_time_model(spec: EngineSpec) -> StepTimeModel:
    """The deployment's step-time model (the gateway prices a spill with it)."""
    constants = step_constants(spec.gpu, spec.model, spec.precision, spec.calibration)
    return StepTimeModel(spec.model, spec.gpu, spec.precision, constants)


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
        context_length=spec.model.max_position_embeddings,
    )
    thermal = ThermalState(thermal_profile_of(spec)) if spec.thermal else None
    return Scheduler(cfg, step_model, thermal)
