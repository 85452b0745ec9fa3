"""The twin's per-event work, compiled (chatfleet/_native.py): a point's handlers
(`PointEvents`), starting a replica's next step (`kick`), handing a replica a request
(`add_request`) and a served request's record (`make_record`). twin/run.py runs a point over
them, twin/fleet.py and twin/cache_replay.py use the last three."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from chatfleet.core.engine.protocol import EngineModel, EngineReadings
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.records import RequestRecord
from chatfleet.core.workload import ClosedLoop, OpenLoop, RequestSpec
from chatfleet.twin.loop import Event, EventLoop

Route = Callable[[RequestSpec, list[EngineModel]], int]
# A step end event's payload, built in `kick` and `add_request` alone: (the replica's index, the
# generation of its step in flight when the event was made). A plain tuple: _native.py says why.
StepKey = tuple[int, int]
StepEnd = Callable[[StepKey, float], Iterable[Event]]


def route_by_user(spec: RequestSpec, replicas: list[EngineModel]) -> int:
    """The default seam until the gateway's routing lands: a user's requests stay on one
    replica (user index modulo replica count)."""
    return spec.user % len(replicas)


class PointEvents:
    """One point's run: its engines, loop and driver, the requests in flight and the records
    of those done; its methods are the loop's handlers."""

    __slots__ = ("driver", "horizon", "loop", "records", "reqs", "route", "scheds", "specs",
                 "step_gen", "window_end")

    def __init__(self, scheds: list[EngineModel], loop: EventLoop, driver: ClosedLoop | OpenLoop,
                 window_end: float, route: Route, horizon: float = float("inf")) -> None:
        self.scheds = scheds
        self.loop = loop
        self.driver = driver
        self.window_end = window_end
        self.route = route
        self.horizon = horizon  # the loop's stop time: a decode run never crosses it
        self.step_gen = [0] * len(scheds)  # per replica: the live step event
        self.specs: dict[str, RequestSpec] = {}
        self.reqs: dict[str, tuple[int, EngineRequest]] = {}
        self.records: list[RequestRecord] = []

    # --- handlers (each returns the events it creates) -----------------------------------
    def arrive(self, spec: RequestSpec, now: float) -> Iterable[Event]:
        req = EngineRequest(spec.request_id, spec.prompt_ids(), spec.output_ids(),
                            spec.max_new_tokens)
        i = self.route(spec, self.scheds)
        self.specs[spec.request_id] = spec
        self.reqs[spec.request_id] = (i, req)
        return add_request(self.loop, self.scheds, self.step_gen, i, req, now, self.horizon,
                           self.step_end)

    def open_arrival(self, spec: RequestSpec, now: float) -> Iterable[Event]:
        assert isinstance(self.driver, OpenLoop)
        out = list(self.arrive(spec, now))
        nxt = self.driver.next_arrival(now)
        if nxt.scheduled_time < self.window_end:
            out.append(self.loop.at(nxt.scheduled_time, self.open_arrival, nxt))
        return out

    def step_end(self, key: StepKey, now: float) -> Iterable[Event]:
        i, gen = key
        if gen != self.step_gen[i]:
            return []  # a decode run that was cut short since
        res = self.scheds[i].complete(now)
        out: list[Event] = []
        horizon = self.horizon
        for req in res.finished:
            spec = self.specs.pop(req.rid)
            del self.reqs[req.rid]
            self.records.append(self.record(i, spec, req, "ok"))
            nxt = self.driver.on_done(spec, now)
            if nxt is not None and nxt.scheduled_time < self.window_end:
                out.append(self.loop.at(nxt.scheduled_time, self.arrive, nxt))
                horizon = min(horizon, nxt.scheduled_time)
        out.extend(self._kick(i, now, horizon))
        return out

    def _kick(self, i: int, now: float, horizon: float | None = None) -> list[Event]:
        """`horizon`: a known arrival before the loop's stop time. A decode run is cut at the
        step running when a request arrives, so one that would be cut need not be planned
        beyond it (any horizon gives the same steps; a nearer one, fewer events)."""
        return kick(self.loop, self.scheds, self.step_gen, i, now,
                    self.horizon if horizon is None else horizon, self.step_end)

    def record(self, i: int, spec: RequestSpec, req: EngineRequest,
               outcome: str) -> RequestRecord:
        return make_record(self.scheds[i], f"twin-{i}", spec, req, spec.request_id,
                           spec.scheduled_time, outcome)


def kick(loop: EventLoop, scheds: list[EngineModel], step_gen: list[int], i: int, now: float,
         horizon: float, step_end: StepEnd) -> list[Event]:
    """Start replica i's next step if it is idle with work; its end event carries a fresh
    generation number, so an end made stale by a cut decode run is skipped."""
    sched = scheds[i]
    if sched.in_flight is not None or not sched.has_work():
        return []
    step = sched.schedule(now, horizon=horizon)
    if step is None:
        wake = sched.next_ready_time()
        if wake is not None and wake > now:  # a request the engine does not see yet
            return [loop.at(wake, lambda j, t: kick(loop, scheds, step_gen, j, t, horizon,
                                                      step_end), i)]
        return []
    step_gen[i] += 1
    return [loop.at(step.end, step_end, (i, step_gen[i]))]


def add_request(loop: EventLoop, scheds: list[EngineModel], step_gen: list[int], i: int,
                req: EngineRequest, now: float, horizon: float,
                step_end: StepEnd) -> list[Event]:
    """Hand `req` to replica i's scheduler: a decode run in progress must stop after the step
    running now (so the scheduler sees the request), an idle replica starts a step."""
    sched = scheds[i]
    sched.add_request(req, now)
    if sched.in_flight is not None:
        new_end = sched.truncate_decode_run(now)
        if new_end is None:
            return []
        step_gen[i] += 1
        return [loop.at(new_end, step_end, (i, step_gen[i]))]
    return kick(loop, scheds, step_gen, i, now, horizon, step_end)


def make_record(sched: EngineReadings, replica: str, spec: RequestSpec, req: EngineRequest,
                request_id: str, arrived: float, outcome: str) -> RequestRecord:
    """The record of a request the engine model served (token times from its step log)."""
    times = sched.token_times(req)
    return RequestRecord(
        request_id=request_id,
        session_id=spec.session_id,
        turn=spec.turn,
        replica=replica,
        scheduled_time=arrived,
        send_time=arrived,
        first_token_time=req.first_token_time,
        token_times=times,
        prompt_tokens=req.prompt_len,
        cached_tokens=req.num_cached_tokens,  # host-tier hits included
        output_tokens=len(times),
        outcome=outcome,  # type: ignore[arg-type]
        error=None if outcome == "ok" else "not finished when the drain limit ran out",
    )
