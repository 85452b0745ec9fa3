"""The twin as a fleet: several replicas behind the gateway's own admission and routing code
(`core/fleet`), in virtual time.

Every request is offered to the `AdmissionController` exactly as the live gateway offers it:
admitted requests go to the engine model of the replica the `Router` chose; queued ones wait in
the one queue; shed ones get a Retry-After. A shed closed-loop user waits its Retry-After and
tries again (a new attempt, recorded separately); a shed open-loop session ends. Completions
release their replica's slot, which admits from the queue; deadlines are checked when the
controller says the next one falls. The router learns each session's token counts from its
turns' usage (prompt and cached tokens), as the gateway does, never by tokenizing; the
admission controller learns each replica's reserve (admission -> first byte) from the first
token of each request, seen at the gateway one hop after the engine made it, as the gateway
sees the first byte of each stream.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from chatfleet.core.defaults import DURATION_S, SEED, TWIN_DRAIN_S, WARMUP_S
from chatfleet.core.documents.sweep import FleetBlock, Load
from chatfleet.core.engine.build import EngineSpec, build_engine
from chatfleet.core.engine.protocol import EngineModel
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.steplog import StepLog
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.fleet.admission import Decision, FleetRequest
from chatfleet.core.fleet.fleet import Fleet, FleetSettings, FleetTrace
from chatfleet.core.fleet.reserve import ReserveSettings
from chatfleet.core.fleet.routing import SPILL_RULES, SpillRule
from chatfleet.core.measure.point import summarize_point
from chatfleet.core.records import RequestRecord
from chatfleet.core.slo import SLO
from chatfleet.core.traffic.replay import TraceLoop
from chatfleet.core.workload import (
    ClosedLoop,
    OpenLoop,
    RequestSpec,
    Workload,
    WorkloadConfig,
    driver_for,
)
from chatfleet.twin.events import StepKey, add_request, kick, make_record
from chatfleet.twin.loop import Event, EventLoop
from chatfleet.twin.run import PointRun, engine_block, gpu_block

MAX_RETRIES = 20
# The live gateway's hop to an engine and back, one way: about 1 ms each way plus the end of
# the stream's relay, measured against the simserver (docs/gateway.md). The twin's CLI default
# and the plan's and demo's fleet runs use it.
MEASURED_HOP_S = 0.002


@dataclass(frozen=True, slots=True)
class FleetConfig:
    replicas: int
    cap: int
    # the defaults are the fleet core's (FleetSettings), as the gateway's config's are
    queue_depth: int = FleetSettings().queue_depth
    ttft_budget_s: float = FleetSettings().ttft_budget_s
    # the queue deadline is arrival + budget - this
    prefill_reserve_s: float = FleetSettings().prefill_reserve_s
    affinity: bool = True  # sessions to their replica (rendezvous + spill rule); else least-loaded
    # gateway <-> engine, one way: an admitted request reaches its engine this much later, and
    # a finished one frees its slot at the gateway this much later. With a delay, a request
    # admitted from the queue misses the step that starts as the slot frees (as it does live)
    hop_s: float = 0.0
    # the deadline's reserve learned per replica (core/fleet/reserve.py, its default
    # settings, as the gateway's), prefill_reserve_s the prior; False: prefill_reserve_s always
    learn_reserve: bool = True
    spill: SpillRule = "cost"  # when a session leaves a hot home (core/fleet/routing.py)

    def __post_init__(self) -> None:
        if self.hop_s < 0:
            raise ChatfleetError("hop_s must not be negative")
        if self.spill not in SPILL_RULES:
            raise ChatfleetError(f"spill must be one of {', '.join(SPILL_RULES)}")
        if self.replicas < 1 or self.cap < 1 or self.queue_depth < 0:
            raise ChatfleetError("a fleet needs at least 1 replica, a cap of at least 1 and a "
                                 "queue depth of at least 0")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __reduce__(self) -> tuple[type[FleetConfig], tuple[Any, ...]]:
        """Pickled by its fields, into a worker process (the compiled form of a frozen
        dataclass refuses pickle's default way, which sets each field on a bare object)."""
        return (FleetConfig, tuple(getattr(self, f.name) for f in dataclasses.fields(self)))

    def block(self) -> FleetBlock:
        """The settings as a point's (and a target's) fleet block."""
        return FleetBlock(replicas=self.replicas, cap=self.cap, queue_depth=self.queue_depth,
                          ttft_budget_s=self.ttft_budget_s,
                          prefill_reserve_s=self.prefill_reserve_s, affinity=self.affinity,
                          hop_s=self.hop_s, learn_reserve=self.learn_reserve,
                          spill=self.spill)

    def settings(self, shared_prefix_tokens: int) -> FleetSettings:
        """The fleet core's settings for these (the gateway's config gives the same)."""
        return FleetSettings(
            queue_depth=self.queue_depth, ttft_budget_s=self.ttft_budget_s,
            prefill_reserve_s=self.prefill_reserve_s, affinity=self.affinity,
            shared_prefix_tokens=shared_prefix_tokens,
            reserve=ReserveSettings(learn=self.learn_reserve), spill=self.spill)


@dataclass(slots=True, init=False)
class _Attempt:
    spec: RequestSpec
    attempt: int
    # its progress, which every attempt starts afresh (replace() makes the next attempt)
    replica: int | None = field(init=False)
    req: EngineRequest | None = field(init=False)
    offered: float = field(init=False)  # when the gateway got it
    admitted: float = field(init=False)  # when the gateway admitted it
    first_seen: bool = field(init=False)  # its first token reached the gateway (a reserve sample)

    # __init__ written out (init=False): chatfleet/_native.py says why
    def __init__(self, spec: RequestSpec, attempt: int) -> None:
        self.spec = spec
        self.attempt = attempt
        self.replica = None
        self.req = None
        self.offered = 0.0
        self.admitted = 0.0
        self.first_seen = False


@dataclass(slots=True)
class _FleetRun:
    scheds: list[EngineModel]
    names: list[str]
    loop: EventLoop
    driver: ClosedLoop | OpenLoop | TraceLoop
    fleet: Fleet
    window_end: float
    horizon: float
    step_gen: list[int]
    attempts: dict[str, _Attempt] = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list)
    last_prompt: dict[str, tuple[int, int]] = field(default_factory=dict)
    expire_at: float | None = None
    max_in_flight: list[int] = field(default_factory=list)
    hop_s: float = 0.0
    max_queue: int = 0  # the gateway queue's peak depth
    index: dict[str, int] = field(init=False)  # replica name -> its place in names
    learning: bool = field(init=False)  # the controller learns the reserve: feed it

    def __post_init__(self) -> None:
        self.index = {name: i for i, name in enumerate(self.names)}
        self.learning = self.fleet.ac.learning

    # --- arrivals and decisions -----------------------------------------------------------
    def arrive(self, att: _Attempt, now: float) -> Iterable[Event]:
        spec = att.spec
        rid = spec.request_id if att.attempt == 0 else f"{spec.request_id}#{att.attempt}"
        self.attempts[rid] = att
        att.offered = now
        prev = self.last_prompt.get(spec.session_id)
        driver = self.driver
        req = FleetRequest(rid, f"sid:{spec.session_id}", now, returning=spec.turn > 0,
                           prompt_tokens=prev[0] if prev else None,
                           cached_tokens=prev[1] if prev else None,
                           key=driver.key_of(spec) if isinstance(driver, TraceLoop) else None)
        return self.handle(self.fleet.offer(req, now), now)

    def open_arrival(self, spec: RequestSpec, now: float) -> Iterable[Event]:
        driver = self.driver
        assert not isinstance(driver, ClosedLoop)
        out = list(self.arrive(_Attempt(spec, 0), now))
        nxt = driver.next_arrival(now)
        if nxt is not None and nxt.scheduled_time < self.window_end:
            out.append(self.loop.at(nxt.scheduled_time, self.open_arrival, nxt))
        return out

    def add_record(self, rec: RequestRecord) -> None:
        """A trace's driver counts its records as they come (a day of them is not kept)."""
        driver = self.driver
        if isinstance(driver, TraceLoop):
            driver.record(rec)
        else:
            self.records.append(rec)

    def handle(self, decisions: list[Decision], now: float) -> list[Event]:
        out: list[Event] = []
        for d in decisions:
            att = self.attempts.get(d.request.request_id)
            if att is None:
                continue
            outcome = d.outcome
            if outcome == "admitted" and d.replica is not None:
                att.admitted = now
                i = self.index[d.replica]
                if self.hop_s > 0:
                    out.append(self.loop.at(now + self.hop_s, self.start_event,
                                            (d.request.request_id, att, i)))
                else:
                    out.extend(self.start(d.request.request_id, att, i, now))
            elif outcome == "shed":
                out.extend(self.shed(d, att, now))
        ac = self.fleet.ac
        depth = ac.queue_depth()
        if depth > self.max_queue:
            self.max_queue = depth
        nxt = ac.next_deadline()
        if nxt is not None and (self.expire_at is None or nxt < self.expire_at
                                or self.expire_at <= now):
            self.expire_at = max(nxt, now)
            out.append(self.loop.at(self.expire_at + 1e-9, self.expire, None))
        return out

    def expire(self, _: object, now: float) -> Iterable[Event]:
        self.expire_at = None
        return self.handle(self.fleet.expire(now), now)

    def start_event(self, args: tuple[str, _Attempt, int], now: float) -> list[Event]:
        return self.start(*args, now)

    def release_event(self, i: int, now: float) -> list[Event]:
        return self.handle(self.fleet.release(self.names[i], now), now)

    def first_byte_event(self, args: tuple[int, float], now: float) -> list[Event]:
        """A request's first token reaches the gateway: a sample of its replica's reserve."""
        i, admitted = args
        return self.handle(self.fleet.first_byte(self.names[i], admitted, now), now)

    def start(self, rid: str, att: _Attempt, i: int, now: float) -> list[Event]:
        spec = att.spec
        req = EngineRequest(rid, spec.prompt_ids(), spec.output_ids(), spec.max_new_tokens)
        att.replica, att.req = i, req
        inflight = self.fleet.ac.in_flight(self.names[i])
        self.max_in_flight[i] = max(self.max_in_flight[i], inflight)
        return add_request(self.loop, self.scheds, self.step_gen, i, req, now, self.horizon,
                           self.step_end)

    def shed(self, d: Decision, att: _Attempt, now: float) -> list[Event]:
        rid = d.request.request_id
        self.attempts.pop(rid, None)
        spec = att.spec
        self.add_record(RequestRecord(
            request_id=rid, session_id=spec.session_id, turn=spec.turn, replica=None,
            scheduled_time=d.request.arrival, send_time=d.request.arrival,
            prompt_tokens=spec.prompt_len, outcome="shed",
            error=f"429 ({d.reason}), retry-after {d.retry_after_s} s"))
        driver = self.driver
        if isinstance(driver, TraceLoop):
            nxt = driver.on_shed(spec, now)
            if nxt is not None and nxt.scheduled_time < self.window_end:
                return [self.loop.at(nxt.scheduled_time, self.arrive, _Attempt(nxt, 0))]
            return []
        if isinstance(driver, ClosedLoop) and att.attempt < MAX_RETRIES:
            retry_at = now + float(d.retry_after_s or 1)
            if retry_at < self.window_end:
                return [self.loop.at(retry_at, self.arrive, _Attempt(spec, att.attempt + 1))]
            return []
        return []

    # --- engine steps -----------------------------------------------------------------------
    def kick(self, i: int, now: float) -> list[Event]:
        return kick(self.loop, self.scheds, self.step_gen, i, now, self.horizon, self.step_end)

    def step_end(self, key: StepKey, now: float) -> Iterable[Event]:
        i, gen = key
        if gen != self.step_gen[i]:
            return []
        res = self.scheds[i].complete(now)
        out: list[Event] = []
        if self.learning:
            for req in res.first_tokens:
                first = self.attempts.get(req.rid)
                if first is None or first.first_seen:
                    continue  # (a retracted request's second first token)
                first.first_seen = True
                if self.hop_s > 0:
                    out.append(self.loop.at(now + self.hop_s, self.first_byte_event,
                                            (i, first.admitted)))
                else:
                    out.extend(self.handle(self.fleet.first_byte(self.names[i],
                                                                 first.admitted, now), now))
        for req in res.finished:
            att = self.attempts.pop(req.rid)
            spec = att.spec
            self.add_record(self.record(att, req))
            self.last_prompt[spec.session_id] = (req.prompt_len, req.num_cached_tokens)
            self.fleet.observe_usage(f"sid:{spec.session_id}", req.prompt_len,
                                     req.num_cached_tokens, now)
            if self.hop_s > 0:
                out.append(self.loop.at(now + self.hop_s, self.release_event, i))
            else:
                out.extend(self.handle(self.fleet.release(self.names[i], now), now))
            nxt = self.driver.on_done(spec, now)
            if nxt is not None and nxt.scheduled_time < self.window_end:
                out.append(self.loop.at(nxt.scheduled_time, self.arrive, _Attempt(nxt, 0)))
        out.extend(self.kick(i, now))
        return out

    def record(self, att: _Attempt, req: EngineRequest, outcome: str = "ok") -> RequestRecord:
        """TTFT counts from the arrival at the gateway (the attempt's offer)."""
        assert att.replica is not None
        return make_record(self.scheds[att.replica], self.names[att.replica], att.spec, req,
                           req.rid, att.offered, outcome)


