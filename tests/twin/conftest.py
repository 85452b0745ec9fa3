from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.run import PointRun, run_point

MIXED = LengthSpec("uniform", 512, 128, 0.5, "vllm")  # same means as fixed 512/128


def engine(prec: str = "bf16", **kw: Any) -> EngineSpec:
    return EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision(prec, prec), **kw)


def closed(spec: EngineSpec, users: int, wcfg: WorkloadConfig | None = None,
           duration: float = 300.0, warmup: float = 30.0, seed: int = 1) -> PointRun:
    return run_point(spec, wcfg or WorkloadConfig(), ClosedLoad(users),
                     duration_s=duration, warmup_s=warmup, seed=seed)


@pytest.fixture
def run_closed() -> Callable[..., PointRun]:
    return closed
