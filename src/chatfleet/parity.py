"""Twin against simserver: the same workload and seed through the engine model in virtual time
and through the simserver in wall-clock time, compared in model time."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from chatfleet.bench.client import Clock, make_session
from chatfleet.bench.drive import DriveResult, completions_with_ids, drive
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.metrics import SLO, summarize_point
from chatfleet.core.workload import ClosedLoop, Workload, WorkloadConfig
from chatfleet.simserver.server import ServerConfig, serve_in_thread
from chatfleet.twin.run import run_point


@dataclass(slots=True)
class ParityResult:
    twin: dict[str, Any]
    live: dict[str, Any]
    live_engine: dict[str, Any]
    emission_lag_ms: dict[str, float]
    drive: DriveResult


def engine_from_trace(path: Path, start: float, end: float) -> dict[str, Any]:
    """The engine block (as the twin reports it) from a simserver trace's step rows."""
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    steps = [r for r in rows if r["type"] == "step" and start <= r["t"] <= end]
    dec = [r for r in steps if r["kind"] == "decode"]
    return {
        "max_running": max((r["batch"] for r in dec), default=0),
        "max_queue": max((r["queue"] for r in dec), default=0),
        "peak_token_usage": max((r["token_usage"] for r in dec), default=0.0),
    }


def emission_lag(path: Path, scale: float) -> dict[str, float]:
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line]
    lags = sorted((r["actual"] - r["planned"]) * 1000 / scale for r in rows
                  if r["type"] == "token")
    if not lags:
        return {"n": 0}
    return {"p50": lags[len(lags) // 2], "p99": lags[int(len(lags) * 0.99)],
            "max": lags[-1], "n": len(lags)}


def run_parity(spec: EngineSpec, wcfg: WorkloadConfig, users: int, *, duration_s: float,
               warmup_s: float, seed: int, time_scale: float, trace: Path) -> ParityResult:
    load = {"mode": "closed", "concurrency": users}
    twin = run_point(spec, wcfg, load, duration_s=duration_s, warmup_s=warmup_s, seed=seed)
    trace.unlink(missing_ok=True)
    end = warmup_s + duration_s
    with serve_in_thread(ServerConfig(spec=spec, time_scale=time_scale, trace=trace)) as srv:
        async def main() -> DriveResult:
            async with make_session() as session:
                driver = ClosedLoop(Workload(wcfg, random.Random(seed)), users)
                return await drive(srv.urls, driver, completions_with_ids("qwen3-8b"),
                                   window_end=end, drain_s=600.0, clock=Clock(time_scale),
                                   session=session)

        res = asyncio.run(main())
    live = summarize_point(res.records, load=load, window=(warmup_s, end), slo=SLO(),
                           mode="closed", seed=seed, flushed=True, time_scale=time_scale)
    return ParityResult(twin.point, live, engine_from_trace(trace, warmup_s, end),
                        emission_lag(trace, time_scale), res)