def run_fleet_point(
    spec: EngineSpec,
    wcfg: WorkloadConfig,
    load: Load,
    fleet: FleetConfig,
    *,
    duration_s: float = DURATION_S,
    warmup_s: float = WARMUP_S,
    seed: int = SEED,
    drain_s: float = TWIN_DRAIN_S,
    slo: SLO | None = None,
    replica_names: list[str] | None = None,
    trace: FleetTrace | None = None,
    arrival_times: list[float] | None = None,
) -> PointRun:
    """One load point through `fleet.replicas` engines behind the gateway's admission and
    routing. TTFT counts from the request's arrival at the gateway (queueing included).
    Replica names matter: rendezvous hashing places sessions by name (the parity check names
    them as the live fleet does)."""
    slo = slo or SLO()
    scheds = [build_engine(spec) for _ in range(fleet.replicas)]
    names = replica_names or [f"twin-{i}" for i in range(fleet.replicas)]
    if len(names) != fleet.replicas or len(set(names)) != len(names):
        raise ValueError(f"need {fleet.replicas} distinct replica names, got {names}")
    core = Fleet({n: fleet.cap for n in names}, fleet.settings(wcfg.system_prompt_tokens),
                 scheds[0].step_model, trace)
    workload = Workload(wcfg, random.Random(seed))
    driver = driver_for(load, workload, arrival_times)
    loop = EventLoop()
    window_end = warmup_s + duration_s
    run = _FleetRun(scheds, names, loop, driver, core, window_end,
                    window_end + drain_s, [0] * fleet.replicas,
                    max_in_flight=[0] * fleet.replicas, hop_s=fleet.hop_s)
    if isinstance(driver, ClosedLoop):
        loop.push(loop.at(s.scheduled_time, run.arrive, _Attempt(s, 0)) for s in driver.start())
    else:
        first = driver.next_arrival(0.0)
        loop.push([loop.at(first.scheduled_time, run.open_arrival, first)])
    loop.run(until=window_end + drain_s)
    for att in list(run.attempts.values()):
        if att.req is not None:
            run.records.append(run.record(att, att.req, "timeout"))
    decided = dataclasses.replace(
        fleet.block(), max_in_flight=tuple(run.max_in_flight), max_queue=run.max_queue,
        shed={str(k): n for k, n in core.ac.num_shed.items()}, admitted=core.ac.num_admitted,
        routes={str(k): n for k, n in core.num_routes.items()},
        reserve_s=({n: round(core.ac.reserve_s(n), 4) for n in names}
                   if fleet.learn_reserve else None))
    point = summarize_point(
        run.records, load=load, window=(warmup_s, window_end), slo=slo, seed=seed,
        flushed=True, engine=engine_block(scheds, warmup_s, window_end),
        gpu=gpu_block(spec, scheds, warmup_s, window_end), fleet=decided)
    return PointRun(point, run.records, scheds[0], loop.num_events)


