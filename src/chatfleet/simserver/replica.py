"""One simulated replica: the engine model from core/engine, stepped in wall-clock time.

A step completes when its modelled duration has elapsed on the wall clock (divided by the time
scale); back-to-back steps follow the model's timeline (see `_run`). Model time is wall time
since start x the time scale; every reported time is model time. After each step the engine
loop writes the step's tokens to every streaming client in one pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from chatfleet.core.engine.build import EngineSpec, build_engine, thermal_profile_of
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.step import Step
from chatfleet.core.errors import ChatfleetError
from chatfleet.simserver.generation import Answer
from chatfleet.simserver.metrics import ReplicaMetrics
from chatfleet.simserver.vllm_metrics import VLLMReplicaMetrics


@dataclass(slots=True, eq=False)
class Handle:
    """The server side of one request: the engine fills it, the HTTP handler drains it."""

    rid: str
    answer: Answer
    prompt_tokens: int
    req: EngineRequest
    arrival_wall: float
    emitted: int = 0  # tokens handed to the stream
    sent: int = 0  # tokens written to the client
    pending: list[float] = field(default_factory=list)  # planned model time of unsent tokens
    finished: bool = False
    aborted: bool = False
    finish_reason: str | None = None
    first_token_model: float | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # a streaming handler's writer: the engine loop calls it right after each step with the
    # planned times of the new tokens, so a step's chunks go out in one pass, not one task
    # wake-up per stream
    sink: Callable[[list[float]], Awaitable[None]] | None = None
    # renders the stream's next chunk ahead of time, while the step it belongs to runs
    prerender: Callable[[], None] | None = None

    @property
    def cached_tokens(self) -> int:
        return self.req.num_cached_tokens


class TraceWriter:
    """JSON lines, buffered. Rows are kept as they come (a dict, or a compact token tuple
    turned into a row later) and serialized by `flush`, which the engine loop calls while a
    step runs (and on idle and close), never in the middle of a step's write burst."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f: IO[bytes] = open(path, "ab")  # noqa: SIM115 (closed in close())
        self._rows: list[dict[str, Any]] = []
        self._tokens: list[tuple[Any, ...]] = []

    def write(self, row: dict[str, Any]) -> None:
        self._rows.append(row)

    def write_token(self, replica: Replica, rid: str, index: int, planned: float,
                    actual_mono: float, actual_unix: float) -> None:
        self._tokens.append((replica, rid, index, planned, actual_mono, actual_unix))

    def pending(self) -> int:
        return len(self._rows) + len(self._tokens)

    def flush(self) -> None:
        if not (self._rows or self._tokens):
            return
        out = [orjson.dumps(r) + b"\n" for r in self._rows]
        for rep, rid, index, planned, mono, unix in self._tokens:
            out.append(orjson.dumps({
                "type": "token", "replica": rep.name, "rid": rid, "index": index,
                "planned": planned, "actual": (mono - rep._t0_mono) * rep.time_scale,
                "planned_unix": rep.unix_at(planned), "actual_unix": unix,
                "planned_mono": rep.mono_at(planned), "actual_mono": mono,
            }) + b"\n")
        self._rows.clear()
        self._tokens.clear()
        self._f.write(b"".join(out))
        self._f.flush()

    def close(self) -> None:
        self.flush()
        self._f.close()


def make_metrics(spec: EngineSpec, served_model_name: str
                 ) -> ReplicaMetrics | VLLMReplicaMetrics:
    """The engine's own /metrics names: sglang:* for the SGLang model, vllm:* for vLLM's."""
    if spec.engine_model == "vllm":
        plan = spec.vllm_pool_plan()
        return VLLMReplicaMetrics(served_model_name, {
            "block_size": str(plan.block_size), "num_gpu_blocks": str(plan.num_gpu_blocks),
            "gpu_memory_utilization": str(plan.gpu_memory_utilization),
            "cache_dtype": "fp8" if spec.precision.kv_cache == "fp8" else "auto"})
    return ReplicaMetrics(served_model_name)


