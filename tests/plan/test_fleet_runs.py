"""The doubled-traffic hour's fleet runs: in worker processes where there are cores, the same
points as one after another."""

from __future__ import annotations

import pytest

from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import WorkloadConfig
from chatfleet.jobs import plan as plan_job
from chatfleet.jobs.plan import FleetRun, run_fleet_runs
from chatfleet.twin.fleet import FleetConfig


def runs() -> list[FleetRun]:
    fleet = FleetConfig(replicas=2, cap=8, queue_depth=8, ttft_budget_s=1.0)
    out = []
    for users, thermal in ((12, False), (24, True), (30, False)):
        spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"),
                          thermal=thermal, max_running_requests=8)
        out.append(FleetRun(spec, WorkloadConfig(system_prompt_tokens=512), ClosedLoad(users),
                            fleet, duration_s=30.0, seed=7 + users, slo=SLO()))
    return out


@pytest.mark.timeout(180)
def test_worker_processes_give_the_points_of_one_after_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_job.os, "cpu_count", lambda: 1)
    here = run_fleet_runs(runs())
    monkeypatch.setattr(plan_job.os, "cpu_count", lambda: 2)
    pools: list[int] = []
    real = plan_job.ProcessPoolExecutor

    def counted(workers: int, **kw: object) -> object:
        pools.append(workers)
        return real(workers, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(plan_job, "ProcessPoolExecutor", counted)
    spawned = run_fleet_runs(runs())
    assert pools == [2]  # two workers for three runs on two cores
    assert [p.to_json() for p in spawned] == [p.to_json() for p in here]
    assert [p.load for p in spawned] == [ClosedLoad(12), ClosedLoad(24), ClosedLoad(30)]
    assert spawned[1].gpu.modelled is not None and spawned[1].gpu.modelled.thermal_model
