"""core.refine: the one refinement policy of the twin's and the live sweep's knee brackets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from chatfleet.core.documents.sweep import Load, SweepPoint, load_from_json
from chatfleet.core.refine import DEFAULT_POLICY, Refinement, RefinePolicy, next_load


def point(load: dict[str, Any] | Load, attainment: float, valid: bool = True) -> SweepPoint:
    typed = load_from_json(load) if isinstance(load, dict) else load
    return SweepPoint(load=typed, attainment=attainment, valid=valid)


def drive(template: dict[str, Any], grid: list[float], meets: Callable[[float], bool],
          policy: RefinePolicy = DEFAULT_POLICY) -> list[Refinement]:
    """Run the policy against a load whose attainment is 1 when `meets(value)`, else 0."""
    typed = load_from_json(template)
    points = [point(typed.at(v), 1.0 if meets(v) else 0.0) for v in grid]
    runs = {"extend": 0, "bisect": 0}
    taken: list[Refinement] = []
    while (nxt := next_load(points, typed, 0.99, extended=runs["extend"],
                            bisected=runs["bisect"], policy=policy)) is not None:
        runs[nxt.phase] += 1
        taken.append(nxt)
        v = nxt.load.value
        points.append(point(nxt.load, 1.0 if meets(v) else 0.0))
        assert len(taken) < 50
    return taken


def test_a_closed_grid_whose_top_meets_is_doubled_then_bisected() -> None:
    taken = drive({"mode": "closed", "concurrency": 1}, [1, 4, 16], lambda u: u <= 45)
    values = [r.load.value for r in taken]
    assert [r.phase for r in taken[:2]] == ["extend", "extend"] and values[:2] == [32, 64]
    assert all(r.phase == "bisect" for r in taken[2:])
    assert sorted(values[2:]) != [] and 45 in values and 46 in values  # one user wide


def test_an_open_grid_whose_lowest_rate_fails_is_halved_then_bisected() -> None:
    template = {"mode": "open", "rate_rps": 8.0, "arrival": "gamma:2"}
    taken = drive(template, [8.0], lambda r: r <= 1.3)
    assert [r.load.value for r in taken[:3]] == [4.0, 2.0, 1.0]
    assert all(r.load.arrival == "gamma:2" for r in taken)  # the template's process stays
    tested = [8.0, *[r.load.value for r in taken]]
    meets = max(v for v in tested if v <= 1.3)
    fails = min(v for v in tested if v > 1.3)
    assert fails - meets <= 0.1 * meets + 1e-9


def test_extension_stops_at_the_load_bound_and_the_run_bound() -> None:
    never_fails = drive({"mode": "closed", "concurrency": 1}, [1, 8], lambda u: True,
                        RefinePolicy(max_concurrency=100))
    assert [r.load.value for r in never_fails] == [16, 32, 64]  # 128 > 100
    capped = drive({"mode": "closed", "concurrency": 1}, [1, 8], lambda u: True,
                   RefinePolicy(extend_max_runs=2))
    assert [r.load.value for r in capped] == [16, 32]


def test_bisection_stops_after_its_run_bound() -> None:
    taken = drive({"mode": "closed", "concurrency": 1}, [1, 1024], lambda u: u <= 300,
                  RefinePolicy(bisect_max_runs=3))
    assert [r.phase for r in taken] == ["bisect"] * 3


def test_invalid_points_neither_close_nor_extend_a_bracket() -> None:
    points = [point({"mode": "closed", "concurrency": 64}, 1.0, valid=False)]
    one = load_from_json({"mode": "closed", "concurrency": 1})
    assert next_load(points, one, 0.99) is None
    assert next_load([], one, 0.99) is None


def test_a_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="bounds"):
        RefinePolicy(max_concurrency=0)
    with pytest.raises(ValueError, match="negative"):
        RefinePolicy(bisect_max_runs=-1)
