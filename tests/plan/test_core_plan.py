"""core/plan.py: the answer's arithmetic from sweep documents (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from chatfleet.core.documents.sweep import Knee, SweepDoc, SweepPoint, Target
from chatfleet.core.measure.knee import sweep_document
from chatfleet.core.plan import (
    PlanError,
    accuracy_verdicts,
    choose_precision,
    figures_from_sweep,
    fleet_size,
    host_tier,
    prefill_reserve_s,
    working_set_tokens,
)
from chatfleet.core.slo import SLO


def point(mode: str, load: float, attainment: float, goodput: float,
          ttft_p99: float = 400.0, in_flight: int | None = None) -> SweepPoint:
    key = "concurrency" if mode == "closed" else "rate_rps"
    return SweepPoint.from_json({
        "load": {"mode": mode, key: load}, "valid": True, "attainment": attainment,
        "goodput_rps": goodput, "output_tok_s": goodput * 128,
        "ttft_ms": {"p50": 200.0, "p90": 300.0, "p99": ttft_p99},
        "in_flight_max": in_flight if in_flight is not None else int(load)})


def doc(weights: str, kv: str, points: list[SweepPoint]) -> SweepDoc:
    return sweep_document({"weights": weights, "kv_cache": kv, "gpu": "l4"}, {}, SLO(), points)


def test_figures_name_the_knee_point_they_came_from() -> None:
    pts = [point("closed", 4, 1.0, 0.5), point("closed", 8, 0.995, 1.1, ttft_p99=430.0,
                                               in_flight=7),
           point("closed", 16, 0.5, 0.7), point("open", 0.5, 1.0, 0.5),
           point("open", 1.0, 0.2, 0.2)]
    f = figures_from_sweep(doc("fp8", "fp8", pts), "sweep.json")
    assert f.name == "fp8" and f.users_per_card == 8
    assert f.gateway_cap == 7  # in flight at the knee, not the user count
    assert f.goodput_rps == 1.1 and f.ttft_p99_ms == 430.0 and f.rate_rps == 0.5
    assert f.source.to_json() == {"sweep": "sweep.json", "point": 1,
                                  "load": pts[1].load.to_json(), "rate_point": 3}
    assert f.to_json()["engine_guard"] == 7


def test_a_cap_margin_lowers_the_cap_by_grid_steps() -> None:
    pts = [point("closed", 4, 1.0, 0.5), point("closed", 6, 1.0, 0.7),
           point("closed", 8, 0.995, 1.1, in_flight=7), point("closed", 16, 0.5, 0.7)]
    d = doc("fp8", "fp8", pts)
    assert figures_from_sweep(d, "s").gateway_cap == 7
    assert figures_from_sweep(d, "s", cap_margin=1).gateway_cap == 6
    assert figures_from_sweep(d, "s", cap_margin=5).gateway_cap == 4  # the lowest tested
    lowered = figures_from_sweep(d, "s", cap_margin=1)
    # the users the lowered cap admits, and that point's figures
    assert lowered.users_per_card == 6 and lowered.goodput_rps == 0.7
    assert lowered.source.point == 1 and lowered.knee == Knee(8, 16)


def test_a_sweep_where_nothing_meets_has_no_users_per_card() -> None:
    f = figures_from_sweep(doc("bf16", "bf16", [point("closed", 1, 0.5, 0.1)]), "twin")
    assert f.users_per_card is None and f.gateway_cap is None and f.source.point is None


def test_a_sweep_without_precision_is_refused() -> None:
    with pytest.raises(PlanError, match="weights"):
        figures_from_sweep(SweepDoc(Target({}), {}, SLO(), ()), "x.json")


@pytest.mark.parametrize(("users", "per_card", "headroom", "replicas"),
                         [(200, 25, 0.2, 10), (200, 25, 0.0, 8), (1, 25, 0.2, 1),
                          (100, 6, 0.2, 20), (101, 6, 0.2, 21)])
def test_fleet_size_rounds_up_with_headroom(users: int, per_card: int, headroom: float,
                                            replicas: int) -> None:
    assert fleet_size(users, per_card, headroom) == {"replicas": replicas, "cards": replicas}
    assert fleet_size(users, per_card, headroom, cards_per_replica=2)["cards"] == 2 * replicas


def test_fleet_size_refuses_nonsense() -> None:
    for args in ((0, 5, 0.2), (10, 0, 0.2), (10, 5, -0.1)):
        with pytest.raises(PlanError):
            fleet_size(*args)


def accuracy(lo: float, hi: float, within: bool) -> dict[str, Any]:
    return {"schema": "chatfleet.accuracy/1", "reference": "bf16", "margin": 0.02,
            "targets": {"bf16": {"accuracy": 0.9}, "fp8": {"accuracy": 0.88}},
            "paired": {"a": "bf16", "b": "fp8", "diff": (lo + hi) / 2, "diff_ci95": [lo, hi],
                       "within_margin": within},
            "comparisons": [{"a": "bf16", "b": "fp8", "diff": (lo + hi) / 2,
                             "diff_ci95": [lo, hi], "within_margin": within}]}


def figures() -> list[Any]:
    bf16 = figures_from_sweep(doc("bf16", "bf16", [point("closed", 6, 1.0, 0.5),
                                                   point("closed", 8, 0.7, 0.4)]), "twin")
    fp8 = figures_from_sweep(doc("fp8", "fp8", [point("closed", 16, 1.0, 1.7),
                                                point("closed", 32, 0.1, 0.3)]), "twin")
    return [bf16, fp8]


def test_the_most_users_per_card_wins_when_accuracy_allows() -> None:
    figs = figures()
    best, why = choose_precision(figs, accuracy_verdicts(None, ["bf16", "fp8"]))
    assert best is not None and best.name == "fp8" and "16 users" in why
    verdicts = accuracy_verdicts(accuracy(-0.015, 0.005, True), ["bf16", "fp8"])
    assert verdicts["fp8"].allowed and verdicts["bf16"].why == "the accuracy reference"
    best, _ = choose_precision(figs, verdicts)
    assert best is not None and best.name == "fp8"


def test_a_precision_outside_the_margin_is_not_recommended_whatever_its_goodput() -> None:
    verdicts = accuracy_verdicts(accuracy(-0.05, -0.01, False), ["bf16", "fp8"])
    assert not verdicts["fp8"].allowed and "outside" in verdicts["fp8"].why
    best, why = choose_precision(figures(), verdicts)
    assert best is not None and best.name == "bf16"
    assert "not recommended for accuracy: fp8" in why


def test_names_the_result_does_not_hold_are_allowed_but_marked_unchecked() -> None:
    v = accuracy_verdicts(accuracy(-0.05, -0.01, False), ["fp8/bf16"])
    assert v["fp8/bf16"].to_json() == {"allowed": True, "checked": False,
                                       "why": "not among the accuracy result's targets"}


def test_nothing_meets_means_no_recommendation() -> None:
    f = figures_from_sweep(doc("bf16", "bf16", [point("closed", 1, 0.2, 0.1)]), "twin")
    best, why = choose_precision([f], accuracy_verdicts(None, ["bf16"]))
    assert best is None and "no precision meets" in why


def test_host_tier_only_inside_its_window() -> None:
    assert not host_tier(10_000, 24_000, 100_000).enable  # fits the pool
    inside = host_tier(40_000, 24_000, 100_000)
    assert inside.enable and inside.hicache_ratio >= 40_000 / 24_000
    outside = host_tier(200_000, 24_000, 100_000)
    assert not outside.enable and "fewer users" in outside.why


def test_working_set_counts_shared_prompts_once_and_each_history() -> None:
    assert working_set_tokens(10, 2048, 2, 640.0) == 2 * 2048 + 10 * 640


def test_prefill_reserve_is_the_knee_p99_ttft_rounded_up_within_the_budget() -> None:
    f = figures()[1]
    assert prefill_reserve_s(f, 1.0) == pytest.approx(0.4)
    slow = figures_from_sweep(doc("fp8", "fp8", [point("closed", 4, 1.0, 0.5,
                                                       ttft_p99=1420.0)]), "t")
    assert prefill_reserve_s(slow, 1.0) == 1.0
