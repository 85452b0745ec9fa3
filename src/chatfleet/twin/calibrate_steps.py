"""`chatfleet twin calibrate` for the vLLM model: every step of every point of a live sweep.

1. Every run's records give its steps (core/stepfit/samples.py: each request's token gaps are
   the engine's step times, with the batch, the contexts and the prefills each step carried),
   inside the measurement window.
2. The step-time model (core/engine/mixed_step.py) is fitted to all of them at once
   (core/stepfit/fit.py), the card's GPU physics held where a measurement of the card gives
   them (calibration.card_physics: the achieved weight bandwidth and GEMM rate) and the
   engine's host terms free: the fixed cost of a step, the extra of a step with prefill, the
   cost per sequence, the launch time that overlaps the GPU (eager mode), the attention rate.
3. The front end's latency (the API server and the hop to the engine core, which requests do not
   queue for) is what the first token takes beyond the modelled prefill step, at the lowest
   tested load (median over its requests: at one user the engine is idle when a request comes).
   Where that point's records are missing, its median first token (the sweep document's) less
   the modelled prefill step of the workload's mean prompt.
4. Every point is replayed through the twin with the fitted profile, its own load, workload and
   seed: twin against live, point by point (the fit error; `chatfleet twin judge` does the same
   for sweeps the profile was not fitted on).

A point with fewer than THIN_REQUESTS requests is named in a note: its percentiles are thin.
With `--method steps`, a valid point whose records are missing (a sweep run without them, or
resumed before core/sweep.py kept each run's folder its own) is left out of the step fit and
named in a note; it is still replayed. `--method auto` fits steps only when every valid point
has its records.
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from chatfleet.core.calibration import (
    Calibration,
    calibration_to_json,
    card_physics,
    vllm_calibration_for,
)
from chatfleet.core.defaults import DURATION_S, WARMUP_S
from chatfleet.core.documents.sweep import ClosedLoad, SweepDoc, SweepPoint
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.engine.mixed_step import MixedStepModel
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.records import RequestRecord
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.stepfit.fit import StepFit, fit_steps
from chatfleet.core.stepfit.model import Hardware, StepParams
from chatfleet.core.stepfit.samples import StepSamples, step_samples
from chatfleet.io import read_records, run_file
from chatfleet.twin.calibrate import (
    PROFILE_SCHEMA,
    engine_model_of,
    engine_settings,
    load_sweep,
    mean_lengths,
    workload_from_json,
)
from chatfleet.twin.compare import compare_point, load_text
from chatfleet.twin.run import run_point

THIN_REQUESTS = 200


@dataclass(frozen=True)
class LivePoint:
    point: SweepPoint
    records: list[RequestRecord]
    label: str


@dataclass(frozen=True)
class LiveSweep:
    path: Path
    doc: SweepDoc
    points: tuple[LivePoint, ...]
    without_records: tuple[SweepPoint, ...] = ()

    @property
    def window(self) -> tuple[float, float]:
        return window_of(self.doc)


def window_of(doc: SweepDoc) -> tuple[float, float]:
    """A sweep's measurement window: (warm-up end, window end)."""
    w = doc.workload
    warmup = float(w.get("warmup_s", WARMUP_S))
    return warmup, warmup + float(w.get("duration_s", DURATION_S))


def read_live_sweep(path: Path) -> LiveSweep:
    """A live sweep's document and every valid point's records (its folder is needed: the
    document alone has no token times); the valid points without records apart."""
    doc = load_sweep(path)
    base = path if path.is_dir() else path.parent
    points = []
    missing = []
    for p in doc.points:
        if not p.valid:
            continue
        rec = run_file(base, p, "records")
        if rec is None or not rec.is_file():
            missing.append(p)
            continue
        points.append(LivePoint(p, read_records(rec), load_text(p)))
    if not points:
        raise ChatfleetError(
            f"{base}: no valid point has its records (runs/NNN/records.jsonl): the step fit "
            "reads every request's token times, so give a live sweep's folder (or fit two "
            "points with --method points)")
    return LiveSweep(path, doc, tuple(points), tuple(missing))


def samples_of(sweep: LiveSweep, lp: LivePoint) -> StepSamples:
    """The steps a point's records show inside its measurement window."""
    s = step_samples(lp.records)
    start, end = sweep.window
    return s.select((s.end_time >= start) & (s.end_time < end))


