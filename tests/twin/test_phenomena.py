"""What the twin must show without being tuned to anything but the concurrency-1 points
(issue: the engine twin). Every figure here is computed by the twin, never written in."""

from __future__ import annotations

from collections import defaultdict

import pytest

from chatfleet.core.calibration import L4_C1_POINTS
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from tests.twin.conftest import MIXED, closed, engine


@pytest.mark.parametrize("prec", ["bf16", "fp8"])
def test_concurrency_one_matches_the_l4_calibration_points(prec: str) -> None:
    ref = next(p for p in L4_C1_POINTS if p.weights == prec)
    run = closed(engine(prec), 1, WorkloadConfig(system_prompt_tokens=0), warmup=10.0)
    p = run.point
    assert p.output_tok_s == pytest.approx(ref.output_tok_s, rel=0.10)
    assert p.ttft_ms.p50 == pytest.approx(ref.median_ttft_s * 1000, rel=0.20)


def test_fp8_runs_64_users_without_a_queue_where_bf16_queues_on_a_full_pool() -> None:
    fp8 = closed(engine("fp8"), 64).point.engine
    bf16 = closed(engine("bf16"), 64).point.engine
    assert fp8.max_running == 64
    assert fp8.max_queue == 0
    assert bf16.max_queue > 0
    assert bf16.max_running < 64
    assert bf16.peak_token_usage > 0.95


@pytest.mark.parametrize("users", [16, 32, 64])
def test_fixed_lengths_form_waves_that_a_mixed_distribution_does_not(users: int) -> None:
    spec = engine("fp8")
    fixed = closed(spec, users, WorkloadConfig()).point
    mixed = closed(spec, users, WorkloadConfig(lengths=MIXED)).point
    assert fixed.ttft_ms.p50 >= 3 * mixed.ttft_ms.p50


def test_closed_loop_throughput_peaks_where_no_request_meets_the_target() -> None:
    spec = engine("fp8")
    wcfg = WorkloadConfig(lengths=MIXED)
    points = [closed(spec, n, wcfg).point for n in (4, 8, 16, 32, 64)]
    peak = max(points, key=lambda p: p.output_tok_s)
    assert peak.load.concurrency == 64
    assert peak.attainment < 0.05
    assert max(p.attainment for p in points) >= 0.99


def _history_hit_share(run_records: list, system: int, min_turn: int) -> float:
    """Cached tokens beyond the shared prompt over the history the prompt carries."""
    cached = total = 0
    for r in run_records:
        if r.outcome == "ok" and r.turn >= min_turn:
            cached += max(0, r.cached_tokens - system)
            total += r.prompt_tokens - system
    return cached / total


def test_an_8k_pool_thrashes_on_a_multi_turn_trace_where_a_16k_pool_holds() -> None:
    wcfg = WorkloadConfig(system_prompt_tokens=2048, lengths=LengthSpec("uniform", 32, 64, 0.5,
                                                                        "vllm"),
                          turns=8, think_time_s=10.0, reasoning_share=0.5)
    share = {}
    for pool in (8192, 16384):
        run = closed(engine("fp8", pool_tokens=pool), 24, wcfg, duration=600.0, warmup=0.0)
        share[pool] = _history_hit_share(run.records, 2048, min_turn=4)
    assert share[16384] > 0.75
    assert share[8192] < 0.7 * share[16384]


def test_prompt_groups_outgrowing_the_pool_raise_ttft_and_a_host_tier_brings_it_back() -> None:
    def ttft(groups: int, host: int = 0) -> float:
        wcfg = WorkloadConfig(prompt_groups=groups, lengths=MIXED)
        run = closed(engine("bf16", host_pool_tokens=host), 4, wcfg, warmup=60.0)
        return float(run.point.ttft_ms.p50)

    fits = ttft(4)  # 4 x 2,048 shared tokens: well inside the 24k BF16 pool
    outgrown = ttft(32)  # 32 x 2,048 = 65k: larger than the pool
    with_host = ttft(32, host=200_000)  # fits the host tier (write-through holds a superset)
    assert outgrown > 2 * fits
    assert with_host < 0.5 * outgrown


def test_an_engine_cap_below_the_load_moves_the_wait_into_the_first_token() -> None:
    wcfg = WorkloadConfig(lengths=MIXED)
    free = closed(engine("fp8"), 32, wcfg).point
    capped = closed(engine("fp8", max_running_requests=16), 32, wcfg).point
    assert capped.engine.max_running == 16
    assert capped.engine.max_queue > 0
    assert capped.ttft_ms.p50 > 5 * free.ttft_ms.p50
    assert capped.output_tok_s < 0.9 * free.output_tok_s


def test_multi_turn_history_is_reused_turn_after_turn() -> None:
    wcfg = WorkloadConfig(turns=4, lengths=LengthSpec("fixed", 64, 32))
    run = closed(engine("fp8"), 2, wcfg, warmup=0.0)
    by_turn: dict[int, list[int]] = defaultdict(list)
    for r in run.records:
        by_turn[r.turn].append(r.cached_tokens)
    # from turn 1 on the whole previous prompt and answer (but its last token) are cached
    assert min(by_turn[1]) >= 2048 + 64 + 32 - 1
    assert min(by_turn[3]) >= 2048 + 3 * (64 + 32) - 1
