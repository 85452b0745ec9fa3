"""A live point against the twin's run of it: the figures a plan rests on, side by side.

`FIGURES` names each compared figure and how it is read from a point; `TARGETS` the relative
error a held-out point must stay within for the twin to be said to predict it (issue 22's
targets: median TTFT within 25%, median TPOT within 15%, output throughput within 10%). The
knee is judged apart (`knee_steps`): within one step of the tested grid.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from chatfleet.core.documents.sweep import ClosedLoad, Load, Mode, SweepPoint
from chatfleet.core.measure.knee import find_knee

FIGURES: dict[str, Callable[[SweepPoint], float | None]] = {
    "ttft_p50": lambda p: p.ttft_ms.p50,
    "ttft_p99": lambda p: p.ttft_ms.p99,
    "tpot_p50": lambda p: p.tpot_ms.p50,
    "tpot_p99": lambda p: p.tpot_ms.p99,
    "output_tok_s": lambda p: p.output_tok_s,
    "max_running": lambda p: p.engine.max_running,
    "max_queue": lambda p: p.engine.max_queue,
    "attainment": lambda p: p.attainment,
}
TARGETS = {"ttft_p50": 0.25, "tpot_p50": 0.15, "output_tok_s": 0.10}


def load_text(p: SweepPoint | Load) -> str:
    load = p.load if isinstance(p, SweepPoint) else p
    if isinstance(load, ClosedLoad):
        return f"{load.concurrency} users"
    return f"{load.rate_rps:g} rps"


def compare_point(live: SweepPoint, twin: SweepPoint, fitted_on: bool) -> dict[str, Any]:
    """One row: each figure live and twin, its relative error, and whether the targets hold."""
    row: dict[str, Any] = {"load": live.load.to_json(), "label": load_text(live),
                           "fitted_on": fitted_on, "requests": live.requests.offered,
                           "thin": bool(live.thin)}
    for key, read in FIGURES.items():
        a, b = read(live), read(twin)
        rel = (b - a) / a if a and b is not None else None
        row[key] = {"live": a, "twin": b, "rel_error": rel}
    row["within_targets"] = all(
        row[k]["rel_error"] is not None and abs(row[k]["rel_error"]) <= t
        for k, t in TARGETS.items())
    return row


def knee_steps(live: Sequence[SweepPoint], twin: Sequence[SweepPoint], mode: Mode,
               attainment: float) -> dict[str, Any]:
    """The knee of one load mode in the live points and in the twin's runs of the same loads,
    and how many steps of the tested grid apart their `meets` loads are (None: no such
    points)."""
    grid = sorted({p.load.value for p in live if p.load.mode == mode and p.valid})
    if not grid:
        return {"mode": mode, "live": None, "twin": None, "grid_steps": None}
    kl = find_knee(live, mode, attainment)
    kt = find_knee(twin, mode, attainment)

    def index(meets: float | None) -> int:
        return -1 if meets is None else grid.index(meets)

    return {"mode": mode, "live": kl.to_json(), "twin": kt.to_json(),
            "grid_steps": abs(index(kl.meets) - index(kt.meets))}