@dataclass(slots=True)
class TraceFleetRun:
    """A trace segment's replay: its engines (the first `keep_logs` with their step logs), the
    fleet core, and the gateway queue's and each replica's peaks."""

    scheds: list[EngineModel]
    fleet: Fleet
    max_queue: int
    max_in_flight: list[int]
    num_events: int


def run_fleet_trace(spec: EngineSpec, fleet: FleetConfig, driver: TraceLoop, *,
                    shared_prefix_tokens: int, until: float, keep_logs: int = 2,
                    log_every_s: float = 300.0,
                    replica_names: list[str] | None = None) -> TraceFleetRun:
    """Replay a trace segment (`driver`) through `fleet.replicas` engines behind the gateway's
    admission and routing, until virtual time `until` (the segment's last line plus the
    drain), its replicas named `replica_names` (rendezvous hashes the names: a group of a
    fleet keeps its replicas' names). The driver counts every record as it comes; nothing is
    kept per request. A day's step logs would not fit in memory: every `log_every_s` the
    logs of all replicas but the first `keep_logs` are dropped (the engines never read them;
    the first ones stand for the fleet's card, clocks and power, as the doubling's slice
    does)."""
    scheds = [build_engine(spec) for _ in range(fleet.replicas)]
    names = replica_names or [f"twin-{i}" for i in range(fleet.replicas)]
    core = Fleet({n: fleet.cap for n in names}, fleet.settings(shared_prefix_tokens),
                 scheds[0].step_model)
    loop = EventLoop()
    run = _FleetRun(scheds, names, loop, driver, core, math.inf, until,
                    [0] * fleet.replicas, max_in_flight=[0] * fleet.replicas, hop_s=fleet.hop_s)
    first = driver.next_arrival(0.0)
    if first is not None:
        loop.push([loop.at(first.scheduled_time, run.open_arrival, first)])

    def drop_logs(_: object, now: float) -> list[Event]:
        for sched in scheds[keep_logs:]:
            sched.log = StepLog()
        return [loop.at(now + log_every_s, drop_logs)] if now + log_every_s <= until else []

    if fleet.replicas > keep_logs:
        loop.push([loop.at(log_every_s, drop_logs)])
    loop.run(until=until)
    for att in list(run.attempts.values()):
        if att.req is not None:
            run.add_record(run.record(att, att.req, "timeout"))
    return TraceFleetRun(scheds, core, run.max_queue, run.max_in_flight, loop.num_events)
