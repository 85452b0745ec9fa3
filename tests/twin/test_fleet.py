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


def test_the_learned_reserve_keeps_the_promise_to_the_admitted() -> None:
    """Issue 23: two replicas of cap 4 at 3x their cap, 4-turn sessions on the shared 2,048-
    token prompt, TTFT budget 1 s and no configured reserve. With the reserve fixed at 0, a
    request admitted from the queue just before arrival + 1 s has its first token after it
    (0.90 of the admitted met the target); learned from the engine's own first tokens (one
    hop after them, as the gateway sees them), every admitted request meets it. The cold
    start's first wave (all prefilling at once) holds the reserve at its bound for a window;
    then it is the engine's 0.18-0.24 s, and as many users are served."""
    wcfg = WorkloadConfig(system_prompt_tokens=2048,
                          lengths=LengthSpec("uniform", 256, 128, 0.5, "vllm"), turns=4,
                          think_time_s=0.0)
    points = {}
    for learn in (False, True):
        fleet = FleetConfig(replicas=2, cap=4, queue_depth=8, hop_s=0.002,
                            learn_reserve=learn)
        points[learn] = run_fleet_point(engine("fp8"), wcfg, ClosedLoad(24), fleet,
                                        duration_s=60.0, warmup_s=3.0, seed=7).point
    assert points[False].admitted_attainment < 0.99
    assert points[True].admitted_attainment >= 0.99
    assert points[True].requests.admitted >= 0.95 * points[False].requests.admitted
    learned = points[True].fleet
    assert learned is not None and learned.learn_reserve and learned.reserve_s is not None
    assert all(0.1 < v < 0.4 for v in learned.reserve_s.values()), learned.reserve_s
    assert points[False].fleet is not None and points[False].fleet.reserve_s is None


def test_strict_stickiness_never_spills() -> None:
    fleet = FleetConfig(replicas=2, cap=4, queue_depth=8, spill="never")
    p = run_fleet_point(engine("fp8"), MULTI, ClosedLoad(16), fleet, duration_s=30.0,
                        warmup_s=5.0).point
    assert p.fleet is not None and p.fleet.routes is not None
    assert p.fleet.routes.get("spill", 0) == 0 and p.fleet.routes["hit"] > 0
    with pytest.raises(ValueError, match="spill must be one of"):
        FleetConfig(replicas=2, cap=4, spill="sometimes")  # type: ignore[arg-type]
