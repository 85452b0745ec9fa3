"""`chatfleet twin calibrate`: fit the twin's step-time constants to a live sweep.

The SGLang model is fitted on the sweep's concurrency-1 point only (its median TTFT and time per
output token, with the workload's lengths), under the same two assumptions as the L4
calibration (decode fixed cost, GEMM efficiency).

The vLLM model (`--engine-model vllm`, the default for a sweep of a vLLM target) is fitted on
two points, concurrency 1 and, by default, the largest tested concurrency of at most 16
(`--fit-points 1,N` picks another):
1. concurrency 1: the bandwidth is held at the L4 fit's efficiency (or `--bandwidth-eff`) and
   the time per output token fixes the decode step's fixed cost; the TTFT then fixes the
   prefill step's fixed cost at the assumed GEMM efficiency (fit_point);
2. concurrency N: the per-sequence cost of a step is found by bisection, replaying that point
   through the twin until its median time per output token matches the live one.

The API server's time per request before the engine core sees it (`frontend_s`) is a share of
the concurrency-1 TTFT that the prefill step then no longer carries; it spreads a burst of
arrivals over several steps, which breaks the waves closed-loop users with equal lengths form.
It is 0 unless given (`--frontend-ms X`). `--frontend-ms auto` searches it on the second
point's median TTFT (a grid over shares of the concurrency-1 TTFT, then a finer one): with
fixed lengths that response jumps between wave regimes, so a match there need not predict the
other points; the fit error on them says whether it does.

The replays use the sweep's own engine where its target records it (the pool from the engine
log or vLLM's cache config, vLLM's max_num_batched_tokens and max_num_seqs). The sweep's other
points then measure the fit: the twin replays each of them with the fitted profile, the same
workload and seed, and the relative errors of median TTFT, median TPOT and output throughput are
reported and stored in the profile.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from chatfleet.core.calibration import (
    ASSUMED_BF16_GEMM_EFF,
    ASSUMED_DECODE_FIXED_S,
    L4_CALIBRATION,
    Calibration,
    calibration_from_json,
    calibration_to_json,
    fit_point,
)
from chatfleet.core.defaults import DURATION_S, WARMUP_S
from chatfleet.core.documents.sweep import ClosedLoad, SweepDoc, SweepPoint, Target
from chatfleet.core.engine.build import ENGINE_MODELS, EngineSpec
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.data.sharegpt import cached_sharegpt_length_pairs
from chatfleet.twin.compare import compare_point
from chatfleet.twin.run import run_point

# the per-sequence bisection: at most this many replays, stopping within this share of the
# live time per output token
PER_SEQ_MAX_RUNS = 14
PER_SEQ_TOLERANCE = 0.005
# the front-end grid: this many steps from 0 to this share of the concurrency-1 TTFT
FRONTEND_GRID = 12
FRONTEND_MAX_SHARE = 0.75
FRONTEND_TTFT_TOLERANCE = 0.10  # a note when the best grid point is further off than this

PROFILE_SCHEMA = "chatfleet.profile/1"


def load_sweep(path: Path) -> SweepDoc:
    if path.is_dir():
        path = path / "sweep.json"
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise ChatfleetError(f"no sweep document at {path}") from None
    except orjson.JSONDecodeError as exc:
        raise ChatfleetError(f"{path} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != "chatfleet.sweep/1":
        raise ChatfleetError(f"{path} is not a chatfleet.sweep/1 document")
    return SweepDoc.from_json(doc, str(path))  # a DocumentError is a ChatfleetError


def workload_from_json(w: Mapping[str, Any]) -> tuple[WorkloadConfig, str | None]:
    """The sweep's workload as a WorkloadConfig (and a note when it is approximated)."""
    lengths = w.get("lengths", {})
    kind = lengths.get("kind", "fixed")
    note = None
    if kind in ("fixed", "uniform"):
        spec = LengthSpec(kind, int(lengths["input_len"]), int(lengths["output_len"]),
                          float(lengths.get("range_ratio", 0.0)),
                          lengths.get("convention", "sglang"))
    elif kind == "sharegpt":
        spec = LengthSpec("sharegpt", pairs=tuple(cached_sharegpt_length_pairs()))
    else:
        spec = LengthSpec("fixed", max(1, round(lengths["mean_input_len"])),
                          max(1, round(lengths["mean_output_len"])))
        note = "a user's length file is replayed at its mean lengths"
    cfg = WorkloadConfig(
        system_prompt_tokens=int(w.get("system_prompt_tokens", 0)),
        prompt_groups=int(w.get("prompt_groups", 1)),
        group_draw=w.get("group_draw", "round-robin"), lengths=spec,
        turns=int(w.get("turns", 1)), think_time_s=float(w.get("think_time_s", 0.0)),
        ramp_up_s=float(w.get("ramp_up_s", 0.0)),
    )
    return cfg, note


