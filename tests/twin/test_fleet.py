"""The twin as a fleet: replicas behind the gateway's admission and routing (core/fleet)."""

from __future__ import annotations

import pytest

from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.fleet import FleetConfig, run_fleet_point
from tests.twin.conftest import MIXED, engine

MULTI = WorkloadConfig(lengths=LengthSpec("uniform", 256, 128, 0.5, "vllm"), turns=4,
                       think_time_s=5.0)


def test_at_three_times_the_cap_no_replica_exceeds_it_and_the_rest_is_shed() -> None:
    fleet = FleetConfig(replicas=2, cap=8, queue_depth=8)
    run = run_fleet_point(engine("fp8"), WorkloadConfig(lengths=MIXED),
                          ClosedLoad(48), fleet, duration_s=120.0,
                          warmup_s=10.0)
    p = run.point
    assert p.fleet.max_in_flight == (8, 8)
    assert p.engine.max_running <= 8
    assert p.requests.shed > 0
    shed = [r for r in run.records if r.outcome == "shed"]
    assert all("retry-after" in (r.error or "") for r in shed)
    # every request ends admitted (completed) or shed
    assert p.requests.offered == p.requests.completed + p.requests.shed
    # shed users come back after their Retry-After: later attempts exist
    assert any("#" in r.request_id for r in run.records)
    assert p.admitted_attainment > p.attainment


def test_session_affinity_keeps_histories_cached() -> None:
    load = ClosedLoad(24)
    share = {}
    for affinity in (True, False):
        fleet = FleetConfig(replicas=3, cap=16, queue_depth=32, affinity=affinity)
        run = run_fleet_point(engine("fp8"), MULTI, load, fleet, duration_s=180.0,
                              warmup_s=20.0, seed=4)
        share[affinity] = run.point.cached_token_share
        if affinity:  # every session stayed on one replica (none was hot)
            by_session: dict[str, set[str | None]] = {}
            for r in run.records:
                if r.outcome == "ok":
                    by_session.setdefault(r.session_id, set()).add(r.replica)
            assert all(len(v) == 1 for v in by_session.values())
    assert share[True] > share[False] + 0.05


def test_bad_fleet_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        FleetConfig(replicas=0, cap=4)
    with pytest.raises(ValueError):
        FleetConfig(replicas=2, cap=0)
