"""Load drivers against live targets: the same workloads as the twin, over HTTP.

Closed loop: N users each send, wait for the last token, think, send again (all starting at
once unless a ramp-up is asked for). Open loop: sessions arrive on the workload's schedule
whatever the server does. Every loop is bounded: nothing is sent after the window ends, and
the drain after it has a time limit, after which unfinished requests are cancelled and kept as
timeouts.

Shed requests (HTTP 429), with `retry_shed`, follow the twin's fleet runner: a closed-loop user
waits the Retry-After (`retry-after-ms` first; 1 s without one) and sends the same request again
as attempt k, request id `<id>#k`, each attempt its own record, at most `max_retries` times and
only while the retry time is inside the window; a user whose request is still shed after that
stops (as in the twin: it would retry past the window). A shed open-loop session ends.

The payload (bench/payload.py's contract) makes each body; a chat payload builds its texts off
the event loop and ahead of need (bench/chat_payload.py, with a TextPool): the driver calls
`prefetch(spec)` as soon as a request exists (an open-loop arrival before its time comes, a
user's next turn before its think time), which starts the builds that request and the next
ones will need, and awaits `prepare(spec)` at the request's time, before the send, so a build
that was not done by then shows as send lag, never as loop lag. An ok answer goes to
`on_answer`, a session without a next turn to `end_session`.

The driver also measures itself: send lag (how late each request left against its schedule)
and event-loop lag (how late a 10 ms timer fires), so a run where the client fell behind can
be set aside instead of being reported as the server's latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from chatfleet.bench.client import Clock, StreamOutcome, stream
from chatfleet.bench.payload import Payload
from chatfleet.core.records import RequestRecord
from chatfleet.core.workload import ClosedLoop, OpenLoop, RequestSpec

LOOP_PROBE_S = 0.010


@dataclass(slots=True)
class DriveResult:
    records: list[RequestRecord]
    outcomes: list[StreamOutcome]
    send_lag: list[tuple[float, float]] = field(default_factory=list)  # (scheduled t, ms)
    loop_lag: list[tuple[float, float]] = field(default_factory=list)  # (model t, ms)
    wall_s: float = 0.0
    interrupted: bool = False

    @property
    def send_lag_ms(self) -> list[float]:
        return [lag for _, lag in self.send_lag]

    @property
    def loop_lag_ms(self) -> list[float]:
        return [lag for _, lag in self.loop_lag]

    def window_lags(self, start: float, end: float) -> tuple[list[float], list[float]]:
        """Send and loop lag inside the measurement window: a closed loop's start (every
        user at once) is not what the window's requests saw."""
        return ([lag for t, lag in self.send_lag if start <= t < end],
                [lag for t, lag in self.loop_lag if start <= t < end])


