"""The thermal model through the twin: the L4 profile's fit reproduces the L4 overload
measurement (1,320 -> 465 MHz, 70% of samples in slowdown) in the run it names, the twin sweep
at its defaults; the engine's prefill shares the fit takes are the twin's own; the cooling a
load asks for (core/engine/thermal.cooling_need) lets the FP8 knee hold its clock."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.core.calibration import (
    L4_OVERLOAD_RUN,
    L4_OVERLOAD_SETTLED_MHZ,
    L4_OVERLOAD_SLOWDOWN_SHARE,
    ThermalProfile,
    fit_l4_thermal,
    thermal_profile,
)
from chatfleet.core.documents.sweep import OpenLoad, SweepPoint
from chatfleet.core.engine.build import EngineSpec, build_engine
from chatfleet.core.engine.protocol import EngineModel
from chatfleet.core.engine.step import StepKind
from chatfleet.core.engine.steplog import StepLog, StepRow
from chatfleet.core.engine.thermal import ThermalState, cooling_need
from chatfleet.core.measure.percentiles import time_weighted_percentile
from chatfleet.core.specs import get_gpu
from chatfleet.core.workload import WorkloadConfig
from chatfleet.twin.run import gpu_block, run_point, step_weights
from tests.twin.conftest import closed, engine

L4 = get_gpu("l4")
OPEN = OpenLoad(L4_OVERLOAD_RUN.rate_rps, "poisson", 1.0)


def overload_point(spec: EngineSpec) -> SweepPoint:
    run = L4_OVERLOAD_RUN
    return run_point(spec, WorkloadConfig(), OPEN, duration_s=run.duration_s,
                     warmup_s=run.warmup_s, seed=1).point


class PinnedClock(ThermalState):
    """A card held at one clock: what the engine does at that clock, whatever the heat."""

    def __init__(self, profile: ThermalProfile, mhz: float) -> None:
        super().__init__(profile)
        self.sm_mhz = mhz
        self.sm_factor = profile.loaded_mhz / mhz
        self.mem_factor = max(1.0, profile.mem_bound_floor_mhz / mhz)

    def advance(self, dt: float, utilization: float, kind: str = "prefill",
                prefill_share: float | None = None) -> None:
        self.slowdown = False


def test_twin_sweep_defaults_reproduce_the_overload_measurement() -> None:
    """`chatfleet twin sweep --concurrency '' --rate 4 --thermal`, the run the fit names,
    from the CLI with its defaults: BF16 throttles as the measured L4 did."""
    res = CliRunner().invoke(app, ["twin", "sweep", "--concurrency", "", "--rate",
                                   str(L4_OVERLOAD_RUN.rate_rps), "--thermal", "--print-json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["target"]["weights"] == L4_OVERLOAD_RUN.weights
    assert doc["workload"]["duration_s"] == L4_OVERLOAD_RUN.duration_s
    assert doc["workload"]["warmup_s"] == L4_OVERLOAD_RUN.warmup_s
    expected = WorkloadConfig().to_json()
    assert {k: doc["workload"][k] for k in expected} == expected
    gpu = doc["points"][0]["gpu"]
    assert gpu["busy_share"] == pytest.approx(1.0, abs=0.01)  # an overload: never idle
    assert gpu["sm_clock_mhz"]["p50"] <= 800
    assert gpu["thermal_slowdown_share"] >= 0.5
    assert gpu["sm_clock_mhz"]["p50"] == pytest.approx(L4_OVERLOAD_SETTLED_MHZ, rel=0.08)
    assert gpu["thermal_slowdown_share"] == pytest.approx(L4_OVERLOAD_SLOWDOWN_SHARE, abs=0.03)


@pytest.mark.parametrize("ratio", [0.4, 0.85])
def test_the_fit_reproduces_the_overload_in_the_twin_for_another_ratio(ratio: float) -> None:
    gpu = overload_point(engine("bf16", thermal=True, cooling=fit_l4_thermal(ratio))).gpu
    assert gpu.sm_clock_mhz.p50 == pytest.approx(L4_OVERLOAD_SETTLED_MHZ, rel=0.08)
    assert gpu.thermal_slowdown_share == pytest.approx(L4_OVERLOAD_SLOWDOWN_SHARE, abs=0.03)


@pytest.mark.parametrize(("mhz", "share"), [
    (1320.0, L4_OVERLOAD_RUN.prefill_share_loaded),
    (L4_OVERLOAD_SETTLED_MHZ, L4_OVERLOAD_RUN.prefill_share_settled),
])
def test_overload_prefill_shares_are_the_twins(monkeypatch: pytest.MonkeyPatch, mhz: float,
                                               share: float) -> None:
    """The shares of busy time in prefill the fit takes (calibration.L4_OVERLOAD_RUN) are
    what the twin's overload run does with the clock held there."""
    import chatfleet.twin.run as twin_run

    def pinned(spec: EngineSpec) -> EngineModel:
        sched = build_engine(spec)
        sched.thermal = PinnedClock(thermal_profile(spec.gpu), mhz)
        return sched

    monkeypatch.setattr(twin_run, "build_engine", pinned)
    gpu = overload_point(engine("bf16", thermal=True)).gpu
    assert gpu.modelled.prefill_share == pytest.approx(share, abs=0.01)


