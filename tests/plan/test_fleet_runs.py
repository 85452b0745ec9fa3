"""The plan's twin sweeps and the doubled-traffic hour's fleet runs: in worker processes where
there are cores, the same points and the same plan as one after another in this process, with
the same progress."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import WorkloadConfig
from chatfleet.jobs import workers
from chatfleet.jobs.plan import (
    DOUBLING_RUNS,
    FLEET_STEP,
    FleetRun,
    PlanRequest,
    make_plan,
    run_fleet_runs,
)
from chatfleet.jobs.workers import WorkerPool
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


class Spawns:
    """The worker processes the pools of a test start."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pids: list[list[int]] = []
        real = WorkerPool.__enter__

        def enter(pool: WorkerPool) -> WorkerPool:
            out = real(pool)
            self.pids.append(pool.pids())
            return out

        monkeypatch.setattr(WorkerPool, "__enter__", enter)


@pytest.mark.timeout(180)
def test_worker_processes_give_the_points_of_one_after_another(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spawns = Spawns(monkeypatch)
    with WorkerPool(1) as pool:
        here = run_fleet_runs(runs(), pool)
    with WorkerPool(2) as pool:
        spawned = run_fleet_runs(runs(), pool)
    assert [len(p) for p in spawns.pids] == [0, 2]  # two workers for three runs
    assert [p.to_json() for p in spawned] == [p.to_json() for p in here]
    assert [p.load for p in spawned] == [ClosedLoad(12), ClosedLoad(24), ClosedLoad(30)]
    assert spawned[1].gpu.modelled is not None and spawned[1].gpu.modelled.thermal_model


def test_the_longest_likely_run_starts_first() -> None:
    """Doubled traffic before the target's, and at each, the thermal model off first (the
    card never slows, so it serves the most in the hour): the order measured on an L4 plan's
    four runs (4.4, 2.9, 2.8, 1.8 s)."""
    fleet = FleetConfig(replicas=2, cap=8, queue_depth=8, ttft_budget_s=1.0)
    plan_order = []
    for users in (100, 200):
        for thermal in (False, True):
            spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"),
                              precision("fp8", "fp8"), thermal=thermal)
            plan_order.append(FleetRun(spec, WorkloadConfig(), ClosedLoad(users), fleet,
                                       duration_s=3600.0, seed=1, slo=SLO()))
    started = sorted(plan_order, key=FleetRun.longest_first, reverse=True)
    assert [(r.load.value, r.spec.thermal) for r in started] == [
        (200, False), (200, True), (100, False), (100, True)]


SMALL = PlanRequest(gpu=get_gpu("l4"), model=builtin_model("qwen3-8b"), users=40,
                    grid=(1, 4, 8, 16), rates=(0.5, 1.0), duration_s=30.0, warmup_s=5.0,
                    doubling_hours=0.05)


def plan_on(cores: int, monkeypatch: pytest.MonkeyPatch,
            req: PlanRequest = SMALL) -> tuple[dict[str, Any], list[tuple[str, int, int]]]:
    monkeypatch.setattr(workers.os, "cpu_count", lambda: cores)
    calls: list[tuple[str, int, int]] = []
    doc = make_plan(req, lambda what, done, total: calls.append((what, done, total)))
    return doc.to_json(), calls


@pytest.mark.timeout(300)
def test_the_plan_in_workers_is_the_plan_in_one_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spawns = Spawns(monkeypatch)
    here, here_calls = plan_on(1, monkeypatch)
    spawned, spawned_calls = plan_on(2, monkeypatch)
    # one core: no process at all; two: one pool of two for the whole plan
    assert [len(p) for p in spawns.pids] == [0, 2]
    assert spawned == here
    assert here["recommendation"] is not None and len(here["doubling"]["runs"]) == DOUBLING_RUNS
    assert set(here["sweeps"]) == {"bf16", "fp8"}
    # the bars move a step per sweep point and per fleet run, and end at their totals, the
    # same steps whichever process ran them
    assert spawned_calls == here_calls
    sweeps = [c for c in here_calls if c[0] == "twin sweeps"]
    assert len(sweeps) > 10 and sweeps[-1][1] == sweeps[-1][2]
    assert [d for _, d, _ in sweeps] == sorted(d for _, d, _ in sweeps)
    fleet = [c for c in here_calls if c[0] == FLEET_STEP]
    assert fleet == [(FLEET_STEP, i, DOUBLING_RUNS) for i in range(DOUBLING_RUNS + 1)]


@pytest.mark.timeout(300)
def test_one_precisions_sweeps_and_the_fleet_runs_give_one_plan_on_any_workers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One precision is three sweeps (as fitted and at the two edges of the error band), a
    batch the pool's workers take like the fleet runs; one worker or two, the same plan."""
    spawns = Spawns(monkeypatch)
    ran: list[int] = []
    real = WorkerPool.run

    def run(pool: WorkerPool, tasks: Any, *args: Any, **kw: Any) -> Any:
        ran.append(len(tasks))
        return real(pool, tasks, *args, **kw)

    monkeypatch.setattr(WorkerPool, "run", run)
    one = dataclasses.replace(SMALL, precisions=(("fp8", "fp8"),))
    here, _ = plan_on(1, monkeypatch, one)
    spawned, _ = plan_on(2, monkeypatch, one)
    assert [len(p) for p in spawns.pids] == [0, 2]
    # then, where the target hour throttles, the one hour that checks the fleet at the
    # clock the card holds (issue 25 item 5; its sweep runs in the plan's own process)
    held = [1] if here.get("held_clock") else []
    assert ran == [3, DOUBLING_RUNS, *held] * 2
    assert spawned == here and set(here["sweeps"]) == {"fp8"}
