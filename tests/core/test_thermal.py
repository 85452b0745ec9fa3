"""Thermal model: the L4 profile against docs/facts.md#l4-under-overload (1,320 -> 465 MHz,
70% of samples in thermal slowdown), and the clock factors it hands to the step-time model."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.calibration import step_constants, thermal_profile
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.scheduler import Scheduler, SchedulerConfig
from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.engine.thermal import ThermalState
from chatfleet.core.specs import builtin_model, get_gpu, precision

L4 = get_gpu("l4")
PROFILE = thermal_profile(L4)


def run(state: ThermalState, seconds: int, utilization: float) -> list[tuple[bool, float, float]]:
    """Advance one second at a time; one sample (slowdown, clock, temperature) per second."""
    out = []
    for _ in range(seconds):
        state.advance(1.0, utilization)
        out.append((state.slowdown, state.sm_mhz, state.temp_c))
    return out


def test_l4_overload_from_a_cool_start() -> None:
    state = ThermalState(PROFILE)
    start = state.temp_c
    samples = run(state, 300, 1.0)
    temps = [t for _, _, t in samples]
    assert temps[0] > start
    first = next(i for i, (slow, _, _) in enumerate(samples) if slow)
    # slowdown starts about 30% into the run (90 s), +-5 percentage points
    assert 0.25 * 300 <= first <= 0.35 * 300
    # before it, the card runs at its loaded clock and heats up monotonically
    assert all(mhz == PROFILE.loaded_mhz for _, mhz, _ in samples[:first])
    assert all(a < b for a, b in itertools.pairwise(temps[:first]))
    share = sum(slow for slow, _, _ in samples) / len(samples)
    assert share == pytest.approx(0.70, abs=0.05)
    assert samples[-1][1] == pytest.approx(465.0, rel=0.10)
    assert PROFILE.loaded_mhz == 1320.0
    # the driver holds the temperature at the slowdown point
    assert max(temps) <= PROFILE.slowdown_c + 1e-6
    assert temps[-1] == pytest.approx(PROFILE.slowdown_c, abs=0.5)


def test_settled_clock_factors_by_hand() -> None:
    state = ThermalState(PROFILE)
    run(state, 600, 1.0)
    # compute-bound work slows by 1320 / 465; memory-bound by 900 / 465 (below the floor)
    assert state.sm_factor == pytest.approx(1320 / 465, rel=0.10)
    assert state.mem_factor == pytest.approx(900 / 465, rel=0.10)
    assert state.sm_factor > state.mem_factor > 1.0


def test_idle_stays_cool_at_loaded_clock() -> None:
    state = ThermalState(PROFILE)
    start = state.temp_c
    samples = run(state, 300, 0.0)
    assert not any(slow for slow, _, _ in samples)
    assert all(mhz == PROFILE.loaded_mhz for _, mhz, _ in samples)
    assert all(t == pytest.approx(start, abs=1e-9) for _, _, t in samples)
    assert start < PROFILE.slowdown_c
    assert state.sm_factor == 1.0
    assert state.mem_factor == 1.0


def test_hot_idle_card_cools_without_throttling() -> None:
    state = ThermalState(PROFILE, temp_c=95.0)
    samples = run(state, 120, 0.0)
    temps = [t for _, _, t in samples]
    assert all(a > b for a, b in zip([95.0, *temps], temps, strict=False))
    assert not any(slow for slow, _, _ in samples)
    assert state.sm_factor == 1.0


def test_half_load_settles_below_slowdown_or_at_a_higher_clock() -> None:
    # at half load the steady power is lower, so any throttling keeps a higher clock
    full, half = ThermalState(PROFILE), ThermalState(PROFILE)
    run(full, 900, 1.0)
    run(half, 900, 0.5)
    assert half.sm_mhz > full.sm_mhz


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 30.0), st.floats(0.0, 1.0)), min_size=1,
                max_size=60),
       st.floats(20.0, 110.0))
def test_factors_are_slowdowns(steps: list[tuple[float, float]], temp: float) -> None:
    state = ThermalState(PROFILE, temp_c=temp)
    for dt, u in steps:
        state.advance(dt, u)
        assert state.sm_factor >= 1.0
        assert state.mem_factor >= 1.0
        assert PROFILE.min_mhz <= state.sm_mhz <= PROFILE.loaded_mhz
        if not state.slowdown:
            assert state.sm_factor == 1.0
            assert state.mem_factor == 1.0


def test_generic_profile_never_throttles_at_rated_power() -> None:
    h100 = get_gpu("h100")
    state = ThermalState(thermal_profile(h100))
    samples = run(state, 1200, 1.0)
    assert not any(slow for slow, _, _ in samples)
    assert samples[-1][2] < thermal_profile(h100).slowdown_c


def test_hot_scheduler_runs_prefill_slower() -> None:
    """A card already at the slowdown point: after one busy step its clock drops and the next
    compute-bound prefill takes longer than on a cool card."""
    model = builtin_model("qwen3-8b")
    prec = precision("bf16", "bf16")
    step_model = StepTimeModel(model, L4, prec, step_constants(L4, model, prec))

    def second_prefill(temp: float) -> float:
        sched = Scheduler(SchedulerConfig(pool_tokens=24_093), step_model,
                          ThermalState(PROFILE, temp_c=temp))
        durations = []
        now = 0.0
        for i in range(2):
            sched.add_request(EngineRequest(f"r{i}", list(range(i * 5000, i * 5000 + 2000)),
                                            [1], 1), now)
            step = sched.schedule(now)
            assert step is not None and step.kind == "prefill"
            sched.complete(step.end)
            durations.append(step.duration)
            now = step.end
        return durations[1]

    cool, hot = second_prefill(40.0), second_prefill(PROFILE.slowdown_c)
    assert hot > 1.5 * cool
