"""What `chatfleet plan` is asked (`PlanRequest`) and what every part of the plan derives
from it alone: the engine spec of a precision, its KV pool and the pool's figures, the
checkpoint for the launch commands."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from chatfleet.core.calibration import Calibration
from chatfleet.core.defaults import DURATION_S, SEED, WARMUP_S
from chatfleet.core.documents.plan import PoolFigures
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.memory import PoolPlan, VLLMPoolPlan, plan_pool, plan_vllm_pool
from chatfleet.core.slo import SLO
from chatfleet.core.specs import GPU, HF_MODEL_IDS, Model, precision
from chatfleet.core.workload import SessionProfile

DEFAULT_GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
DEFAULT_RATES = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0)

# Progress: (what is running, finished steps, all steps).
Progress = Callable[[str, int, int], None]
FLEET_STEP = "target and doubled traffic through the fleet twin"


@dataclass(frozen=True, slots=True)
class PlanRequest:
    gpu: GPU
    model: Model
    users: int
    slo: SLO = field(default_factory=SLO)
    profile: SessionProfile = field(default_factory=SessionProfile)
    precisions: tuple[tuple[str, str], ...] = (("bf16", "bf16"), ("fp8", "fp8"))
    sweeps: tuple[Path, ...] = ()
    accuracy: Path | None = None
    headroom: float = 0.2
    host_kv_gib: float = 16.0
    mem_fraction: float | None = None
    grid: tuple[int, ...] = DEFAULT_GRID
    rates: tuple[float, ...] = DEFAULT_RATES
    duration_s: float = DURATION_S
    warmup_s: float = WARMUP_S
    seed: int = SEED
    doubling_hours: float = 1.0
    doubling_replicas: int = 2  # the slice of the fleet the what-if simulates
    eviction: str = "lru"
    model_path: str | None = None
    cap_margin: int = 0  # lower the gateway cap this many grid steps below the knee
    engine_model: str = "sglang"  # the twin's engine model: sglang or vllm
    calibration: Calibration | None = None  # a fitted profile's constants (None: built in)


def model_path(req: PlanRequest, weights: str) -> str:
    if req.model_path is not None:
        return req.model_path
    ids = HF_MODEL_IDS.get(req.model.name)
    return ids[weights] if ids and weights in ids else req.model.name


def engine_spec(req: PlanRequest, weights: str, kv: str, **changes: Any) -> EngineSpec:
    spec = EngineSpec(req.gpu, req.model, precision(weights, kv),
                      mem_fraction=req.mem_fraction,
                      eviction_policy=req.eviction if req.engine_model == "sglang" else "lru",
                      engine_model=req.engine_model, calibration=req.calibration)
    return replace(spec, **changes)


def pool_of(req: PlanRequest, weights: str, kv: str) -> PoolPlan | VLLMPoolPlan:
    prof = req.profile
    if req.engine_model == "vllm":
        return plan_vllm_pool(req.gpu, req.model, weights, kv,
                              gpu_memory_utilization=req.mem_fraction)
    return plan_pool(req.gpu, req.model, weights, kv, mem_fraction=req.mem_fraction,
                     request_tokens=prof.input_len + prof.output_len,
                     system_prompt_tokens=prof.system_prompt_tokens)


def pool_json(req: PlanRequest, pool: PoolPlan | VLLMPoolPlan) -> PoolFigures:
    """The pool's figures, with what fits in it (vLLM's as SGLang's are counted)."""
    out = pool.to_json()
    if isinstance(pool, VLLMPoolPlan):
        prof = req.profile
        system, request = prof.system_prompt_tokens, prof.input_len + prof.output_len
        out.update(request_tokens=request, system_prompt_tokens=system,
                   requests_fit=max(0, (pool.kv_pool_tokens - system) // request),
                   prompts_fit=pool.kv_pool_tokens // system if system else 0)
    return PoolFigures(out)