def frontend_delay(hw: Hardware, params: StepParams, sweep: LiveSweep) -> tuple[float, str]:
    """The first token's time beyond the modelled prefill step at the lowest closed-loop load
    (the median over its requests), and where it came from."""
    closed = [lp for lp in sweep.points if isinstance(lp.point.load, ClosedLoad)]
    bare = [p for p in sweep.without_records if isinstance(p.load, ClosedLoad)]
    if not closed and not bare:
        return 0.0, "no closed-loop point: front-end latency 0"
    model = hw.step_model(params)
    if bare and (not closed or min(p.load.value for p in bare)
                 < min(lp.point.load.value for lp in closed)):
        return frontend_from_summary(model, sweep.doc,
                                     min(bare, key=lambda p: p.load.value))
    low = min(closed, key=lambda lp: lp.point.load.value)
    extra = []
    start, end = sweep.window
    for r in low.records:
        if r.outcome != "ok" or r.first_token_time is None or not start <= r.send_time < end:
            continue
        new = max(1, r.prompt_tokens - r.cached_tokens)
        cached = r.prompt_tokens - new
        step = model.step_s(0, 0, new, new * cached + new * (new + 1) / 2, cached, 1, 1)
        extra.append(r.first_token_time - r.send_time - step)
    if not extra:
        return 0.0, f"no finished request at {low.label}: front-end latency 0"
    return (max(0.0, statistics.median(extra)),
            f"median first token beyond the modelled prefill step at {low.label} "
            f"({len(extra)} requests)")


def frontend_from_summary(model: MixedStepModel, doc: SweepDoc,
                          point: SweepPoint) -> tuple[float, str]:
    """The front end from a point's median first token, where its records are missing: the
    workload's mean prompt, its cached share as the point measured it."""
    wcfg, _ = workload_from_json(doc.workload)
    mean_in, _ = mean_lengths(wcfg.lengths)
    prompt = round(wcfg.system_prompt_tokens + mean_in)
    cached = min(prompt - 1, round(point.cached_token_share * prompt))
    new = prompt - cached
    step = model.step_s(0, 0, new, new * cached + new * (new + 1) / 2, cached, 1, 1)
    return (max(0.0, point.ttft_ms.p50 / 1000 - step),
            f"median first token beyond the modelled prefill step of the mean prompt at "
            f"{load_text(point)} (its summary: its records are missing)")


def fit_profile(paths: Sequence[Path], *, gpu: str | None = None, model: str | None = None,
                weights: str | None = None, kv_cache: str | None = None,
                hold: Sequence[str] | None = None) -> dict[str, Any]:
    """The profile fitted on every valid point of the sweeps in `paths` (one engine)."""
    sweeps = [read_live_sweep(p) for p in paths]
    first = sweeps[0]
    target = first.doc.target
    gpu_name = gpu or target.gpu
    w = weights or target.weights
    kv = kv_cache or target.kv_cache
    if not gpu_name or not w or not kv:
        raise ChatfleetError("the sweep's target does not name its GPU and precisions: pass "
                             "--gpu, --weights and --kv-cache")
    card = get_gpu(gpu_name)
    mdl = builtin_model(model or target.get("model_spec") or "qwen3-8b")
    prec = precision(w, kv)
    hw = Hardware(card, mdl, prec)
    base = vllm_calibration_for(card)
    prior = StepParams.from_calibration(base, w)
    physics = card_physics(card.name, w)
    if physics is not None:
        prior = replace(prior, bandwidth_eff=physics.bandwidth_eff, gemm_eff=physics.gemm_eff,
                        kv_read_eff=physics.bandwidth_eff)
    held = list(hold) if hold is not None else (
        ["bandwidth_eff", "gemm_eff"] if physics is not None else [])
    runs = [(f"{i}:{lp.label}" if len(sweeps) > 1 else lp.label, samples_of(sw, lp), True)
            for i, sw in enumerate(sweeps) for lp in sw.points]
    fit = fit_steps(hw, prior, runs, held=held)
    delay, delay_note = frontend_delay(hw, fit.params, first)
    source = (f"fitted to every step of {', '.join(str(p) for p in paths)} "
              f"({target.get('engine', '?')} on {card.name}, vllm model) on {_dt.date.today()}")
    cal = replace(fit.params.calibration(base, w, source), frontend_s=0.0,
                  frontend_delay_s=delay, error_band=fit.band)
    settings = engine_settings(target)
    notes = [delay_note]
    notes += [f"{lp.label}: {lp.point.requests.offered} requests in its window, fewer than "
              f"{THIN_REQUESTS}: its percentiles are thin" for sw in sweeps for lp in sw.points
              if lp.point.requests.offered < THIN_REQUESTS]
    notes += [f"{load_text(p)}: no records, left out of the step fit (replayed below)"
              for sw in sweeps for p in sw.without_records]
    if "kv_read_eff" not in held and "kv_read_eff" in fit.held:
        notes.append("kv_read_eff: these steps' contexts cannot tell the KV cache's read rate "
                     "from the weights' (held at bandwidth_eff); fit on a sweep whose contexts "
                     "are as long as those you will serve")
    notes += [f"{t.name} is weakly identified by these steps (kept near {t.value:.3g})"
              for t in fit.terms if t.weakly_identified]
    fitted = {id(lp.point) for sw in sweeps for lp in sw.points}
    errors = [compare_point(p, replay(cal, hw, engine_settings(sw.doc.target), sw.doc, p),
                            fitted_on=id(p) in fitted)
              for sw in sweeps for p in sw.doc.points
              if p.valid]
    return {
        "schema": PROFILE_SCHEMA, "gpu": card.name, "model": mdl.name, "weights": w,
        "kv_cache": kv, "engine": target.engine, "engine_model": "vllm", "method": "steps",
        "fit_points": [lp.label for sw in sweeps for lp in sw.points],
        "fitted_sweeps": [str(sw.path if sw.path.is_dir() else sw.path.parent) for sw in sweeps],
        "engine_settings": settings, "calibration": calibration_to_json(cal),
        "assumptions": {name: value for name, value in
                        zip(StepParams.names(), fit.params.values(), strict=True)
                        if name in held},
        "physics_source": None if physics is None else physics.source,
        "step_fit": step_fit_json(fit), "fit_notes": notes, "fit_error": errors,
        "error_band": fit.band,
    }