def mean_lengths(spec: LengthSpec) -> tuple[float, float]:
    if spec.kind == "fixed":
        return spec.input_len, spec.output_len
    if spec.kind == "uniform":
        lo_i, hi_i = _range(spec, spec.input_len)
        lo_o, hi_o = _range(spec, spec.output_len)
        return (lo_i + hi_i) / 2, (lo_o + hi_o) / 2
    return (sum(i for i, _ in spec.pairs) / len(spec.pairs),
            sum(o for _, o in spec.pairs) / len(spec.pairs))


def _range(spec: LengthSpec, n: int) -> tuple[float, float]:
    import math

    r = spec.range_ratio
    if spec.convention == "sglang":
        return max(int(n * r), 1), n
    return max(1, math.floor(n * (1 - r))), math.ceil(n * (1 + r))


def engine_model_of(target: Target) -> str:
    """The engine model a sweep's target calls for: a twin sweep names it, a live one names its
    engine (anything but vLLM is fitted with the SGLang model)."""
    named = target.engine_model
    if named in ENGINE_MODELS:
        return str(named)
    return "vllm" if (target.engine or "").lower() == "vllm" else "sglang"


def engine_settings(target: Target) -> dict[str, int]:
    """The engine the sweep measured, where its target records it: the pool (engine log, vLLM's
    cache config, or the twin's own), vLLM's token budget and sequence cap."""
    info = target.get("engine_info") or {}
    flags = info.get("flags") or {}
    log = target.get("engine_log") or {}
    out: dict[str, int] = {}
    pool = log.get("pool_tokens")
    if pool is None and flags.get("num_gpu_blocks") and flags.get("block_size"):
        pool = int(flags["num_gpu_blocks"]) * int(flags["block_size"])
    if pool is None:
        pool = info.get("max_total_num_tokens") or target.get("max_total_num_tokens")
    if pool:
        out["pool_tokens"] = int(pool)
    batched = flags.get("max_num_batched_tokens") or target.get("max_num_batched_tokens")
    if batched:
        out["max_num_batched_tokens"] = int(batched)
    seqs = flags.get("max_num_seqs") or log.get("max_num_seqs") or target.get("max_num_seqs")
    if seqs:
        out["max_running_requests"] = int(seqs)
    return out


def choose_fit_points(points: list[SweepPoint], engine_model: str,
                      fit_points: Sequence[int] | None) -> list[SweepPoint]:
    """The closed-loop points the fit uses, concurrency 1 first."""
    closed = {p.load.concurrency: p for p in points if isinstance(p.load, ClosedLoad)}
    if 1 not in closed:
        raise ChatfleetError("calibration needs a valid concurrency-1 point in the sweep")
    if fit_points is None:
        others = [c for c in sorted(closed) if 1 < c <= 16]
        fit_points = [1, others[-1]] if engine_model == "vllm" and others else [1]
    wanted = list(dict.fromkeys(int(c) for c in fit_points))
    if not wanted or wanted[0] != 1:
        raise ChatfleetError("--fit-points must start with 1 (the concurrency-1 point)")
    if len(wanted) > (2 if engine_model == "vllm" else 1):
        raise ChatfleetError(f"the {engine_model} model fits "
                             + ("two points (1 and one more)" if engine_model == "vllm"
                            else "one point (concurrency 1)"))
    missing = [c for c in wanted if c not in closed]
    if missing:
        raise ChatfleetError(f"the sweep has no valid closed-loop point at concurrency "
                             f"{', '.join(map(str, missing))} (it has {sorted(closed)})")
    return [closed[c] for c in wanted]