class _LoopLag:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.samples: list[tuple[float, float]] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(LOOP_PROBE_S)
            late = max(0.0, (time.monotonic() - t - LOOP_PROBE_S) * 1000)
            self.samples.append((self.clock.now(), late))

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def drive(targets: list[str], driver: ClosedLoop | OpenLoop, payload: Payload, *,
                window_end: float, drain_s: float, clock: Clock,
                session: aiohttp.ClientSession,
                route: Callable[[RequestSpec, int], int] | None = None,
                headers: dict[str, str] | None = None,
                stop: asyncio.Event | None = None,
                count_text: Callable[[str], int] | None = None,
                retry_shed: bool = False, max_retries: int = 20,
                session_header: str | None = None) -> DriveResult:
    """Run one load point (model times throughout; `clock` converts a time-scaled target).

    `retry_shed`: a shed closed-loop request is retried after its Retry-After (wall seconds,
    so `Retry-After x clock.scale` in model time) as `<request id>#k`, k = 1..`max_retries`,
    while the retry time is before `window_end`; a shed open-loop session ends.
    `session_header`: a header (e.g. X-Session-ID) that carries each request's session id."""
    route = route or (lambda spec, n: spec.user % n)
    stop = stop or asyncio.Event()  # set it to end the window early (Ctrl-C)
    res = DriveResult([], [])
    lag = _LoopLag(clock)
    lag.start()
    tasks: set[asyncio.Task[None]] = set()
    t_start = time.monotonic()

    def request_headers(spec: RequestSpec) -> dict[str, str] | None:
        if session_header is None:
            return headers
        return {**(headers or {}), session_header: spec.session_id}

    async def send(spec: RequestSpec, attempt: int = 0,
                   at: float | None = None) -> StreamOutcome:
        """Send `spec` (attempt 0) or its retry `attempt` at model time `at`: the attempt
        is the same request under the id `<id>#<attempt>`, for the payload too (an engine
        refuses a repeated rid)."""
        if attempt:
            spec = dataclasses.replace(spec, request_id=f"{spec.request_id}#{attempt}",
                                       scheduled_time=spec.scheduled_time if at is None
                                       else at)
        payload.prefetch(spec)  # its texts (and its next turns'), built off the loop meanwhile
        await clock.sleep_until(spec.scheduled_time)
        await payload.prepare(spec)  # at once when they were built ahead
        res.send_lag.append((spec.scheduled_time, max(0.0, (clock.now() - spec.scheduled_time)
                                                      * 1000 / clock.scale)))
        rec = RequestRecord(spec.request_id, spec.session_id, spec.turn,
                            scheduled_time=spec.scheduled_time,
                            prompt_tokens=spec.prompt_len)
        res.records.append(rec)
        i = route(spec, len(targets))
        rec.replica = targets[i]
        path, body = payload(spec)
        try:
            out = await stream(session, targets[i] + path, body, rec, clock,
                               request_headers(spec), count_text=count_text)
        except asyncio.CancelledError:
            rec.outcome = "timeout"
            rec.error = "not finished within the drain limit"
            raise
        res.outcomes.append(out)
        if rec.outcome == "ok":
            payload.on_answer(spec, out.text)
        return out

    def done(spec: RequestSpec, nxt: RequestSpec | None) -> None:
        if nxt is None or nxt.session_id != spec.session_id:
            payload.end_session(spec.session_id)

    async def send_retrying(spec: RequestSpec) -> StreamOutcome:
        """A closed-loop user's request and, with `retry_shed`, its retries while shed."""
        out = await send(spec)
        attempt = 0
        while (retry_shed and out.record.outcome == "shed" and attempt < max_retries
               and not stop.is_set()):
            wait_s = out.retry_after_s if out.retry_after_s is not None else 1.0
            retry_at = clock.now() + wait_s * clock.scale  # wall seconds -> model time
            if retry_at >= window_end:
                break
            attempt += 1
            out = await send(spec, attempt, retry_at)
        return out

    async def user(spec: RequestSpec | None) -> None:
        assert isinstance(driver, ClosedLoop)
        while spec is not None and spec.scheduled_time < window_end and not stop.is_set():
            out = await send_retrying(spec)
            if retry_shed and out.record.outcome == "shed":
                done(spec, None)  # gave up: the user stops, as in the twin
                return
            nxt = driver.on_done(spec, clock.now())
            done(spec, nxt)
            spec = nxt

    async def session_turns(spec: RequestSpec) -> None:
        assert isinstance(driver, OpenLoop)
        nxt: RequestSpec | None = spec
        while nxt is not None and nxt.scheduled_time < window_end and not stop.is_set():
            out = await send(nxt)
            if retry_shed and out.record.outcome == "shed":
                done(nxt, None)  # a shed session ends, as in the twin
                return
            cur, nxt = nxt, driver.on_done(nxt, clock.now())
            done(cur, nxt)

    if isinstance(driver, ClosedLoop):
        for spec in driver.start():
            tasks.add(asyncio.create_task(user(spec)))
    else:
        spec = driver.next_arrival(0.0)
        while spec.scheduled_time < window_end and not stop.is_set():
            payload.prefetch(spec)  # build its texts while it has not arrived yet
            await clock.sleep_until(spec.scheduled_time)
            tasks.add(asyncio.create_task(session_turns(spec)))
            tasks = {t for t in tasks if not t.done()}
            spec = driver.next_arrival(spec.scheduled_time)
    stop_wait = asyncio.ensure_future(stop.wait())
    await asyncio.wait([stop_wait], timeout=max(0.0, clock.wall_at(window_end)
                                                 - time.monotonic()))
    stop_wait.cancel()
    res.interrupted = stop.is_set()
    pending = {t for t in tasks if not t.done()}
    if pending:
        _, still = await asyncio.wait(pending, timeout=drain_s / clock.scale)
        for t in still:
            t.cancel()
        for t in still:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
    await lag.stop()
    res.loop_lag = lag.samples
    res.wall_s = time.monotonic() - t_start
    return res