RESYNC_WALL_S = 0.050
SPIN_S = 0.0015
TRACE_FLUSH_ROWS = 2000


class Replica:
    def __init__(self, name: str, spec: EngineSpec, *, time_scale: float = 1.0, seed: int = 0,
                 trace: TraceWriter | None = None, served_model_name: str = "qwen3-8b") -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ChatfleetError("time scale must be a positive finite number")
        self.name = name
        self.spec = spec
        self.sched = build_engine(spec)
        self.time_scale = time_scale
        self.rng = random.Random(seed)
        self.trace = trace
        self.served_model_name = served_model_name
        self.metrics = make_metrics(spec, served_model_name)
        self.metrics.on_start(self.sched)
        self.handles: dict[str, Handle] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0_wall = time.time()
        self._t0_mono = time.monotonic()
        self.profile = thermal_profile_of(spec)

    # --- clocks ---------------------------------------------------------------------------
    def model_now(self) -> float:
        return (time.monotonic() - self._t0_mono) * self.time_scale

    def mono_at(self, model_t: float) -> float:
        return self._t0_mono + model_t / self.time_scale

    def unix_at(self, model_t: float) -> float:
        return self._t0_wall + model_t / self.time_scale

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._t0_wall = time.time()
        self._t0_mono = time.monotonic()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for h in list(self.handles.values()):
            h.aborted = True
            h.wake.set()

    # --- requests -------------------------------------------------------------------------
    def check(self, prompt_len: int, max_new: int) -> str | None:
        return self.sched.check_request(prompt_len, max_new)

    def submit(self, rid: str, prompt: Iterable[int], answer: Answer, max_new: int) -> Handle:
        from array import array

        ids = array("q", prompt)
        req = EngineRequest(rid, ids, answer.ids, max_new)
        h = Handle(rid, answer, len(ids), req, time.monotonic())
        req.tag = h
        self.sched.add_request(req, self.model_now())
        self.handles[rid] = h
        self.metrics.on_arrival(len(ids))
        self._wake.set()
        return h

    def abort(self, rid: str) -> bool:
        """Abort a request at once and free its KV (a disconnect, or /abort_request)."""
        h = self.handles.pop(rid, None)
        if h is None:
            return False
        self.sched.abort(rid)
        h.aborted = True
        h.finish_reason = "abort"
        h.wake.set()
        self.metrics.on_abort()
        if self.sched.in_flight is None:
            self.metrics.on_idle(self.sched)
        self._wake.set()
        return True

    def release(self, h: Handle) -> None:
        self.handles.pop(h.rid, None)

    def flush_cache(self) -> bool:
        ok = self.sched.flush()
        if ok:
            self.metrics.on_flush(self.sched)
        return ok

    # --- the engine loop ------------------------------------------------------------------
    async def _run(self) -> None:
        last_end: float | None = None
        while True:
            if not self.sched.has_work():
                self.metrics.on_idle(self.sched)
                if self.trace is not None:
                    self.trace.flush()
                self._wake.clear()
                await self._wake.wait()
                last_end = None
                continue
            # Back to back steps follow the model's timeline: the next step starts when the
            # last one ended in model time, so the server's own per-step overhead (emission,
            # bookkeeping) does not stretch model time. If the server falls more than
            # RESYNC_WALL_S behind, it starts from the present instead (and the trace shows it).
            now = self.model_now()
            if last_end is not None:
                if (now - last_end) / self.time_scale < RESYNC_WALL_S:
                    now = last_end
                elif self.trace is not None:  # the model time this replica lost to its host
                    self.trace.write({"type": "resync", "replica": self.name, "t": now,
                                      "lost_s": now - last_end})
            step = self.sched.schedule(now)
            if step is None:  # nothing admissible and nothing running: wait for a change
                self._wake.clear()
                wake = self.sched.next_ready_time()
                if wake is not None and wake > now:  # or until the engine sees a request
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(),
                                               (wake - self.model_now()) / self.time_scale)
                else:
                    await self._wake.wait()
                last_end = None
                continue
            if self.trace is not None and self.trace.pending() > TRACE_FLUSH_ROWS:
                self.trace.flush()  # while the step runs, not in its write burst
            if step.num_decode:  # the step's sleep is free time: render its chunks now
                for req in self.sched.decoding_requests():
                    h = req.tag
                    if isinstance(h, Handle) and h.prerender is not None:
                        h.prerender()
            await self._sleep_until(self.mono_at(step.end))
            await self._complete(step)
            last_end = step.end

    @staticmethod
    async def _sleep_until(target: float) -> None:
        """Sleep to `target` (monotonic): the selector's timeout has 1 ms granularity, so the
        last SPIN_S is spent yielding to the other tasks instead."""
        delay = target - time.monotonic()
        if delay > SPIN_S:
            await asyncio.sleep(delay - SPIN_S)
        while time.monotonic() < target:
            await asyncio.sleep(0)

    async def _complete(self, step: Step) -> None:
        res = self.sched.complete(step.end)
        t = step.end
        emitted = self.sched.step_tokens(res)
        streams: list[Handle] = []
        for req in emitted:
            h = self._emit(req, t)
            if h is not None and h.sink is not None:
                streams.append(h)
        for h in streams:  # one pass over the step's streams
            planned, h.pending = h.pending, []
            await h.sink(planned)  # type: ignore[misc]
        for req in res.finished:
            self._finish(req)
        self.metrics.on_step(self.sched, step, res)
        if self.trace is not None:
            row = self.sched.log[-1]
            self.trace.write({
                "type": "step", "replica": self.name, "t": t, "kind": step.kind,
                "batch": row.batch, "prefill_tokens": row.prefill_tokens,
                "decode_tokens": row.decode_tokens, "running": row.running, "queue": row.queue,
                "token_usage": round(row.token_usage, 5),
                "lag_ms": round((time.monotonic() - self.mono_at(t)) * 1000, 3),
            })

    def _emit(self, req: EngineRequest, t: float) -> Handle | None:
        h = req.tag
        if not isinstance(h, Handle) or h.aborted:
            return None
        if h.first_token_model is None:
            h.first_token_model = t
        h.emitted += 1
        h.pending.append(t)
        self.metrics.on_token()
        if h.sink is None:
            h.wake.set()
        return h

    def _finish(self, req: EngineRequest) -> None:
        h = req.tag
        if not isinstance(h, Handle):
            return
        h.finished = True
        h.finish_reason = h.answer.finish_reason
        h.wake.set()
        self.metrics.on_finish(h, req, self)

    # --- stream side ----------------------------------------------------------------------
    def record_sent(self, h: Handle, planned: list[float]) -> None:
        """The handler wrote these tokens to the client now: trace planned against actual."""
        if self.trace is None:
            return
        actual_mono = time.monotonic()
        unix = time.time()
        write = self.trace.write_token
        for p in planned:
            write(self, h.rid, h.sent, p, actual_mono, unix)
            h.sent += 1

    def telemetry(self) -> dict[str, Any]:
        self.sched.advance_idle(self.model_now())
        th = self.sched.thermal
        base: dict[str, Any] = {"time": self.model_now(), "time_scale": self.time_scale,
                                "gpu": self.spec.gpu.name}
        if th is None:
            base.update(sm_clock_mhz=self.profile.loaded_mhz, temp_c=None, power_w=None,
                        thermal_slowdown=False, thermal_model=False)
        else:
            base.update(th.snapshot())
            base["thermal_model"] = True
        base["clock_event_reasons"] = (["hw_thermal_slowdown"] if base["thermal_slowdown"]
                                       else [])
        return base