def calibrate(sweep_path: Path, *, gpu: str | None = None, model: str | None = None,
              weights: str | None = None, kv_cache: str | None = None,
              gemm_eff: float = ASSUMED_BF16_GEMM_EFF,
              decode_fixed_s: float = ASSUMED_DECODE_FIXED_S,
              engine_model: str | None = None, fit_points: Sequence[int] | None = None,
              bandwidth_eff: float | None = None,
              frontend_s: float | str = 0.0) -> dict[str, Any]:
    doc = load_sweep(sweep_path)
    target = doc.target
    gpu_name = gpu or target.gpu
    model_name = model or target.get("model_spec") or "qwen3-8b"
    w = weights or target.weights
    kv = kv_cache or target.kv_cache
    if not gpu_name or not w or not kv:
        raise ChatfleetError("the sweep's target does not name its GPU and precisions: pass "
                             "--gpu, --weights and --kv-cache")
    em = engine_model or engine_model_of(target)
    if em not in ENGINE_MODELS:
        raise ChatfleetError(f"unknown engine model {em!r}: {' or '.join(ENGINE_MODELS)}")
    card = get_gpu(gpu_name)
    mdl = builtin_model(model_name)
    prec = precision(w, kv)
    wcfg, note = workload_from_json(doc.workload)
    points = [p for p in doc.points if p.valid]
    fitted = choose_fit_points(points, em, fit_points)
    one = fitted[0]
    settings = engine_settings(target)
    mean_in, mean_out = mean_lengths(wcfg.lengths)
    prompt = wcfg.system_prompt_tokens + mean_in
    cached = min(prompt - 1, one.cached_token_share * prompt)
    loads = [int(p.load.value) for p in fitted]
    held_bw = bandwidth_eff
    if em == "vllm" and held_bw is None:
        held_bw = L4_CALIBRATION.bandwidth_eff  # the physics shared with the SGLang L4 fit
    source = (f"fitted to the concurrency-{'/'.join(str(c) for c in loads)} "
              f"point{'s' if len(fitted) > 1 else ''} of {sweep_path} "
              f"({target.get('engine', '?')} on {gpu_name}, {em} model) on {_dt.date.today()}")

    def fit_one(frontend_s: float, per_seq_s: float) -> Calibration:
        """The concurrency-1 fit with `frontend_s` of its TTFT spent before the engine."""
        c = fit_point(
            card, mdl, w, kv, tpot_s=one.tpot_ms.p50 / 1000,
            ttft_s=one.ttft_ms.p50 / 1000 - frontend_s, new_tokens=prompt - cached,
            cached_tokens=cached, decode_context=prompt + mean_out / 2,
            decode_fixed_s=decode_fixed_s, gemm_eff=gemm_eff, bandwidth_eff=held_bw,
            source=source, per_seq_s=per_seq_s)
        return replace(c, frontend_s=frontend_s)

    if frontend_s == "auto":
        if em != "vllm" or len(fitted) < 2:
            raise ChatfleetError("--frontend-ms auto needs the vllm model and a second fit point")
    elif (not isinstance(frontend_s, float | int) or not math.isfinite(frontend_s)
          or frontend_s < 0):
        raise ChatfleetError("the front-end time must be a number of seconds >= 0, or auto")
    elif frontend_s and em != "vllm":
        raise ChatfleetError("the front-end time belongs to the vllm model")
    fixed_frontend = 0.0 if frontend_s == "auto" else float(frontend_s)
    cal = fit_one(fixed_frontend, 0.0)
    duration = float(doc.workload.get("duration_s", DURATION_S))
    warmup = float(doc.workload.get("warmup_s", WARMUP_S))

    def spec_of(c: Calibration) -> EngineSpec:
        kw: dict[str, Any] = dict(settings)
        if em != "vllm":
            kw.pop("max_num_batched_tokens", None)
            kw.pop("max_running_requests", None)
        return EngineSpec(card, mdl, prec, calibration=c, engine_model=em, **kw)

    def replay(c: Calibration, p: SweepPoint) -> SweepPoint:
        return run_point(spec_of(c), wcfg, p.load, duration_s=duration, warmup_s=warmup,
                         seed=p.seed).point

    notes: list[str] = []
    if len(fitted) > 1 and frontend_s == "auto":
        cal, notes = fit_second_point(fit_one, fitted[1], one, replay)
    elif len(fitted) > 1:
        cal, note = fit_per_seq(cal, fitted[1], replay)
        notes += [note] if note else []
    errors = [compare_point(p, replay(cal, p), fitted_on=any(p is f for f in fitted))
              for p in points]
    assumptions: dict[str, Any] = {"gemm_eff": gemm_eff}
    if em == "vllm" and frontend_s != "auto":
        assumptions["frontend_s"] = fixed_frontend
    if held_bw is None:
        assumptions["decode_fixed_s"] = decode_fixed_s
    else:
        assumptions["bandwidth_eff"] = held_bw
    return {
        "schema": PROFILE_SCHEMA, "gpu": card.name, "model": mdl.name, "weights": w,
        "kv_cache": kv, "engine": target.engine, "engine_model": em, "method": "points",
        "fit_points": loads,
        "engine_settings": settings, "calibration": calibration_to_json(cal),
        "assumptions": assumptions, "fit_notes": notes,
        "workload_note": note, "fit_error": errors,
    }


