"""`chatfleet twin judge`: a fitted profile against live sweeps it was (or was not) fitted on.

Every valid point of each sweep is replayed through the twin with the profile's constants, the
sweep's own engine settings (its pool, token budget, sequence cap), workload, load and seed, and
compared figure by figure (twin/compare.py): median and P99 TTFT and TPOT, output throughput,
the largest batch and queue, attainment. A point is held out unless the profile was fitted on
that sweep (the profile names its sweeps). The knee of each load mode is compared too: the
twin's `meets` within one step of the tested grid of the live one.

Only the sweep documents are read (no token times), so a sweep of a workload you do not have,
shared as its sweep.json, judges a profile the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatfleet.core.documents.sweep import SweepDoc
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.stepfit.model import Hardware
from chatfleet.twin.calibrate import engine_settings, load_profile, load_sweep
from chatfleet.twin.calibrate_steps import replay
from chatfleet.twin.compare import TARGETS, compare_point, knee_steps

JUDGE_SCHEMA = "chatfleet.judge/1"
KNEE_STEPS_TARGET = 1


def judge(profile_path: Path, sweep_paths: Sequence[Path]) -> dict[str, Any]:
    cal, prof = load_profile(profile_path)
    if prof.get("engine_model") != "vllm":
        raise ChatfleetError(f"{profile_path}: judge replays the vllm model; this profile is "
                             f"of the {prof.get('engine_model')!r} model")
    hw = Hardware(get_gpu(str(prof["gpu"])), builtin_model(str(prof.get("model", "qwen3-8b"))),
                  precision(str(prof["weights"]), str(prof["kv_cache"])))
    fitted_on = {str(Path(p).resolve()) for p in prof.get("fitted_sweeps") or ()}
    out = []
    for path in sweep_paths:
        doc = load_sweep(path)
        root = path if path.is_dir() else path.parent
        held_out = str(root.resolve()) not in fitted_on
        out.append(judge_sweep(cal, hw, doc, str(path), held_out))
    rows = [r for s in out for r in s["points"] if not r["fitted_on"]]
    knees = [k for s in out if s["held_out"] for k in s["knees"] if k["grid_steps"] is not None]
    return {
        "schema": JUDGE_SCHEMA, "profile": str(profile_path),
        "targets": {**{k: v for k, v in TARGETS.items()}, "knee_grid_steps": KNEE_STEPS_TARGET},
        "sweeps": out,
        "held_out": {
            "points": len(rows),
            "within_targets": sum(1 for r in rows if r["within_targets"]),
            "knees": len(knees),
            "knees_within": sum(1 for k in knees if k["grid_steps"] <= KNEE_STEPS_TARGET),
        },
    }


def judge_sweep(cal: Any, hw: Hardware, doc: SweepDoc, where: str,
                held_out: bool) -> dict[str, Any]:
    settings = engine_settings(doc.target)
    live = [p for p in doc.points if p.valid]
    if not live:
        raise ChatfleetError(f"{where}: no valid point to judge against")
    twin = [replay(cal, hw, settings, doc, p) for p in live]
    attainment = doc.slo.attainment
    return {
        "path": where, "held_out": held_out, "engine_settings": settings,
        "points": [compare_point(a, b, fitted_on=not held_out) for a, b in zip(live, twin,
                                                                               strict=True)],
        "knees": [knee_steps(live, twin, mode, attainment) for mode in ("closed", "open")],
    }
