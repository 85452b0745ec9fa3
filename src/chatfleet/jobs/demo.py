"""`chatfleet demo`: the question answered for Qwen3-8B on L4 without a GPU, then the answer
proved live.

1. The pool math for BF16 and FP8.
2. The plan through the twin: a flushed closed-loop sweep and a fixed-rate sweep per precision
   (the shared 2,048-token system prompt, lengths uniform within +-50%), each knee bisected to
   one user; the recommendation, doubled traffic, the launch commands, the gateway config.
3. Live: two simserver replicas (the same engine model, in wall-clock time) behind the gateway
   at the recommended cap, driven at twice the fleet's cap for a bounded time, beside the
   twin's prediction of the same run; the replicas' own traces show the cap held. Written as a
   chatfleet.live-proof/1 document (live/proof.json; the run's point stays in live/sweep.json
   for machines).
4. The HTML report of the two twin sweeps, with the live proof in its own section.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from chatfleet.bench.client import StreamOutcome
from chatfleet.core.defaults import SEED
from chatfleet.core.documents.plan import Plan, Recommendation
from chatfleet.core.documents.sweep import ClosedLoad, Load, SweepPoint
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.measure.knee import sweep_document
from chatfleet.core.records import record_to_json
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import SessionProfile
from chatfleet.io import write_atomic, write_json
from chatfleet.jobs.parity import FleetParity, run_fleet_parity
from chatfleet.jobs.plan import PlanRequest, Progress, make_plan
from chatfleet.report.build import PROOF_SCHEMA, build_report
from chatfleet.twin.fleet import MEASURED_HOP_S, FleetConfig
from chatfleet.twin.run import target_block

GPU, MODEL = "l4", "qwen3-8b"


@dataclass(frozen=True, slots=True)
class DemoConfig:
    out: Path
    users: int = 200
    live_s: float = 60.0
    warmup_s: float = 20.0  # past the first wave: all users start at once
    overload: float = 2.0  # the live load, in multiples of the fleet's cap
    replicas: int = 2
    cap_margin: int = 0  # the plan's default (docs/facts.md#the-method: meets is below `fails`)
    seed: int = SEED
    live: bool = True
    profile: SessionProfile = field(default_factory=SessionProfile)  # the plan's and the live run's


def run_plan(cfg: DemoConfig, progress: Progress | None) -> Plan:
    req = PlanRequest(get_gpu(GPU), builtin_model(MODEL), users=cfg.users, seed=cfg.seed,
                      cap_margin=cfg.cap_margin, profile=cfg.profile)
    plan = make_plan(req, progress)
    write_json(cfg.out / "plan.json", plan.to_json())
    for name, sweep in plan.sweeps.items():
        write_json(cfg.out / f"twin-{name}.json",
                   None if sweep.document is None else sweep.document.to_json())
    return plan


def run_live(cfg: DemoConfig, plan: Plan) -> dict[str, Any]:
    """The recommended precision on `replicas` simserver replicas behind the gateway at the
    recommended cap, `overload` times the fleet's cap of closed-loop users for `live_s`."""
    rec: Recommendation | None = plan.recommendation
    gw = plan.gateway_config
    assert rec is not None and gw is not None  # run only for a plan with a recommendation
    spec = EngineSpec(get_gpu(GPU), builtin_model(MODEL), precision(rec.weights, rec.kv_cache),
                      max_running_requests=rec.engine_guard)
    wcfg = cfg.profile.workload()
    fleet = FleetConfig(replicas=cfg.replicas, cap=rec.gateway_cap,
                        queue_depth=rec.gateway_cap * cfg.replicas,
                        ttft_budget_s=gw["ttft_budget_s"],
                        prefill_reserve_s=gw["prefill_reserve_s"], hop_s=MEASURED_HOP_S)
    users = round(cfg.overload * cfg.replicas * rec.gateway_cap)
    load = ClosedLoad(users)
    live_dir = cfg.out / "live"
    live_dir.mkdir(parents=True, exist_ok=True)
    res = run_fleet_parity(spec, wcfg, load, fleet, duration_s=cfg.live_s,
                           warmup_s=cfg.warmup_s, seed=cfg.seed, trace=live_dir / "trace.jsonl")
    # every request the client sent, retries included: `plan --trace live/records.jsonl`
    # replays the run through the fleet twin (docs/traffic.md)
    write_atomic(live_dir / RECORDS_FILE,
                 b"".join(orjson.dumps(record_to_json(r)) + b"\n" for r in res.drive.records))
    live = replace(res.live_point, fleet=replace(
        fleet.block(), max_in_flight_seen_by_replicas=res.max_in_flight))
    target = {**target_block(spec), "engine": "simserver", "via": "chatfleet gateway",
              "fleet": fleet.to_json()}
    workload = {**wcfg.to_json(), "duration_s": cfg.live_s, "warmup_s": cfg.warmup_s,
                "seed": cfg.seed}
    doc = sweep_document(target, workload, SLO(), [live])
    write_json(live_dir / "sweep.json", doc.to_json())
    proof = proof_document(cfg, rec.gateway_cap, load, target, live, res)
    write_json(live_dir / PROOF_FILE, proof)
    return {"users": users, "cap": rec.gateway_cap, "replicas": cfg.replicas,
            "live": proof["live"], "twin": proof["twin"],
            "max_in_flight_seen_by_replicas": res.max_in_flight,
            "sweep": str(live_dir / "sweep.json"), "proof": str(live_dir / PROOF_FILE)}