def fit_second_point(fit_one: Any, point: SweepPoint, one: SweepPoint,
                     replay: Any) -> tuple[Calibration, list[str]]:
    """`--frontend-ms auto`: the front-end time and the per-sequence cost from the second
    point: the per-sequence cost by bisection on its median TPOT, then the front-end time by a
    grid over shares of the concurrency-1 TTFT (the one closest to its median TTFT), a finer
    grid around that one with the per-sequence cost fitted again, and the per-sequence cost
    once more at the end."""
    notes: list[str] = []
    live = float(point.ttft_ms.p50)
    ttft1 = float(one.ttft_ms.p50) / 1000
    cal, _ = fit_per_seq(fit_one(0.0, 0.0), point, replay)
    step = ttft1 * FRONTEND_MAX_SHARE / FRONTEND_GRID
    best = (float("inf"), 0.0)
    for grid in ([step * k for k in range(FRONTEND_GRID + 1)],
                 [best[1] + step * k / 4 for k in range(-4, 5)]):
        for frontend in grid:
            if frontend < 0:
                continue
            try:
                c = fit_one(frontend, cal.per_seq_s)
            except ValueError:
                break  # the prefill step would have no fixed cost left
            if c.prefill_fixed_s < c.decode_fixed_s:
                break  # a prefill step costs at least a decode step's fixed cost
            err = abs(float(replay(c, point).ttft_ms.p50) - live)
            if err < best[0] - 1e-9:
                best = (err, frontend)
        cal, _ = fit_per_seq(fit_one(best[1], cal.per_seq_s), point, replay)
    if best[0] > FRONTEND_TTFT_TOLERANCE * live:
        notes.append(f"at concurrency {point.load.value:g} the closest median TTFT "
                     f"the twin reached is {best[0]:.0f} ms off the live {live:.0f} ms")
    cal, note = fit_per_seq(fit_one(best[1], cal.per_seq_s), point, replay)
    if note:
        notes.append(note)
    return cal, notes


def fit_per_seq(cal: Calibration, point: SweepPoint,
                replay: Any) -> tuple[Calibration, str | None]:
    """The per-sequence cost that makes the twin's median time per output token at `point`
    match the live one (bisection: the twin's TPOT grows with it)."""
    live = float(point.tpot_ms.p50)
    users = int(point.load.value)

    def tpot(x: float) -> float:
        return float(replay(replace(cal, per_seq_s=x), point).tpot_ms.p50)

    lo, hi = 0.0, live / 1000 / max(1, users - 1)
    if tpot(lo) >= live:
        return replace(cal, per_seq_s=0.0), (
            f"at concurrency {users} the twin's TPOT already reaches the live {live:.1f} ms "
            "without a per-sequence cost: set to 0")
    runs = 1
    while tpot(hi) < live:
        runs += 1
        hi *= 2
        if runs > 6:
            return replace(cal, per_seq_s=hi), (
                f"the live TPOT at concurrency {users} ({live:.1f} ms) is beyond what a "
                f"per-sequence cost explains; kept {hi * 1e3:.2f} ms")
    for _ in range(PER_SEQ_MAX_RUNS):
        mid = (lo + hi) / 2
        got = tpot(mid)
        if abs(got - live) <= PER_SEQ_TOLERANCE * live:
            lo = hi = mid
            break
        if got < live:
            lo = mid
        else:
            hi = mid
    return replace(cal, per_seq_s=(lo + hi) / 2), None


def load_profile(path: Path) -> tuple[Calibration, dict[str, Any]]:
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise ChatfleetError(f"no profile at {path}") from None
    except orjson.JSONDecodeError as exc:
        raise ChatfleetError(f"{path} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != PROFILE_SCHEMA:
        raise ChatfleetError(f"{path} is not a {PROFILE_SCHEMA} profile")
    if not isinstance(doc.get("calibration"), dict):
        raise ChatfleetError(f"{path}: no 'calibration' object (give a profile that `chatfleet "
                             "twin calibrate --out` wrote)")
    return calibration_from_json(doc["calibration"]), doc
