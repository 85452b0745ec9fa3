"""The plan's doubled-traffic hour (`doubling`): the recommended fleet's slice behind the
gateway's own admission and routing, at the target users and at twice as many, each with the
thermal model off and on, run on the plan's worker pool; and the thermal verdict of a run
(`cooling_block`)."""

from __future__ import annotations

from chatfleet.core.documents.doubling import Cooling, CoolingProfile, Doubling, DoublingRun
from chatfleet.core.documents.sweep import ClosedLoad, GpuBlock, SweepPoint
from chatfleet.core.engine.build import EngineSpec, thermal_profile_of
from chatfleet.core.engine.thermal import cooling_need
from chatfleet.core.plan import PrecisionFigures, prefill_reserve_s
from chatfleet.jobs.plan_request import PlanRequest, engine_spec
from chatfleet.jobs.plan_tasks import FleetRun
from chatfleet.jobs.workers import Tick, WorkerPool
from chatfleet.twin.fleet import MEASURED_HOP_S, FleetConfig

FLEET_STEP = "target and doubled traffic through the fleet twin"
DOUBLING_LEVELS = (("target", 1), ("doubled", 2))  # traffic, users x
THERMAL_MODELS = (False, True)  # each level with the thermal model off and on
DOUBLING_RUNS = len(DOUBLING_LEVELS) * len(THERMAL_MODELS)


def doubling(req: PlanRequest, fig: PrecisionFigures, replicas: int, queue_depth: int,
             pool: WorkerPool, tick: Tick | None = None) -> Doubling:
    """An hour at the target users and an hour at twice as many, each with the thermal model
    off (what the traffic alone does: the queue, the sheds) and on (what the clocks add),
    through a slice of the fleet: the gateway's own admission and routing in front, the engine
    guard set. The fleet is symmetric, so `doubling_replicas` replicas with their share of the
    users stand for the whole. Each thermal-on run carries `cooling`: what its load (its mix
    at the loaded clock, from the thermal-off run) asks of the cooling, and what the card
    did under the modelled cooling. The runs go to `pool` (`tick` after each)."""
    runs = fleet_runs_of(req, fig, replicas, queue_depth, pool, DOUBLING_LEVELS,
                         THERMAL_MODELS, tick)
    return Doubling(hours=req.doubling_hours, users=req.users, doubled_users=2 * req.users,
                    replicas=replicas, replicas_simulated=max(1, min(replicas,
                                                                     req.doubling_replicas)),
                    runs=tuple(runs))


def fleet_runs_of(req: PlanRequest, fig: PrecisionFigures, replicas: int, queue_depth: int,
                  pool: WorkerPool, levels: tuple[tuple[str, int], ...],
                  thermal_models: tuple[bool, ...],
                  tick: Tick | None = None) -> list[DoublingRun]:
    """The doubling's runs for these traffic levels (name, users x) and thermal models, on a
    slice of a fleet of `replicas` at the figures' cap; a thermal-on run right after the
    same level's thermal-off run carries its cooling verdict."""
    assert fig.gateway_cap is not None
    k = max(1, min(replicas, req.doubling_replicas))
    budget = req.slo.ttft_ms / 1000.0
    fleet = FleetConfig(replicas=k, cap=fig.gateway_cap, queue_depth=queue_depth,
                        ttft_budget_s=budget, hop_s=MEASURED_HOP_S,
                        prefill_reserve_s=prefill_reserve_s(fig, budget))
    labelled: list[tuple[str, FleetRun]] = []
    for traffic, factor in levels:
        users = max(1, round(req.users * factor * k / replicas))
        for thermal in thermal_models:
            spec = engine_spec(req, fig.weights, fig.kv_cache, thermal=thermal,
                               max_running_requests=fig.gateway_cap)
            labelled.append((traffic, FleetRun(
                spec, req.profile.workload(), ClosedLoad(users), fleet,
                duration_s=req.doubling_hours * 3600.0, seed=req.seed + 1000 + factor,
                slo=req.slo)))
    points = run_fleet_runs([run for _, run in labelled], pool, tick)
    runs: list[DoublingRun] = []
    for (traffic, run), p in zip(labelled, points, strict=True):
        assert p.fleet is not None and p.fleet.max_in_flight is not None
        r = p.requests
        cool = (runs[-1] if runs and runs[-1].traffic == traffic
                and not runs[-1].thermal_model else None)
        runs.append(DoublingRun(
            traffic=traffic, thermal_model=run.spec.thermal,
            users_simulated=int(run.load.value), requests=r,
            shed_share=round(r.shed / max(1, r.offered), 4), attainment=p.attainment,
            admitted_attainment=p.admitted_attainment,
            goodput_rps_per_replica=round(p.goodput_rps / k, 4),
            ttft_ms=p.ttft_ms, tpot_ms=p.tpot_ms, gateway_queue_max=p.fleet.max_queue,
            max_in_flight=p.fleet.max_in_flight, gpu=p.gpu,
            cooling=(cooling_block(run.spec, cool.gpu, p.gpu)
                     if run.spec.thermal and cool is not None else None)))
    return runs


def run_fleet_runs(runs: list[FleetRun], pool: WorkerPool,
                   tick: Tick | None = None) -> list[SweepPoint]:
    """The runs' points, in order. Each run is its own seeded simulation, so they run at once
    in the pool's workers, the likely longest first (so that the last to start is short), and
    give the same points as one after another here, which is what a one-core machine does."""
    return pool.run(runs, tick, key=FleetRun.longest_first)


def cooling_block(spec: EngineSpec, cool: GpuBlock, hot: GpuBlock) -> Cooling:
    """The thermal verdict of one traffic level: the load's mix at the loaded clock (`cool`,
    the thermal-off run's gpu block), what that asks of the modelled cooling, and what the
    card did under it (`hot`, the thermal-on run's)."""
    profile = thermal_profile_of(spec)
    assert cool.modelled is not None  # the twin's gpu blocks carry their modelled figures
    mix = cool.modelled
    need = cooling_need(profile, mix.busy_share, mix.prefill_share or 0.0).to_json()
    return Cooling(
        profile=CoolingProfile(inlet_c=profile.ambient_c,
                               r_c_per_w=round(profile.r_c_per_w, 3),
                               tau_s=round(profile.tau_s, 1), slowdown_c=profile.slowdown_c,
                               loaded_mhz=profile.loaded_mhz, source=profile.source),
        busy_share=mix.busy_share, prefill_share=mix.prefill_share,
        loaded_power_w=need["loaded_power_w"], decode_power_w=need["decode_power_w"],
        hold_w=need["hold_w"], steady_temp_c=need["steady_temp_c"],
        holds_clock=bool(need["holds_clock"]), max_inlet_c=need["max_inlet_c"],
        max_r_c_per_w=need["max_r_c_per_w"], cooling_factor=need["cooling_factor"],
        max_busy_share=need["max_busy_share"],
        held_clock=hot.thermal_slowdown_share == 0.0,
        slowdown_after_s=None if hot.modelled is None else hot.modelled.slowdown_after_s,
        settled_mhz=hot.sm_clock_mhz.p50)
