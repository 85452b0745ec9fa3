"""Synthetic sweep directories, laid out as `chatfleet sweep --out DIR` writes them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from chatfleet.core.documents.sweep import SweepPoint
from chatfleet.core.measure.knee import sweep_document
from chatfleet.core.slo import SLO

CLOSED = (1, 2, 4, 8, 16, 32)
OPEN = (0.5, 1.0, 2.0, 4.0)
FLOOR_MHZ = 1200.0
INVALID_REASON = "GPU clock p50 1,100 MHz under the floor 1,200 MHz"


def make_point(load: dict[str, Any], *, speed: float, run_index: int, invalid: bool = False,
               time_scale: float | None = None) -> dict[str, Any]:
    """A sweep point whose figures degrade with load (speed > 1: a faster engine)."""
    x = float(load.get("concurrency") or load["rate_rps"] * 8)
    pressure = x / (8.0 * speed)
    attainment = 1.0 if pressure <= 0.5 else max(0.0, 1.0 - 0.45 * (pressure - 0.5))
    requests = int(60 * x) + 50
    tok_s = 40.0 * speed * x / (1.0 + x / (24.0 * speed))
    ttft = 150.0 * (1.0 + pressure ** 2)
    itl = 40.0 * (1.0 + pressure)
    point: dict[str, Any] = {
        "load": load,
        "seed": 1000 + run_index,
        "flushed": True,
        "valid": not invalid,
        "invalid_reason": INVALID_REASON if invalid else None,
        "duration_s": 300.0,
        "requests": {"offered": requests, "completed": requests,
                     "met_slo": int(requests * attainment), "shed": 0, "failed": 0,
                     "admitted": requests},
        "output_tok_s": tok_s,
        "request_rps": requests / 300.0,
        "goodput_rps": requests * attainment / 300.0,
        "attainment": attainment,
        "admitted_attainment": attainment,
        "ttft_ms": {"p50": ttft, "p90": ttft * 1.6, "p99": ttft * 2.4, "n": requests},
        "itl_ms": {"p50": itl, "p90": itl * 1.4, "p99": itl * 2.0, "max": itl * 9.0,
                   "n": requests * 100},
        "tpot_ms": {"p50": itl * 1.05, "p99": itl * 1.5, "n": requests},
        "e2e_ms": {"p50": ttft + 127 * itl, "p99": ttft * 2 + 127 * itl * 1.5, "n": requests},
        "cached_token_share": max(0.2, 0.8 - 0.01 * x),
        "engine": {"max_running": int(min(x, 24 * speed)), "max_queue": int(max(0, x - 24)),
                   "peak_token_usage": min(1.0, 0.03 * x / speed)},
        "gpu": {"sm_clock_mhz": {"p50": 1100.0 if invalid else 1800.0 - 10 * x,
                                 "min": 1000.0 if invalid else 1500.0 - 10 * x},
                "temp_c": {"max": 60.0 + x}, "thermal_slowdown_share": 0.01 * x},
        "client": {"send_lag_ms_p99": 0.4, "loop_lag_ms_p99": 1.2},
        "itl_stat": "mean",
        "thin": requests < 200,
        "in_flight_max": int(x) if load["mode"] == "closed" else int(2 * x),
        "run_index": run_index,
        "clock_floor_mhz": FLOOR_MHZ,
        "cooldown": {"waited_s": 30.0 + run_index, "temp_c": 55.0},
        "files": {"telemetry": f"runs/{run_index:03d}/telemetry.jsonl",
                  "engine": f"runs/{run_index:03d}/engine.jsonl"},
    }
    if time_scale is not None:
        point["time_scale"] = time_scale
    return point


def write_run_files(root: Path, point: dict[str, Any]) -> None:
    run = root / "runs" / f"{point['run_index']:03d}"
    run.mkdir(parents=True, exist_ok=True)
    x = float(point["load"].get("concurrency") or point["load"]["rate_rps"] * 8)
    tele = []
    eng = []
    for i in range(90):
        t = 2.0 * i
        clock = 1900.0 - 8.0 * x * (i / 90) - 30.0 * math.sin(i / 7)
        slow = clock < 1700.0
        tele.append({"t": t, "sm_clock_mhz": round(clock, 1), "temp_c": 45.0 + 0.3 * x * i / 9,
                     "power_w": 60.0 + x, "thermal_slowdown": slow,
                     "reasons": ["hw_thermal_slowdown"] if slow else []})
        eng.append({"t": t, "running": min(x, 24), "queue": max(0.0, x - 24),
                    "token_usage": min(1.0, 0.03 * x * i / 90), "cache_hit_rate": 0.8})
    (run / "telemetry.jsonl").write_text("".join(json.dumps(r) + "\n" for r in tele))
    (run / "engine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in eng))


def target(weights: str) -> dict[str, Any]:
    return {"engine": "sglang", "engine_version": "0.5.2", "gpu": "l4", "model": "qwen3-8b",
            "weights": weights, "kv_cache": weights, "chatfleet_version": "0.1.0"}


WORKLOAD = {"system_prompt_tokens": 2048, "lengths": {"kind": "sharegpt"}, "turns": 3,
            "duration_s": 300.0, "warmup_s": 30.0}


def build_points(speed: float, *, with_open: bool = True,
                 time_scale: float | None = None) -> list[dict[str, Any]]:
    loads: list[dict[str, Any]] = [{"mode": "closed", "concurrency": c} for c in CLOSED]
    if with_open:
        loads += [{"mode": "open", "rate_rps": r, "arrival": "poisson", "burstiness": 1.0}
                  for r in OPEN]
    return [make_point(load, speed=speed, run_index=i, time_scale=time_scale,
                       invalid=(load.get("concurrency") == 16))
            for i, load in enumerate(loads)]


def write_sweep_dir(root: Path, weights: str = "bf16", speed: float = 1.0, *,
                    sweep_json: bool = True, meta: bool = True, truncate_last: bool = False,
                    with_open: bool = True, time_scale: float | None = None) -> dict[str, Any]:
    """A sweep directory; returns its document. `sweep_json=False` leaves only runs.jsonl
    (an interrupted sweep); `truncate_last` cuts the last line of runs.jsonl in half."""
    root.mkdir(parents=True, exist_ok=True)
    points = build_points(speed, with_open=with_open, time_scale=time_scale)
    doc = sweep_document(target(weights), WORKLOAD, SLO(),
                         [SweepPoint.from_json(p) for p in points]).to_json()
    lines = [json.dumps(p) + "\n" for p in points]
    if truncate_last:
        lines[-1] = lines[-1][: len(lines[-1]) // 2]
    (root / "runs.jsonl").write_text("".join(lines))
    for p in points:
        write_run_files(root, p)
    if meta:
        (root / "meta.json").write_text(json.dumps(
            {"target": target(weights), "workload": WORKLOAD, "slo": SLO().to_json()}))
    if sweep_json:
        (root / "sweep.json").write_text(json.dumps(doc, indent=2))
    return doc


def write_live_proof(path: Path, *, cap: int = 24, peaks: tuple[int, ...] = (24, 23),
                     users: int = 96) -> dict[str, Any]:
    """A chatfleet.live-proof/1 document as `chatfleet demo` writes it (figures made up)."""
    def side(attempts: int, shed: int, peak: tuple[int, ...], ttft_ms: float) -> dict[str, Any]:
        return {"attempts": attempts, "completed": attempts - shed, "shed": shed, "failed": 0,
                "admitted_attainment": 0.995967741935, "attainment": 0.198418972332,
                "ttft_p99_ms": ttft_ms, "tpot_p99_ms": 97.907784544,
                "goodput_rps": 4.183333333333,
                "peak_in_flight": {f"replica-{i}": n for i, n in enumerate(peak)}}

    doc = {"schema": "chatfleet.live-proof/1",
           "target": {"gpu": "l4", "model": "qwen3-8b", "weights": "fp8", "kv_cache": "fp8",
                      "engine": "simserver", "via": "chatfleet gateway"},
           "replicas": len(peaks), "cap_per_replica": cap,
           "load": {"mode": "closed", "concurrency": users},
           "load_multiple": users / (cap * len(peaks)), "duration_s": 60.0, "warmup_s": 20.0,
           "live": {**side(1265, 1013, peaks, 921.92293274), "shed_with_retry_after": 1013,
                    "retry_after_s_p50": 1.0},
           "twin": side(1144, 893, (cap,) * len(peaks), 1013.790222),
           "peak_in_flight_source": "the replicas' own traces (trace.jsonl)",
           "files": {"sweep": "sweep.json", "trace": "trace.jsonl"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return doc
