"""Run the engine model in virtual time: one load point (twin/sweep.py runs sweeps of them).

A point: a fresh (flushed) engine, a workload seeded with base seed + point index, a closed loop
of N users or an open loop at a rate. Requests sent (closed) or scheduled (open) between the end
of the warm-up and warm-up + duration form the measurement window; the run then drains them, for
at most `drain_s` more seconds, after which unfinished ones count as timeouts. The loop's handlers
live in twin/events.py (compiled); this module sets a point up and summarises it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from chatfleet import __version__
from chatfleet.core.defaults import DURATION_S, SEED, TWIN_DRAIN_S, WARMUP_S
from chatfleet.core.documents.sweep import (
    ClockStats,
    EngineBlock,
    GpuBlock,
    Load,
    ModelledGpu,
    ModelledPower,
    SweepPoint,
    TempStats,
)
from chatfleet.core.engine.build import (
    ENGINE_MODEL_VERSIONS,
    EngineSpec,
    build_engine,
    thermal_profile_of,
)
from chatfleet.core.engine.protocol import EngineModel, EngineReadings
from chatfleet.core.engine.steplog import KIND_CODES, StepLog
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.measure.percentiles import time_weighted_percentile
from chatfleet.core.measure.point import summarize_point
from chatfleet.core.records import RequestRecord
from chatfleet.core.slo import SLO
from chatfleet.core.workload import (
    ClosedLoop,
    Workload,
    WorkloadConfig,
    driver_for,
)
from chatfleet.twin.events import PointEvents, Route, route_by_user
from chatfleet.twin.loop import EventLoop


@dataclass(slots=True)
class PointRun:
    point: SweepPoint
    records: list[RequestRecord]
    scheduler: EngineModel
    num_events: int


def run_point(
    spec: EngineSpec,
    wcfg: WorkloadConfig,
    load: Load,
    *,
    duration_s: float = DURATION_S,
    warmup_s: float = WARMUP_S,
    seed: int = SEED,
    drain_s: float = TWIN_DRAIN_S,
    slo: SLO | None = None,
    replicas: int = 1,
    route: Route = route_by_user,
) -> PointRun:
    """Run one load point in virtual time and summarise it as a chatfleet.sweep/1 point.

    With `replicas` > 1 the users are spread over that many identical engines by `route`
    (the seam the gateway's admission and routing plug into)."""
    if duration_s <= 0 or warmup_s < 0 or drain_s < 0:
        raise ChatfleetError("duration must be positive, warm-up and drain not negative")
    if replicas < 1:
        raise ChatfleetError("replicas must be at least 1")
    slo = slo or SLO()
    scheds = [build_engine(spec) for _ in range(replicas)]
    sched = scheds[0]
    need = wcfg.max_context_tokens()
    if need > sched.capacity_tokens:
        raise ChatfleetError(
            f"a session can reach {need} tokens (system prompt + turns), more than the "
            f"{sched.capacity_tokens}-token KV pool holds"
        )
    rng = random.Random(seed)
    workload = Workload(wcfg, rng)
    loop = EventLoop()
    window_end = warmup_s + duration_s
    driver = driver_for(load, workload)
    run = PointEvents(scheds, loop, driver, window_end, route, horizon=window_end + drain_s)
    if isinstance(driver, ClosedLoop):
        loop.push(loop.at(s.scheduled_time, run.arrive, s) for s in driver.start())
    else:
        first = driver.next_arrival(0.0)
        loop.push([loop.at(first.scheduled_time, run.open_arrival, first)])
    loop.run(until=window_end + drain_s)
    for rid, pending in list(run.specs.items()):
        i, req = run.reqs[rid]
        run.records.append(run.record(i, pending, req, "timeout"))
    point = summarize_point(
        run.records,
        load=load,
        window=(warmup_s, window_end),
        slo=slo,
        seed=seed,
        flushed=True,
        engine=engine_block(scheds, warmup_s, window_end),
        gpu=gpu_block(spec, scheds, warmup_s, window_end),
    )
    return PointRun(point, run.records, sched, loop.num_events)


def engine_block(scheds: Sequence[EngineReadings], start: float, end: float) -> EngineBlock:
    """What SGLang's decode log shows, read at decode steps after the warm-up (the largest
    over the replicas; sums for the counters). vLLM's steps all carry the running decodes, so
    every step but a prefill-only one counts there."""
    max_running = 0
    max_queue = 0
    peak_usage = 0.0
    for sched in scheds:
        log = sched.log
        t = log.floats("time")
        read = (t >= start) & (t <= end) & (log.ints("kind") != KIND_CODES["prefill"])
        if read.any():
            max_running = max(max_running, int(log.ints("batch")[read].max()))
            max_queue = max(max_queue, int(log.ints("queue")[read].max()))
            peak_usage = max(peak_usage, float(log.floats("token_usage")[read].max()))
    cached = sum(s.num_prefill_cached_tokens for s in scheds)
    prompt = sum(s.num_prefill_input_tokens for s in scheds)
    return EngineBlock(
        max_running=max_running,
        max_queue=max_queue,
        peak_token_usage=round(peak_usage, 4),
        max_total_num_tokens=scheds[0].capacity_tokens,
        replicas=len(scheds),
        num_retractions=sum(s.num_retractions for s in scheds),
        cache_hit_rate=round(cached / max(1, prompt), 4),
        evicted_tokens=sum(s.num_evicted_tokens for s in scheds),
    )


def gpu_block(spec: EngineSpec, scheds: Sequence[EngineReadings], start: float,
              end: float) -> GpuBlock:
    """The card's clock, temperature and power over the window, as telemetry samples at a
    fixed interval would show them: every figure is weighted by time (each step by the part
    of its duration inside the window; the median clock is `time_weighted_percentile`, the
    live telemetry's definition), clocks and slowdown over the time the card was busy.
    `busy_share`, `prefill_share` (of the busy time) and the power the work draws at the
    loaded clock come from the steps, with the thermal model on or off (the power model of
    core/calibration.ThermalProfile). `slowdown_after_s`: the end of the first throttled step,
    from the start of the run. Sums run in step order (the replicas' logs one after another)."""
    profile = thermal_profile_of(spec)
    if len(scheds) == 1:
        log = scheds[0].log
    else:  # the replicas' logs one after another
        log = StepLog()
        for s in scheds:
            log.extend(s.log)
    idx, w = step_weights(log, start, end)
    if not len(idx):
        idx, w = step_weights(log, float("-inf"), float("inf"))
    span = max(end - start, 1e-9) * len(scheds)
    kind = log.ints("kind")[idx]
    p_tok = log.ints("prefill_tokens")[idx].astype(np.float64)
    tokens = p_tok + log.ints("decode_tokens")[idx]
    # vLLM's mixed steps: decodes and prefill chunks, split by their tokens
    mixed = kind == KIND_CODES["mixed"]
    share = np.divide(p_tok, tokens, out=np.zeros_like(p_tok), where=tokens != 0)
    by_kind = {
        "prefill": _added(np.where(mixed, w * share, w)[kind != KIND_CODES["decode"]]),
        "decode": _added(np.where(mixed, w * (1.0 - share), w)[kind != KIND_CODES["prefill"]]),
    }
    busy_s = sum(by_kind.values())
    loaded_w = profile.idle_w + sum(
        secs * (profile.phase_power_w(k) - profile.idle_w) for k, secs in by_kind.items()) / span
    busy_share = round(min(1.0, busy_s / span), 4)
    prefill_share = round(by_kind["prefill"] / busy_s, 4) if busy_s else None
    if scheds[0].thermal is None:
        mhz = profile.loaded_mhz
        return GpuBlock(
            sm_clock_mhz=ClockStats(p50=mhz, min=mhz), temp_c=TempStats(max=None),
            thermal_slowdown_share=0.0,
            modelled=ModelledGpu(
                busy_share=busy_share, prefill_share=prefill_share,
                power_w=ModelledPower(mean=round(loaded_w, 2),
                                      at_loaded_clock=round(loaded_w, 2)),
                slowdown_after_s=None, thermal_model=False))
    sm = log.floats("sm_clock_mhz")[idx]
    slow = log.ints("thermal_slowdown") != 0
    slow_s = sum(w[slow[idx]].tolist())
    energy = _added(log.floats("power_w")[idx] * w)
    mean_w = (energy + profile.idle_w * max(0.0, span - busy_s)) / span
    first_slow = float(log.floats("time")[slow].min()) if slow.any() else None
    p50 = time_weighted_percentile(sm.tolist(), w.tolist(), 50.0)
    assert p50 is not None  # idx holds at least one step with time in it
    return GpuBlock(
        sm_clock_mhz=ClockStats(p50=round(p50, 1), min=round(float(sm.min()), 1)),
        temp_c=TempStats(max=round(float(log.floats("temp_c")[idx].max()), 2)),
        thermal_slowdown_share=round(slow_s / busy_s, 4) if busy_s else 0.0,
        modelled=ModelledGpu(
            busy_share=busy_share, prefill_share=prefill_share,
            power_w=ModelledPower(mean=round(mean_w, 2), at_loaded_clock=round(loaded_w, 2)),
            slowdown_after_s=round(first_slow, 1) if first_slow is not None else None,
            thermal_model=True))


def _added(values: npt.NDArray[np.float64]) -> float:
    """The values added one after another, from 0.0 (numpy's sum adds pairwise)."""
    total = 0.0
    for v in values.tolist():
        total += v
    return total


def step_weights(log: StepLog, start: float, end: float) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The steps with a part of their duration inside [start, end] (their indices in the
    log, in order) and the seconds of that part."""
    t = log.floats("time")
    w = np.minimum(t, end) - np.maximum(t - log.floats("step_s"), start)
    idx = np.flatnonzero(w > 0)
    return idx, w[idx]


def is_calibrated(spec: EngineSpec) -> bool:
    return spec.is_calibrated


def target_block(spec: EngineSpec) -> dict[str, Any]:
    block = {"engine": "twin", "engine_models": ENGINE_MODEL_VERSIONS[spec.engine_model],
             "engine_model": spec.engine_model,
             "chatfleet_version": __version__,
             "calibration": "calibrated" if is_calibrated(spec) else "uncalibrated",
             **spec.to_json()}
    if spec.calibration is not None:
        block["calibration_source"] = spec.calibration.source
    return block
