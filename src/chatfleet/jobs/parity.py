"""Twin against simserver: the same workload and seed through the engine model in virtual time
and through the simserver in wall-clock time, compared in model time."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from chatfleet.bench.client import Clock, make_session
from chatfleet.bench.drive import DriveResult, drive
from chatfleet.bench.payload import IdsPayload
from chatfleet.core.defaults import TWIN_DRAIN_S
from chatfleet.core.documents.sweep import ClosedLoad, EngineBlock, Load, SweepPoint
from chatfleet.core.engine.build import EngineSpec, step_time_model
from chatfleet.core.fleet.fleet import FleetTrace, replay
from chatfleet.core.fleet.reserve import ReserveSettings
from chatfleet.core.measure.percentiles import percentiles
from chatfleet.core.measure.point import summarize_point
from chatfleet.core.records import RequestRecord
from chatfleet.core.slo import SLO
from chatfleet.core.workload import ClosedLoop, Workload, WorkloadConfig, driver_for
from chatfleet.gateway.admission import DecisionLog, fleet_settings
from chatfleet.gateway.app import Gateway
from chatfleet.gateway.config import GatewayConfig, Overrides, Routing
from chatfleet.gateway.server import serve_in_thread as gateway_in_thread
from chatfleet.simserver.server import ServerConfig, serve_in_thread
from chatfleet.twin.fleet import run_fleet_point
from chatfleet.twin.run import run_point


@dataclass(slots=True)
class ParityResult:
    twin: SweepPoint
    live: SweepPoint
    live_engine: EngineBlock
    emission_lag_ms: dict[str, float]
    drive: DriveResult
    model_time_lost_s: float = 0.0  # lost by the simserver to its host, up to the window's end
    time_scale: float = 1.0

    def host_kept_up(self, max_lag_model_ms: float = 100.0) -> bool:
        """Whether the host delivered on time, so that the live side's model-time figures
        measure the model and not the machine: the simserver's emission lag and the client's
        event-loop lag within `max_lag_model_ms` at their p99, in model time (a host delay of
        d wall seconds costs d x time_scale model seconds; 100 ms is a tenth of the TTFT
        target, 10 ms of wall time at time scale 10). The model time a held-up replica lost
        is not part of it: `run_parity` takes those stalls out of the live side's clock."""
        lags = self.drive.loop_lag_ms
        loop_p99 = percentiles(lags, (99.0,))["p99"] if lags else 0.0
        emission_p99 = self.emission_lag_ms.get("p99", 0.0)
        return max(loop_p99, emission_p99) * self.time_scale <= max_lag_model_ms


def engine_from_trace(path: Path, start: float, end: float) -> EngineBlock:
    """The engine block (as the twin reports it) from a simserver trace's step rows."""
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    steps = [r for r in rows if r["type"] == "step" and start <= r["t"] <= end]
    dec = [r for r in steps if r["kind"] == "decode"]
    return EngineBlock(max_running=max((r["batch"] for r in dec), default=0),
                       max_queue=max((r["queue"] for r in dec), default=0),
                       peak_token_usage=max((r["token_usage"] for r in dec), default=0.0))


def emission_lag(path: Path, scale: float) -> dict[str, float]:
    """How late the simserver emitted its tokens against its plan, ms: p50, p99 (linear, as
    every request figure: core.measure.percentiles), max and n."""
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    lags = [(r["actual"] - r["planned"]) * 1000 / scale for r in rows if r["type"] == "token"]
    if not lags:
        return {"n": 0}
    q = percentiles(lags, (50.0, 99.0))
    return {"p50": q["p50"], "p99": q["p99"], "max": max(lags), "n": len(lags)}


def host_stalls(path: Path) -> list[tuple[float, float]]:
    """The model-time intervals in which the simserver lost its model's timeline to its host:
    a replica more than 50 ms (wall) behind starts its next step from the present, and the
    trace's "resync" row says from when (`t`) and how much time that skipped (`lost_s`)."""
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    return [(r["t"] - r["lost_s"], r["t"]) for r in rows if r["type"] == "resync"]


def without_stalls(t: float, stalls: list[tuple[float, float]]) -> float:
    """`t` on a clock that stops during the stalls."""
    return t - sum(max(0.0, min(t, end) - start) for start, end in stalls)


def records_without_stalls(records: list[RequestRecord],
                           stalls: list[tuple[float, float]]) -> list[RequestRecord]:
    """The records with every time on a clock that stopped while the host held the engine up
    (for a single replica: its stalls are the engine's)."""
    if not stalls:
        return records

    def at(t: float) -> float:
        return without_stalls(t, stalls)

    return [dataclasses.replace(
        r, scheduled_time=at(r.scheduled_time), send_time=at(r.send_time),
        first_token_time=None if r.first_token_time is None else at(r.first_token_time),
        token_times=[at(float(t)) for t in r.token_times]) for r in records]