def test_the_fp8_knee_holds_its_clock_with_the_cooling_it_asks_for() -> None:
    """FP8 at 24 users (its knee), twin sweep defaults: under the fitted cooling it throttles
    like the overload (the same mix of prefill and decode); with the thermal resistance
    cooling_need names for its mix it holds its clock and its attainment."""
    duration = 900.0  # over three time constants: the card is near its steady temperature
    off = closed(engine("fp8"), 24, duration=duration).point
    need = cooling_need(thermal_profile(L4), off.gpu.modelled.busy_share,
                        off.gpu.modelled.prefill_share)
    assert not need.holds_clock
    hot = closed(engine("fp8", thermal=True), 24, duration=duration).point
    assert hot.gpu.thermal_slowdown_share > 0.5
    better = replace(thermal_profile(L4), r_c_per_w=0.97 * need.max_r_c_per_w)
    held = closed(engine("fp8", thermal=True, cooling=better), 24, duration=duration).point
    assert held.gpu.thermal_slowdown_share == 0.0
    assert held.gpu.sm_clock_mhz.p50 >= 1000
    assert held.gpu.temp_c.max < better.slowdown_c
    assert held.attainment == pytest.approx(off.attainment, abs=0.05)
    assert hot.attainment < off.attainment - 0.05


def test_gpu_block_weights_steps_by_time_in_the_window() -> None:
    def row(t: float, kind: StepKind, mhz: float, slow: bool, d: float) -> StepRow:
        return StepRow(t, kind, 1, 0, 0, 0, 0, 0.0, 0.0, mhz, 80.0, 50.0, slow, d)

    log = [row(1.0, "prefill", 1320.0, False, 1.0),  # before the window: left out
           row(13.0, "prefill", 500.0, True, 3.0),  # 10..13: fully inside
           row(14.0, "decode", 1320.0, False, 1.0),
           row(21.0, "decode", 400.0, True, 2.0)]  # 19..21: half inside
    steps, weights = step_weights(StepLog(log), 10.0, 20.0)
    assert steps.tolist() == [1, 2, 3] and weights.tolist() == [3.0, 1.0, 1.0]
    # the value below which half the time lies: 400 for 1 s, 500 for 3 s, 1,320 for 1 s
    assert time_weighted_percentile([log[i].sm_clock_mhz or 0.0 for i in steps.tolist()],
                                    weights.tolist(), 50.0) == 500.0
    sched = build_engine(engine("bf16", thermal=True))
    sched.log = StepLog(log)
    gpu = gpu_block(engine("bf16", thermal=True), [sched], 10.0, 20.0)
    assert gpu.modelled.busy_share == pytest.approx(0.5)
    assert gpu.modelled.prefill_share == pytest.approx(0.6)
    assert gpu.thermal_slowdown_share == pytest.approx(0.8)
    assert gpu.sm_clock_mhz.to_json() == {"p50": 500.0, "min": 400.0}


def test_a_light_load_leaves_the_card_idle_part_of_the_time() -> None:
    light = closed(engine("fp8"), 1, WorkloadConfig(turns=4, think_time_s=10.0),
                   duration=120.0).point.gpu
    busy = closed(engine("fp8"), 24, duration=120.0).point.gpu
    assert 0.0 < light.modelled.busy_share < 0.5
    assert busy.modelled.busy_share == pytest.approx(1.0, abs=0.01)
    assert 0.0 < light.modelled.prefill_share < 1.0
    assert light.modelled.power_w.at_loaded_clock < busy.modelled.power_w.at_loaded_clock
