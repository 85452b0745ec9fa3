"""`chatfleet twin calibrate`: fit the twin's step-time constants to a live sweep.

The fit uses the sweep's concurrency-1 point only (its median TTFT and time per output token,
with the workload's lengths), under the same two assumptions as the L4 calibration (decode fixed
cost, GEMM efficiency). The sweep's other points then measure the fit: the twin replays each of
them with the fitted profile, the same workload and seed, and the relative errors of median
TTFT, median TPOT and output throughput are reported and stored in the profile.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

import orjson

from chatfleet.core.calibration import (
    ASSUMED_BF16_GEMM_EFF,
    ASSUMED_DECODE_FIXED_S,
    Calibration,
    calibration_from_json,
    calibration_to_json,
    fit_point,
)
from chatfleet.core.defaults import DURATION_S, SEED, WARMUP_S
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.run import run_point

PROFILE_SCHEMA = "chatfleet.profile/1"


def load_sweep(path: Path) -> dict[str, Any]:
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
    return doc


def workload_from_json(w: dict[str, Any]) -> tuple[WorkloadConfig, str | None]:
    """The sweep's workload as a WorkloadConfig (and a note when it is approximated)."""
    lengths = w.get("lengths", {})
    kind = lengths.get("kind", "fixed")
    note = None
    if kind in ("fixed", "uniform"):
        spec = LengthSpec(kind, int(lengths["input_len"]), int(lengths["output_len"]),
                          float(lengths.get("range_ratio", 0.0)),
                          lengths.get("convention", "sglang"))
    elif kind == "sharegpt":
        from chatfleet.datasets import cached_sharegpt_length_pairs

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


def calibrate(sweep_path: Path, *, gpu: str | None = None, model: str | None = None,
              weights: str | None = None, kv_cache: str | None = None,
              gemm_eff: float = ASSUMED_BF16_GEMM_EFF,
              decode_fixed_s: float = ASSUMED_DECODE_FIXED_S) -> dict[str, Any]:
    doc = load_sweep(sweep_path)
    target = doc.get("target", {})
    gpu_name = gpu or target.get("gpu")
    model_name = model or target.get("model_spec") or "qwen3-8b"
    w = weights or target.get("weights")
    kv = kv_cache or target.get("kv_cache")
    if not gpu_name or not w or not kv:
        raise ChatfleetError("the sweep's target does not name its GPU and precisions: pass "
                             "--gpu, --weights and --kv-cache")
    card = get_gpu(gpu_name)
    mdl = builtin_model(model_name)
    prec = precision(w, kv)
    wcfg, note = workload_from_json(doc.get("workload", {}))
    points = [p for p in doc.get("points", []) if p.get("valid", True)]
    ones = [p for p in points if p["load"]["mode"] == "closed"
            and p["load"].get("concurrency") == 1]
    if not ones:
        raise ChatfleetError("calibration needs a valid concurrency-1 point in the sweep")
    one = ones[0]
    mean_in, mean_out = mean_lengths(wcfg.lengths)
    prompt = wcfg.system_prompt_tokens + mean_in
    cached = min(prompt - 1, one.get("cached_token_share", 0.0) * prompt)
    cal = fit_point(
        card, mdl, w, kv, tpot_s=one["tpot_ms"]["p50"] / 1000,
        ttft_s=one["ttft_ms"]["p50"] / 1000, new_tokens=prompt - cached, cached_tokens=cached,
        decode_context=prompt + mean_out / 2, decode_fixed_s=decode_fixed_s, gemm_eff=gemm_eff,
        source=f"fitted to the concurrency-1 point of {sweep_path} "
               f"({target.get('engine', '?')} on {gpu_name}) on {_dt.date.today()}")
    spec = EngineSpec(card, mdl, prec, calibration=cal)
    errors = []
    duration = float(doc.get("workload", {}).get("duration_s", DURATION_S))
    warmup = float(doc.get("workload", {}).get("warmup_s", WARMUP_S))
    for p in points:
        tw = run_point(spec, wcfg, dict(p["load"]), duration_s=duration, warmup_s=warmup,
                       seed=int(p.get("seed", SEED))).point
        row: dict[str, Any] = {"load": p["load"], "fitted_on": p is one}
        for key, live, twin in (
            ("ttft_p50", p["ttft_ms"]["p50"], tw["ttft_ms"]["p50"]),
            ("tpot_p50", p["tpot_ms"]["p50"], tw["tpot_ms"]["p50"]),
            ("output_tok_s", p["output_tok_s"], tw["output_tok_s"]),
        ):
            row[key] = {"live": live, "twin": twin,
                        "rel_error": (twin - live) / live if live else None}
        errors.append(row)
    return {
        "schema": PROFILE_SCHEMA, "gpu": card.name, "model": mdl.name, "weights": w,
        "kv_cache": kv, "engine": target.get("engine"), "calibration": calibration_to_json(cal),
        "assumptions": {"decode_fixed_s": decode_fixed_s, "gemm_eff": gemm_eff},
        "workload_note": note, "fit_error": errors,
    }


def load_profile(path: Path) -> tuple[Calibration, dict[str, Any]]:
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise ChatfleetError(f"no profile at {path}") from None
    except orjson.JSONDecodeError as exc:
        raise ChatfleetError(f"{path} is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != PROFILE_SCHEMA:
        raise ChatfleetError(f"{path} is not a {PROFILE_SCHEMA} profile")
    return calibration_from_json(doc["calibration"]), doc
