"""Thermal model: power by phase, the fit of the L4 profile to the L4 overload measurement
(1,320 -> 465 MHz, 70% of samples in thermal slowdown) as a function of the decode power
ratio, what a load asks of the cooling, and the clock factors handed to the step-time model.
The same fit through the twin's own overload run is in tests/twin/test_thermal_runs.py."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.calibration import (
    DECODE_POWER_RATIO,
    L4_OVERLOAD_RUN,
    L4_OVERLOAD_SETTLED_MHZ,
    L4_OVERLOAD_SLOWDOWN_SHARE,
    ThermalProfile,
    fit_l4_thermal,
    step_constants,
    thermal_profile,
)
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.scheduler import Scheduler, SchedulerConfig
from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.engine.thermal import STATE_FIELDS, ThermalState, cooling_need
from chatfleet.core.specs import builtin_model, get_gpu, precision

L4 = get_gpu("l4")
PROFILE = thermal_profile(L4)


def run(state: ThermalState, seconds: int, utilization: float,
        kind: str = "prefill") -> list[tuple[bool, float, float]]:
    """Advance one second at a time; one sample (slowdown, clock, temperature) per second."""
    out = []
    for _ in range(seconds):
        state.advance(1.0, utilization, kind)
        out.append((state.slowdown, state.sm_mhz, state.temp_c))
    return out


def mixed(state: ThermalState, seconds: int, prefill_share: float, utilization: float = 1.0,
          settled_share: float | None = None) -> list[tuple[bool, float, float]]:
    """Each second: `prefill_share` of it prefill, the rest decode (or `settled_share` once
    the clock is lowered, as the engine's own mix shifts when prefill slows more than
    decode). One sample per second, taken after its decode part."""
    out = []
    for _ in range(seconds):
        share = prefill_share
        if settled_share is not None and state.sm_factor > 1.0:
            share = settled_share
        state.advance(share, utilization, "prefill")
        state.advance(1.0 - share, utilization, "decode")
        out.append((state.slowdown, state.sm_mhz, state.temp_c))
    return out


def overload(profile: ThermalProfile) -> list[tuple[bool, float, float]]:
    """The overload run of the fit, from a cool start: warm-up and window, the engine's mix
    at the loaded and at the settled clock."""
    run_ = L4_OVERLOAD_RUN
    return mixed(ThermalState(profile), int(run_.warmup_s + run_.duration_s),
                 run_.prefill_share_loaded, settled_share=run_.prefill_share_settled)


@pytest.mark.parametrize("ratio", [0.35, DECODE_POWER_RATIO, 0.8, 1.0])
def test_the_fit_reproduces_the_overload_for_any_decode_power_ratio(ratio: float) -> None:
    profile = fit_l4_thermal(ratio)
    assert profile.decode_power_ratio == ratio
    samples = overload(profile)
    warmup = int(L4_OVERLOAD_RUN.warmup_s)
    window = samples[warmup:]
    first = next(i for i, (slow, _, _) in enumerate(samples) if slow)
    # the card runs at its loaded clock and heats until slowdown, 30% into the window
    assert first == pytest.approx(warmup + 0.3 * L4_OVERLOAD_RUN.duration_s, abs=3)
    assert all(mhz == profile.loaded_mhz for _, mhz, _ in samples[:first])
    assert all(a < b for a, b in itertools.pairwise([t for _, _, t in samples[:first]]))
    share = sum(slow for slow, _, _ in window) / len(window)
    assert share == pytest.approx(L4_OVERLOAD_SLOWDOWN_SHARE, abs=0.02)
    settled = sorted(mhz for _, mhz, _ in samples[-60:])
    assert settled[len(settled) // 2] == pytest.approx(L4_OVERLOAD_SETTLED_MHZ, rel=0.03)
    assert max(t for _, _, t in samples) <= profile.slowdown_c + 1e-6


def test_a_lower_decode_power_ratio_needs_less_cooling_to_give_the_same_overload() -> None:
    # with decode drawing less, the same 465 MHz means a card that sheds less heat
    low, high = fit_l4_thermal(0.4), fit_l4_thermal(0.9)
    assert low.hold_w() < high.hold_w()
    assert low.r_c_per_w > high.r_c_per_w


def test_the_fit_rejects_what_cannot_hold() -> None:
    with pytest.raises(ValueError, match="decode power ratio"):
        fit_l4_thermal(0.0)
    with pytest.raises(ValueError, match="decode power ratio"):
        fit_l4_thermal(1.2)


def test_phase_power_prefill_draws_the_cap_decode_less() -> None:
    p = PROFILE
    assert p.power_w(1.0, "prefill", p.loaded_mhz) == p.cap_w
    decode = p.power_w(1.0, "decode", p.loaded_mhz)
    assert decode == pytest.approx(p.idle_w + p.decode_power_ratio * (p.cap_w - p.idle_w))
    assert p.idle_w < decode < p.cap_w
    # half the clock, half the power above idle; idle draws idle at any clock
    assert p.power_w(1.0, "prefill", p.loaded_mhz / 2) == pytest.approx(
        p.idle_w + (p.cap_w - p.idle_w) / 2)
    assert p.power_w(0.0, "decode", p.loaded_mhz) == p.idle_w


def test_decode_heats_slower_and_settles_at_a_higher_clock_than_prefill() -> None:
    pre, dec = ThermalState(PROFILE), ThermalState(PROFILE)
    a, b = run(pre, 1200, 1.0, "prefill"), run(dec, 1200, 1.0, "decode")
    first_pre = next(i for i, (slow, _, _) in enumerate(a) if slow)
    first_dec = next(i for i, (slow, _, _) in enumerate(b) if slow)
    assert first_dec > first_pre
    assert dec.sm_mhz > pre.sm_mhz


def test_a_load_under_what_the_cooling_sheds_keeps_its_clock() -> None:
    p = PROFILE
    # prefill at a busy share whose power at the loaded clock is just under the hold power
    u_hold = (p.hold_w() - p.idle_w) / (p.cap_w - p.idle_w)
    under, over = ThermalState(p), ThermalState(p)
    below = run(under, 3600, 0.95 * u_hold)
    assert not any(slow for slow, _, _ in below)
    assert max(t for _, _, t in below) < p.slowdown_c
    above = run(over, 3600, 1.10 * u_hold)
    assert any(slow for slow, _, _ in above)
    assert cooling_need(p, 0.95 * u_hold, 1.0).holds_clock
    assert not cooling_need(p, 1.10 * u_hold, 1.0).holds_clock


def test_the_cooling_it_asks_for_holds_the_clock() -> None:
    """A saturated card at the knee's mix throttles under the fitted cooling; at the thermal
    resistance cooling_need names (or just under it) it holds its clock."""
    share = 0.24
    need = cooling_need(PROFILE, 1.0, share)
    assert not need.holds_clock
    assert need.cooling_factor > 1.0
    assert need.max_r_c_per_w == pytest.approx(PROFILE.r_c_per_w / need.cooling_factor)
    assert PROFILE.ambient_c + need.max_r_c_per_w * need.loaded_power_w == pytest.approx(
        PROFILE.slowdown_c)
    assert PROFILE.r_c_per_w * need.loaded_power_w + need.max_inlet_c == pytest.approx(
        PROFILE.slowdown_c)
    hot = mixed(ThermalState(PROFILE), 1800, share)
    assert any(slow for slow, _, _ in hot)
    better = replace(PROFILE, r_c_per_w=0.98 * need.max_r_c_per_w)
    assert cooling_need(better, 1.0, share).holds_clock
    cool = mixed(ThermalState(better), 3600, share)
    assert not any(slow for slow, _, _ in cool)
    # an inlet at the named bound does the same with the fitted resistance
    colder = replace(PROFILE, ambient_c=need.max_inlet_c - 1.0)
    assert not any(slow for slow, _, _ in mixed(ThermalState(colder), 3600, share))
    # and the busy share it names
    assert not any(slow for slow, _, _ in mixed(ThermalState(PROFILE), 3600, share,
                                                utilization=0.98 * need.max_busy_share))


def test_cooling_need_rejects_shares_out_of_range() -> None:
    with pytest.raises(ValueError, match="shares"):
        cooling_need(PROFILE, 1.2, 0.5)
    with pytest.raises(ValueError, match="shares"):
        cooling_need(PROFILE, 1.0, -0.1)


def test_settled_clock_factors_by_hand() -> None:
    state = ThermalState(PROFILE)
    run(state, 1800, 1.0, "prefill")
    # all prefill at full load: the clock whose prefill power is the hold power
    f = PROFILE.loaded_mhz * (PROFILE.hold_w() - PROFILE.idle_w) / (
        PROFILE.cap_w - PROFILE.idle_w)
    assert state.sm_mhz == pytest.approx(f, rel=0.02)
    assert state.sm_factor == pytest.approx(PROFILE.loaded_mhz / f, rel=0.02)
    assert state.mem_factor == pytest.approx(PROFILE.mem_bound_floor_mhz / f, rel=0.02)
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


def test_hot_idle_card_cools_and_lets_its_clock_back_up() -> None:
    state = ThermalState(PROFILE)
    run(state, 900, 1.0)
    assert state.sm_factor > 1.0
    samples = run(state, 300, 0.0)
    temps = [t for _, _, t in samples]
    assert all(a > b for a, b in itertools.pairwise(temps))
    assert not any(slow for slow, _, _ in samples)
    assert state.sm_factor == 1.0  # the recent work draws nothing: nothing to hold


def test_half_load_settles_below_slowdown_or_at_a_higher_clock() -> None:
    # at half load the steady power is lower, so any throttling keeps a higher clock
    full, half = ThermalState(PROFILE), ThermalState(PROFILE)
    run(full, 900, 1.0)
    run(half, 900, 0.5)
    assert half.sm_mhz > full.sm_mhz


def test_unknown_step_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="step kind"):
        ThermalState(PROFILE).advance(1.0, 1.0, "idle-spin")


def test_a_mixed_step_draws_between_decode_and_prefill_by_its_prefill_share() -> None:
    """vLLM's mixed steps: all-prefill tokens draw what a prefill draws, all-decode what a
    decode draws, and a share in between lies between them; the share must be given."""
    prefill, decode = PROFILE.phase_power_w("prefill"), PROFILE.phase_power_w("decode")
    assert PROFILE.phase_power_w("mixed", 1.0) == pytest.approx(prefill)
    assert PROFILE.phase_power_w("mixed", 0.0) == pytest.approx(decode)
    assert decode < PROFILE.phase_power_w("mixed", 0.3) < prefill
    with pytest.raises(ValueError, match="prefill share"):
        ThermalState(PROFILE).advance(1.0, 1.0, "mixed")
    state = ThermalState(PROFILE)
    state.advance(10.0, 1.0, "mixed", 0.5)
    assert state.power_w == pytest.approx(PROFILE.power_w(1.0, "mixed", state.sm_mhz, 0.5))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 30.0), st.floats(0.0, 1.0),
                          st.sampled_from(["prefill", "decode"])), min_size=1, max_size=60),
       st.floats(20.0, 110.0))
def test_factors_are_slowdowns(steps: list[tuple[float, float, str]], temp: float) -> None:
    state = ThermalState(PROFILE, temp_c=temp)
    for dt, u, kind in steps:
        state.advance(dt, u, kind)
        assert state.sm_factor >= 1.0
        assert state.mem_factor >= 1.0
        assert PROFILE.min_mhz <= state.sm_mhz <= PROFILE.loaded_mhz
        if not state.slowdown:
            assert state.sm_mhz == PROFILE.loaded_mhz


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


def reference_advance(state: ThermalState, dt: float, u: float, kind: str,
                      share: float | None) -> tuple[float, ...]:
    """The model's step written with the profile's own functions (power_w, excess_w,
    hold_clock): what ThermalState.advance must give, to the last bit."""
    import math

    p = state.profile
    busy = u > 0
    sm = state._next_mhz if busy else p.loaded_mhz
    power = p.power_w(u, kind, sm, share)
    keep = math.exp(-dt / p.mix_tau_s)
    excess_sum = keep * state._excess_sum + (1 - keep) * p.excess_w(u, kind, share)
    weight_sum = keep * state._weight_sum + (1 - keep)
    target = p.ambient_c + p.r_c_per_w * power
    temp = target + (state.temp_c - target) * math.exp(-dt / p.tau_s)
    holding = state.holding
    if holding:
        temp = min(temp, max(p.slowdown_c, target))
    hold = p.hold_clock(excess_sum / weight_sum if weight_sum > 0 else 0.0)
    if temp >= p.slowdown_c - 1e-9:
        holding = True
    if hold >= p.loaded_mhz:
        holding = False
    nxt = hold if holding else p.loaded_mhz
    return (sm, power, temp, excess_sum, weight_sum, float(holding), nxt, p.loaded_mhz / nxt,
            max(1.0, p.mem_bound_floor_mhz / nxt))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.001, 30.0), st.sampled_from([0.0, 0.5, 1.0]),
                          st.sampled_from(["prefill", "decode", "mixed"]),
                          st.floats(0.0, 1.0)), min_size=1, max_size=80),
       st.floats(20.0, 110.0))
def test_advance_is_the_profiles_arithmetic_to_the_bit(
        steps: list[tuple[float, float, str, float]], temp: float) -> None:
    state = ThermalState(PROFILE, temp_c=temp)
    for dt, u, kind, share in steps:
        want = reference_advance(state, dt, u, kind, share if kind == "mixed" else None)
        state.advance(dt, u, kind, share if kind == "mixed" else None)
        got = (state.sm_mhz, state.power_w, state.temp_c, state._excess_sum,
               state._weight_sum, float(state.holding), state._next_mhz, state.sm_factor,
               state.mem_factor)
        assert got == want


def test_a_copy_moves_on_its_own() -> None:
    state = ThermalState(PROFILE)
    run(state, 300, 1.0)
    ahead = state.copy()
    assert [getattr(ahead, k) for k in STATE_FIELDS] == [
        getattr(state, k) for k in STATE_FIELDS]
    before = state.temp_c
    run(ahead, 600, 0.0)
    assert state.temp_c == before and ahead.temp_c < before
    run(state, 600, 0.0)
    assert (state.temp_c, state.sm_mhz, state.sm_factor) == (
        ahead.temp_c, ahead.sm_mhz, ahead.sm_factor)
