"""What `chatfleet sweep` is asked to do (its command line, typed): the targets and the engine,
the loads and the workload, the run window, the method's settings (flush, cool-down, the clock
floor, the client's lag bounds), refinement and the API. The sweep (bench/sweep.py) and each
of its runs (bench/live_run.py) read it; nothing changes it while they run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatfleet.bench.text_pool import DEFAULT_WORKERS
from chatfleet.core.defaults import COOLDOWN_MAX_S, DRAIN_S, DURATION_S, SEED, WARMUP_S
from chatfleet.core.documents.sweep import Load
from chatfleet.core.refine import BISECT_MAX_RUNS, EXTEND_MAX_RUNS, RefinePolicy
from chatfleet.core.slo import SLO
from chatfleet.core.workload import WorkloadConfig


@dataclass
class LiveSweepConfig:
    targets: list[str]
    engine: str
    model: str
    loads: list[Load]
    wcfg: WorkloadConfig
    out: Path
    slo: SLO = field(default_factory=SLO)
    duration_s: float = DURATION_S
    warmup_s: float = WARMUP_S
    drain_s: float = DRAIN_S
    flush: bool = True
    seed: int = SEED
    telemetry: str = "none"
    cooldown_temp_c: float | None = None
    cooldown_max_s: float = COOLDOWN_MAX_S
    clock_floor_mhz: float | None = None
    resume: bool = False
    refine: bool = False
    refine_max_runs: int = BISECT_MAX_RUNS  # bisection runs per bracket
    refine_extend_max_runs: int = EXTEND_MAX_RUNS  # doublings/halvings
    refine_max_users: int = 1024  # an open closed-loop bracket is never extended beyond it
    refine_budget_s: float | None = None  # wall time for all refinement runs together
    cap_margin: int = 0
    api: str = "chat"  # chat | completions-ids
    thinking: bool = False
    api_key: str | None = None
    max_send_lag_ms: float = 50.0
    max_loop_lag_ms: float = 10.0
    labels: dict[str, Any] = field(default_factory=dict)  # gpu, weights, kv_cache for reports
    save_records: bool = True
    prompt_workers: int = DEFAULT_WORKERS  # processes that build chat prompt texts

    def refine_policy(self) -> RefinePolicy:
        return RefinePolicy(extend_max_runs=self.refine_extend_max_runs,
                            bisect_max_runs=self.refine_max_runs,
                            max_concurrency=self.refine_max_users)
