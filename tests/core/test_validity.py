"""core.measure.validity: the one rule of a run's validity, its reasons in a fixed order."""

from __future__ import annotations

import statistics

import pytest

from chatfleet.core.documents.sweep import ClockStats, GpuBlock
from chatfleet.core.measure.percentiles import time_weighted_percentile
from chatfleet.core.measure.validity import (
    INTERRUPTED,
    RunChecks,
    below_clock_floor,
    invalid_reasons,
)


def gpu(p50: float | None) -> GpuBlock:
    return GpuBlock(sm_clock_mhz=ClockStats(p50=p50, min=p50))


def test_the_clock_floor_reads_the_median_sm_clock() -> None:
    assert below_clock_floor(gpu(465.0), 1200.0) == (
        "under the clock floor: median SM clock 465 MHz < 1200 MHz")
    assert below_clock_floor(gpu(1200.0), 1200.0) is None  # at the floor is not under it
    assert below_clock_floor(gpu(465.0), None) is None  # no floor asked
    assert below_clock_floor(gpu(None), 1200.0) is None  # no reading: nothing to hold against


def test_a_clean_run_has_no_reason() -> None:
    assert invalid_reasons(RunChecks(send_lag_ms_p99=1.0, loop_lag_ms_p99=1.0,
                                     max_send_lag_ms=50.0, max_loop_lag_ms=10.0,
                                     gpu=gpu(1800.0), clock_floor_mhz=1200.0)) == []


def test_every_reason_in_order() -> None:
    reasons = invalid_reasons(RunChecks(
        unflushed=["http://a: 400 busy", "the first request on http://b found 512 cached "
                   "tokens"],
        send_lag_ms_p99=80.0, loop_lag_ms_p99=3.0, max_send_lag_ms=50.0, max_loop_lag_ms=10.0,
        gpu=gpu(900.0), clock_floor_mhz=1200.0, interrupted=True))
    assert reasons == [
        "unflushed: http://a: 400 busy",
        "unflushed: the first request on http://b found 512 cached tokens",
        "client behind: send lag p99 80.0 ms, loop lag p99 3.0 ms (bounds 50 / 10 ms)",
        "under the clock floor: median SM clock 900 MHz < 1200 MHz",
        INTERRUPTED,
    ]


@pytest.mark.parametrize("n", range(1, 12))
def test_the_live_median_clock_is_the_twins_time_weighted_median(n: int) -> None:
    """Samples at a fixed interval each stand for the same time: the time-weighted median of
    equal weights is the ordinary median (the live telemetry's), and with step durations it
    is the value below which half the time lies (the twin's)."""
    clocks = [1320.0, 2040.0, 465.0, 1800.0, 2040.0, 1320.0, 900.0, 1320.0, 2040.0, 465.0, 1.0]
    values = clocks[:n]
    assert time_weighted_percentile(values, None, 50.0) == statistics.median(values)
    assert time_weighted_percentile(values, [1.0] * n, 50.0) == statistics.median(values)


def test_time_weighted_percentiles_weigh_each_value_by_its_time() -> None:
    # 400 MHz for 1 s, 500 MHz for 3 s, 1,320 MHz for 1 s: half of the 5 s lies below 500
    assert time_weighted_percentile([1320.0, 500.0, 400.0], [1.0, 3.0, 1.0], 50.0) == 500.0
    # a value held exactly half the time: the mean of it and the next (as the median of two)
    assert time_weighted_percentile([400.0, 500.0], [2.0, 2.0], 50.0) == 450.0
    assert time_weighted_percentile([400.0, 500.0], [2.0, 2.0], 100.0) == 500.0
    assert time_weighted_percentile([400.0, 500.0], [2.0, 2.0], 0.0) == 400.0
    assert time_weighted_percentile([], None, 50.0) is None
    with pytest.raises(ValueError):
        time_weighted_percentile([1.0], [1.0, 2.0], 50.0)