def replay(cal: Calibration, hw: Hardware, settings: dict[str, int], doc: SweepDoc,
           p: SweepPoint) -> SweepPoint:
    """The twin's run of a live point: its engine's settings, workload, load and seed."""
    wcfg, _ = workload_from_json(doc.workload)
    start, end = window_of(doc)
    kw: dict[str, Any] = dict(settings)
    spec = EngineSpec(hw.gpu, hw.model, hw.precision, calibration=cal, engine_model="vllm", **kw)
    return run_point(spec, wcfg, p.load, duration_s=end - start, warmup_s=start,
                     seed=p.seed).point


def step_fit_json(fit: StepFit) -> dict[str, Any]:
    return {
        "terms": [{"name": t.name, "value": t.value, "std_error": t.std_error,
                   "weakly_identified": t.weakly_identified, "held": t.std_error is None
                   and not t.weakly_identified} for t in fit.terms],
        "mean_seconds_per_step": fit.term_seconds,
        "points": [{"label": p.label, "steps": round(p.num_steps, 1),
                    "samples": p.num_samples, "dropped": p.num_dropped,
                    "observed_step_s": _num(p.observed_step_s),
                    "modelled_step_s": _num(p.modelled_step_s),
                    "rel_error": _num(p.rel_error)} for p in fit.points],
        "rms_rel_residual": fit.rms_rel_residual,
        "band": fit.band,
    }


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


METHODS = ("auto", "steps", "points")


def choose_method(paths: Sequence[Path], engine_model: str | None, method: str) -> str:
    """`steps` (every step of every point: the vLLM model, sweeps with records) or `points`
    (the concurrency-1 point, and for vLLM a second one: twin/calibrate.py). `auto` takes
    steps wherever it can."""
    if method not in METHODS:
        raise ChatfleetError(f"--method {method!r}: one of {', '.join(METHODS)}")
    if method == "points":
        return method
    docs = [load_sweep(p) for p in paths]
    em = engine_model or engine_model_of(docs[0].target)
    if em != "vllm":
        if method == "steps":
            raise ChatfleetError("--method steps fits the vllm model (the sglang model is "
                                 "fitted on its concurrency-1 point: --method points)")
        return "points"
    if method == "steps":
        return method
    for path, doc in zip(paths, docs, strict=True):
        base = path if path.is_dir() else path.parent
        if any(p.valid and run_file(base, p, "records") is None for p in doc.points):
            return "points"
    return "steps"