def run_parity(spec: EngineSpec, wcfg: WorkloadConfig, users: int, *, duration_s: float,
               warmup_s: float, seed: int, time_scale: float, trace: Path) -> ParityResult:
    load = ClosedLoad(users)
    twin = run_point(spec, wcfg, load, duration_s=duration_s, warmup_s=warmup_s, seed=seed)
    trace.unlink(missing_ok=True)
    end = warmup_s + duration_s
    with serve_in_thread(ServerConfig(spec=spec, time_scale=time_scale, trace=trace)) as srv:
        async def main() -> DriveResult:
            async with make_session() as session:
                driver = ClosedLoop(Workload(wcfg, random.Random(seed)), users)
                return await drive(srv.urls, driver, IdsPayload("qwen3-8b"),
                                   window_end=end, drain_s=TWIN_DRAIN_S, clock=Clock(time_scale),
                                   session=session)

        res = asyncio.run(main())
    # where the host held the engine up, the model lost time the twin never loses: the live
    # side is read on a clock that stopped meanwhile (the trace says exactly when)
    stalls = [s for s in host_stalls(trace) if s[0] < end]
    window = (without_stalls(warmup_s, stalls), without_stalls(end, stalls))
    live = summarize_point(records_without_stalls(res.records, stalls), load=load,
                           window=window, slo=SLO(), seed=seed, flushed=True,
                           time_scale=time_scale)
    return ParityResult(twin.point, live, engine_from_trace(trace, warmup_s, end),
                        emission_lag(trace, time_scale), res,
                        sum(b - a for a, b in stalls), time_scale)


# --- the fleet: twin (core/fleet in virtual time) against gateway + simservers (wall clock) ---
Outcomes = dict[str, tuple[str, str | None]]  # "session/turn#attempt" -> (outcome, replica)


@dataclass(slots=True)
class FleetParity:
    """Per request, keyed "session/turn#attempt" (request ids are numbered in the order the
    workload generated them, which a near-tie can swap): (outcome, replica) in the twin and
    live; the live replicas' largest in-flight count (running + waiting in the engine) read
    from the simserver trace; both points (summarize_point of each side's records)."""

    twin: Outcomes
    live: Outcomes
    twin_point: SweepPoint | None  # None when the twin was not run
    live_point: SweepPoint
    max_in_flight: dict[str, int]
    drive: DriveResult
    twin_records: list[Any]
    replay_agreement: float  # the gateway's traced core calls replayed: same decisions
    offer_order: list[str] = field(default_factory=list)  # request ids, as the gateway took them
    reserves: dict[str, float] = field(default_factory=dict)  # the gateway's, at the end
    # the gateway's own TTFT histogram: (streams whose first chunk came within the TTFT
    # budget of their arrival, streams)
    gateway_ttft_met: tuple[int, int] = (0, 0)
    routes: dict[str, int] = field(default_factory=dict)  # the gateway's admissions by rule

    def common(self) -> list[str]:
        return sorted(set(self.twin) & set(self.live))

    def decision_agreement(self) -> float:
        """Share of the requests both sides saw that got the same admit/shed decision."""
        ids = self.common()
        same = sum(1 for r in ids if (self.twin[r][0] == "shed") == (self.live[r][0] == "shed"))
        return same / len(ids) if ids else 0.0

    def arrival_swaps(self) -> list[tuple[str, str]]:
        """Neighbours the gateway took in the other order than they were scheduled, as
        (scheduled first, taken first) keys: the live fleet then got another trace than the
        twin. Each request has its own connection, and the client, the gateway and the
        engines share one process (and its GIL): under load, two requests sent a few
        milliseconds apart can reach the gateway's core in either order."""
        recs = {r.request_id: r for r in self.drive.records}
        order = [recs[rid] for rid in self.offer_order if rid in recs]
        return [(self._key_of(b), self._key_of(a)) for a, b in itertools.pairwise(order)
                if b.scheduled_time < a.scheduled_time]

    @staticmethod
    def _key_of(rec: Any) -> str:
        return _key(rec.session_id, rec.turn, rec.request_id)

    def same_session_replica(self) -> tuple[int, int]:
        """(sessions whose first admitted request went to the same replica on both sides,
        sessions admitted on both sides)."""
        def first(side: Outcomes) -> dict[str, str]:
            out: dict[str, str] = {}
            for key in sorted(side, key=_turn_order):
                outcome, replica = side[key]
                if outcome != "shed" and replica is not None:
                    out.setdefault(key.split("/", 1)[0], replica)
            return out
        t, v = first(self.twin), first(self.live)
        both = set(t) & set(v)
        return sum(1 for s in both if t[s] == v[s]), len(both)

    @staticmethod
    def session_replicas(side: Outcomes) -> dict[str, set[str]]:
        """Each session's replicas over its admitted requests."""
        out: dict[str, set[str]] = {}
        for key, (outcome, replica) in side.items():
            if outcome != "shed" and replica is not None:
                out.setdefault(key.split("/", 1)[0], set()).add(replica)
        return out