PROOF_FILE = "proof.json"
RECORDS_FILE = "records.jsonl"


def proof_document(cfg: DemoConfig, cap: int, load: Load, target: dict[str, Any],
                   live: SweepPoint, res: FleetParity) -> dict[str, Any]:
    """The live run as a chatfleet.live-proof/1 document (docs/report.md): the cap, the load
    as a multiple of the fleet's cap, attempts, shed (with Retry-After), admitted attainment
    and each replica's own peak in flight from its trace, the twin's prediction beside it."""
    window = (cfg.warmup_s, cfg.warmup_s + cfg.live_s)
    twin = res.twin_point
    twin_peaks = (() if twin is None or twin.fleet is None or twin.fleet.max_in_flight is None
                  else twin.fleet.max_in_flight)
    return {
        "schema": PROOF_SCHEMA,
        "target": {k: target[k] for k in ("gpu", "model", "weights", "kv_cache", "engine",
                                          "via")},
        "replicas": cfg.replicas, "cap_per_replica": cap, "load": load.to_json(),
        "load_multiple": cfg.overload, "duration_s": cfg.live_s, "warmup_s": cfg.warmup_s,
        "live": {**summary(live), **shed_answers(res.drive.outcomes, load.mode, window),
                 "peak_in_flight": dict(sorted(res.max_in_flight.items()))},
        "twin": {**(summary(twin) if twin is not None else {}),
                 "peak_in_flight": {f"replica-{i}": n for i, n in enumerate(twin_peaks)}},
        "peak_in_flight_source": "the replicas' own traces (trace.jsonl)",
        "files": {"sweep": "sweep.json", "trace": "trace.jsonl", "records": RECORDS_FILE},
    }


def summary(point: SweepPoint) -> dict[str, Any]:
    """The proof's figures of one side's point: attempts are the point's offered requests
    (every attempt of the window, the retries of shed users included)."""
    r = point.requests
    return {"attempts": r.offered, "completed": r.completed, "shed": r.shed,
            "failed": r.failed, "admitted_attainment": point.admitted_attainment,
            "attainment": point.attainment, "ttft_p99_ms": point.ttft_ms.p99,
            "tpot_p99_ms": point.tpot_ms.p99, "goodput_rps": point.goodput_rps}


def shed_answers(outcomes: Sequence[StreamOutcome], mode: str,
                 window: tuple[float, float]) -> dict[str, Any]:
    """Of the window's shed answers (as the point counts them: sent in the window in closed
    loop, scheduled in it in open loop), how many carried a Retry-After, and its median (s)."""
    def at(o: StreamOutcome) -> float:
        return o.record.send_time if mode == "closed" else o.record.scheduled_time

    waits = [o.retry_after_s for o in outcomes
             if o.record.outcome == "shed" and window[0] <= at(o) < window[1]]
    given = [w for w in waits if w is not None]
    return {"shed_with_retry_after": len(given),
            "retry_after_s_p50": statistics.median(given) if given else None}


def run_demo(cfg: DemoConfig, progress: Progress | None = None,
             stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    say = stage or (lambda _: None)
    say("the plan through the twin: BF16 and FP8 sweeps, knees bisected to one user")
    plan = run_plan(cfg, progress)
    result: dict[str, Any] = {"out": str(cfg.out), "plan": str(cfg.out / "plan.json")}
    sources = [cfg.out / f"twin-{name}.json" for name in plan.sweeps]
    if cfg.live and plan.recommendation is not None:
        rec = plan.recommendation
        say(f"live: {cfg.replicas} simserver replicas behind the gateway at cap "
            f"{rec.gateway_cap}, {cfg.overload:g}x the fleet's cap for {cfg.live_s:g} s")
        result["live"] = run_live(cfg, plan)
    say("the report")
    # the live run is a proof of the cap, not a sweep: its own section, never a knee line
    paths = build_report(sources, out_dir=cfg.out,
                         title="chatfleet demo: Qwen3-8B on L4 (twin and simserver)",
                         live_proof=result["live"]["proof"] if "live" in result else None)
    result["report"] = str(paths.html)
    write_json(cfg.out / "demo.json", result)
    return {**result, "plan_doc": plan}
