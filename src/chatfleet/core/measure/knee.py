"""The knee, the throughput peak, the recommended cap, the bisection of a knee bracket, and
the sweep document with its summary.

- The knee is a bracket, one per load mode: `meets` is the highest tested load that meets the
  target attainment together with every lower load, and `fails` the next tested load above it.
  Refinement bisects the bracket until it is one user (or 10% of the rate) wide
  (`bisect_next`; `core.refine` closes an open bracket first). The recommended gateway cap is
  the in-flight count at the closed-loop knee's `meets` point, lowered by `cap_margin` steps of
  the grid. Throughput's peak is reported, never used for the limit.
- Invalid points stay in the results with their reason and are left out of the knee, the
  throughput peak and the cap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from chatfleet.core.documents.sweep import (
    Knee,
    Mode,
    Peak,
    SweepDoc,
    SweepPoint,
    Target,
    check_mode,
)
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.slo import SLO

# Tolerance of the attainment comparison in the knee.
ATTAINMENT_TOL = 1e-12
# Refinement of the open-loop knee stops when the bracket is at most this share of the rate.
RATE_BRACKET_SHARE = 0.10


def load_value(point: SweepPoint) -> float:
    """A point's load: its concurrency (closed loop) or its rate in requests/s (open loop)."""
    return point.load.value


def _valid_by_load(points: Iterable[SweepPoint],
                   mode: Mode | None) -> dict[float, list[SweepPoint]]:
    grouped: dict[float, list[SweepPoint]] = {}
    for p in points:
        if not p.valid:
            continue
        if mode is not None and p.load.mode != mode:
            continue
        grouped.setdefault(p.load.value, []).append(p)
    return dict(sorted(grouped.items()))


def find_knee(points: Iterable[SweepPoint], mode: Mode, attainment: float) -> Knee:
    """The knee bracket of one load mode.

    Over the valid points of that mode, sorted by load (concurrency in closed loop, rate_rps in
    open loop): `meets` is the highest tested load that meets the target attainment together
    with every lower tested load, and `fails` the next tested load above it (None when there is
    none). When the lowest tested load already fails, `meets` is None and `fails` is that load.
    A load tested several times (repeats with new seeds) meets only when every valid run of it
    does.
    """
    mode = check_mode(mode)
    meets: float | None = None
    fails: float | None = None
    for value, group in _valid_by_load(points, mode).items():
        if all(p.attainment >= attainment - ATTAINMENT_TOL for p in group):
            meets = value
        else:
            fails = value
            break
    return Knee(meets, fails)


def throughput_peak(points: Iterable[SweepPoint]) -> Peak:
    """The valid point of highest output_tok_s among the closed-loop points (all valid points when
    there is no valid closed-loop point). Ties go to the lower load. Reported beside the knee,
    never used for the limit. Load None when no point is valid.
    """
    pts = list(points)
    grouped = _valid_by_load(pts, "closed") or _valid_by_load(pts, None)
    best: SweepPoint | None = None
    for group in grouped.values():  # by increasing load: a tie keeps the lower load
        for p in group:
            if best is None or float(p.output_tok_s) > float(best.output_tok_s):
                best = p
    if best is None:
        return Peak(None, 0.0, None)
    return Peak(best.load.value, float(best.output_tok_s), best.load.mode)


def recommended_cap(points: Iterable[SweepPoint], knee: Knee,
                    cap_margin_steps: int = 0) -> int | None:
    """The gateway's per-replica cap: requests in flight at the closed-loop knee.

    The grid is the tested concurrencies of the valid closed-loop points. The cap is the
    `in_flight_max` of the knee's `meets` point, or, with `cap_margin_steps` = m > 0, of the
    tested concurrency m positions below `meets` in the grid (the lowest tested one when the
    grid is shorter). Never below 1. With repeats, the lowest in_flight_max of that load's valid
    runs; a point without in_flight_max reads its concurrency. None when the closed knee has no
    `meets`.
    """
    if cap_margin_steps < 0:
        raise ChatfleetError("cap_margin_steps must be >= 0")
    meets = knee.meets
    if meets is None:
        return None
    grouped = _valid_by_load(points, "closed")
    grid = list(grouped)
    if meets not in grouped:
        raise ValueError(f"knee meets={meets!r} is not a tested valid closed-loop concurrency")
    at = grid[max(0, grid.index(meets) - cap_margin_steps)]
    caps = [p.in_flight_max if p.in_flight_max is not None else p.load.value
            for p in grouped[at]]
    return max(1, int(min(caps)))


def sweep_document(target: Target | Mapping[str, Any], workload: Mapping[str, Any], slo: SLO,
                   points: Sequence[SweepPoint], cap_margin: int = 0) -> SweepDoc:
    """The whole chatfleet.sweep/1 document: target, workload, slo, every point (invalid ones
    included, with their reason), the closed-loop knee ("knee"), the open-loop knee in
    requests/s ("knee_rate"), the throughput peak and the recommended cap (lowered by
    `cap_margin` grid steps, recorded as "cap_margin"). Invalid points are left out of the knee,
    the peak and the cap."""
    pts = tuple(points)
    knee = find_knee(pts, "closed", slo.attainment)
    return SweepDoc(
        target=target if isinstance(target, Target) else Target(dict(target)),
        workload=dict(workload),
        slo=slo,
        points=pts,
        knee=knee,
        knee_rate=find_knee(pts, "open", slo.attainment),
        throughput_peak=throughput_peak(pts),
        recommended_cap=recommended_cap(pts, knee, cap_margin),
        cap_margin=cap_margin,
    )


def bisect_next(knee: Knee, tested_loads: Iterable[float], mode: Mode) -> float | None:
    """The next load to test to refine a knee bracket, or None when it is narrow enough.

    Closed loop: the untested whole concurrency nearest the middle of (meets, fails) (the lower
    one on a tie); None when the bracket is at most 1 user wide. A missing `meets` counts as 0
    users (nothing to serve meets any target), so a failing lowest load is bisected down to 1.
    Open loop: the middle rate, or the middle of one half when the middle was already tested;
    None when fails - meets <= 10% of the meets rate, or when `meets` is missing (an open
    bracket calls for a lower grid, not bisection). None whenever `fails` is missing.
    """
    mode = check_mode(mode)
    fails = knee.fails
    meets = knee.meets
    if fails is None:
        return None
    tested = [float(x) for x in tested_loads]

    def untested(x: float) -> bool:
        return all(not math.isclose(x, t, rel_tol=1e-9, abs_tol=1e-12) for t in tested)

    if mode == "closed":
        lo = 0 if meets is None else int(meets)
        hi = int(fails)
        if hi - lo <= 1:
            return None
        mid2 = lo + hi  # twice the middle
        candidates = sorted(range(lo + 1, hi), key=lambda c: (abs(2 * c - mid2), c))
        for c in candidates:
            if untested(c):
                return c
        return None
    if meets is None:
        return None
    low, high = float(meets), float(fails)
    if high - low <= RATE_BRACKET_SHARE * low * (1.0 + 1e-9):  # 1e-9: float rounding
        return None
    mid = (low + high) / 2.0
    for rate in (mid, (low + mid) / 2.0, (mid + high) / 2.0):
        if untested(rate):
            return rate
    return None