def _turn_order(key: str) -> tuple[str, int, int]:
    session, _, rest = key.partition("/")
    turn, _, attempt = rest.partition("#")
    return (session, int(turn), int(attempt))


def _key(session_id: str, turn: int, request_id: str) -> str:
    _, _, attempt = request_id.partition("#")
    return f"{session_id}/{turn}#{attempt or 0}"


def max_in_flight_from_trace(path: Path) -> dict[str, int]:
    """Per replica, the most requests the engine held at once (running + queued), over every
    step of the trace."""
    out: dict[str, int] = {}
    for line in path.read_bytes().splitlines():
        row = orjson.loads(line) if line else None
        if row and row["type"] == "step":
            out[row["replica"]] = max(out.get(row["replica"], 0), row["running"] + row["queue"])
    return out


def run_fleet_parity(spec: EngineSpec, wcfg: WorkloadConfig, load: Load,
                     fleet: Any, *, duration_s: float, warmup_s: float, seed: int,
                     trace: Path, run_twin: bool = True,
                     arrival_times: list[float] | None = None) -> FleetParity:
    """The same workload and seed through the twin as a fleet and through a live gateway in
    front of simserver replicas (time scale 1: the gateway's clock is the wall clock). A shed
    closed-loop user waits its Retry-After and tries again; a shed open-loop session ends.
    `fleet` is a twin.fleet.FleetConfig."""
    names = [f"replica-{i}" for i in range(fleet.replicas)]
    end = warmup_s + duration_s
    twin: Outcomes = {}
    twin_point: SweepPoint | None = None
    twin_records: list[Any] = []
    if run_twin:
        run = run_fleet_point(spec, wcfg, load, fleet, duration_s=duration_s,
                              warmup_s=warmup_s, seed=seed, replica_names=names,
                              arrival_times=arrival_times)
        twin_point, twin_records = run.point, run.records
        twin = {_key(r.session_id, r.turn, r.request_id): (r.outcome, r.replica)
                for r in run.records}
    trace.unlink(missing_ok=True)
    log = DecisionLog()
    calls = FleetTrace()
    with serve_in_thread(ServerConfig(spec=spec, replicas=fleet.replicas, trace=trace)) as srv:
        cfg = Overrides(tuple(f"{n}={u}" for n, u in zip(names, srv.urls, strict=True)),
                        fleet.cap, fleet.queue_depth).apply(GatewayConfig(
                            ttft_budget_s=fleet.ttft_budget_s,
                            prefill_reserve_s=fleet.prefill_reserve_s,
                            reserve=ReserveSettings(learn=fleet.learn_reserve),
                            routing=Routing(affinity=fleet.affinity,
                                            shared_prefix_tokens=wcfg.system_prompt_tokens,
                                            spill=fleet.spill)))
        gw = Gateway(cfg, decisions=log, step_time=step_time_model(spec), fleet_trace=calls)
        with gateway_in_thread(gw) as g:
            async def main() -> DriveResult:
                async with make_session() as session:
                    workload = Workload(wcfg, random.Random(seed))
                    driver = driver_for(load, workload, arrival_times)
                    return await drive([g.url], driver,
                                       IdsPayload("qwen3-8b", send_rid=True),
                                       window_end=end, drain_s=120.0, clock=Clock(1.0),
                                       session=session, retry_shed=True,
                                       session_header="X-Session-ID")

            res = asyncio.run(main())
            reserves = {n: g.gateway.fleet.ac.reserve_s(n) for n in names}
            routes = {str(k): v for k, v in g.gateway.fleet.admission.core.num_routes.items()}
            ttft = g.gateway.metrics.ttft
            within = sum(c for bound, c in zip(ttft.bounds, ttft.counts, strict=False)
                         if bound <= fleet.ttft_budget_s)
    decided: dict[str, tuple[str, str | None]] = {}
    for row in log.rows:
        if row.outcome != "queued":
            decided[row.request_id] = (row.outcome, row.replica)
    live: Outcomes = {}
    for rec in res.records:
        outcome, replica = decided.get(rec.request_id, (rec.outcome, None))
        if outcome == "admitted":
            outcome = rec.outcome  # ok, error, timeout, ...
        live[_key(rec.session_id, rec.turn, rec.request_id)] = (outcome, replica)
    live_point = summarize_point(res.records, load=load, window=(warmup_s, end), slo=SLO(),
                                 seed=seed, flushed=True)
    replayed = [(d.request.request_id, d.outcome, d.replica)
                for d in replay(calls, {}, fleet_settings(cfg), step_time_model(spec))]
    logged = [(row.request_id, row.outcome, row.replica) for row in log.rows]
    same = sum(1 for a, b in zip(replayed, logged, strict=False) if a == b)
    replay_agreement = same / max(len(replayed), len(logged), 1)
    offer_order = [args[0].request_id for _, name, args, _ in calls.calls if name == "offer"]
    return FleetParity(twin, live, twin_point, live_point, max_in_flight_from_trace(trace), res,
                       twin_records, replay_agreement, offer_order, reserves,
                       (within, ttft.count), routes)
