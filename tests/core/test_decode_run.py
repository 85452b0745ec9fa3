"""Decode runs (core/engine/decode_run.py): how far a run goes and what it times."""

from __future__ import annotations

from chatfleet.core.calibration import thermal_profile
from chatfleet.core.engine.decode_run import advance_thermal, run_ends
from chatfleet.core.engine.step import Step
from chatfleet.core.engine.steplog import KINDS, NO_THERMAL, StepLog, StepRow
from chatfleet.core.engine.thermal import STATE_FIELDS, ThermalState
from chatfleet.core.specs import get_gpu


def eighth(batch: int, kv_tokens: int, sm: float, mem: float) -> float:
    """1/8 s per step at the loaded clock (sums exact in binary), slower by the memory
    factor."""
    return 0.125 * mem


def test_a_run_takes_no_step_past_the_horizon_but_always_its_first() -> None:
    assert run_ends(eighth, 4, 100, 0.0, 50, 0.4, None) == [0.125, 0.25, 0.375]  # 0.5 > 0.4
    assert run_ends(eighth, 4, 100, 0.0, 50, 0.05, None) == [0.125]
    assert run_ends(eighth, 4, 100, 0.0, 50, 0.375, None) == [0.125, 0.25, 0.375]


def test_a_run_stops_at_the_first_step_that_reaches_until_and_at_max_steps() -> None:
    assert run_ends(eighth, 4, 100, 0.0, 50, 9.0, None, until=0.3) == [0.125, 0.25, 0.375]
    assert run_ends(eighth, 4, 100, 0.0, 50, 9.0, None, until=0.25) == [0.125, 0.25]
    assert len(run_ends(eighth, 4, 100, 0.0, 5, 9.0, None)) == 5


def test_the_context_grows_by_the_batch_every_step() -> None:
    seen: list[int] = []

    def step(batch: int, kv_tokens: int, sm: float, mem: float) -> float:
        seen.append(kv_tokens)
        return 0.01

    run_ends(step, 3, 10, 0.0, 4, 9.0, None)
    assert seen == [10, 13, 16, 19]


def test_with_the_thermal_model_each_step_runs_at_the_clock_the_last_one_left() -> None:
    profile = thermal_profile(get_gpu("l4"))
    hot = ThermalState(profile, temp_c=profile.slowdown_c + 5.0)
    for _ in range(100):  # a card held at its slowdown point: the clock moves every step
        hot.advance(0.5, 1.0, "decode")
    start = hot.copy()
    ends = run_ends(eighth, 8, 1000, 10.0, 40, 1e9, hot)
    # the state handed in is not moved; single steps, one by one, give the same times
    assert [getattr(hot, k) for k in STATE_FIELDS] == [
        getattr(start, k) for k in STATE_FIELDS]
    single, t = [], 10.0
    for _ in range(40):
        t += eighth(8, 0, start.sm_factor, start.mem_factor)
        single.append(t)
        start.advance(single[-1] - (single[-2] if len(single) > 1 else 10.0), 1.0, "decode")
    assert ends == single
    # completing the run steps the real state as single steps did
    figures = advance_thermal(hot, Step("decode", 10.0, ends[-1] - 10.0, num_decode=8,
                                        decode_ends=ends), ends[-1])
    assert len(figures) == 40 and figures[-1][:2] == (start.sm_mhz, start.temp_c)
    assert len({f[0] for f in figures}) > 1  # the clock did move along the run


def test_the_step_log_keeps_a_run_by_column_and_gives_it_back_by_row() -> None:
    log = StepLog()
    log.add(1.0, "prefill", 2, 900, 0, 2, 1, 0.25, 0.5, NO_THERMAL, 1.0)
    log.add_run(1.0, [1.25, 1.5, 1.75], "decode", 2, 0, 2, 2, 0, [0.3, 0.31, 0.32], 0.5,
                [NO_THERMAL] * 3)
    log.add_run(2.0, [2.5, 3.0], "mixed", 3, 100, 2, 3, 0, [0.4, 0.41], 0.6,
                [(900.0, 80.0, 60.0, True), (890.0, 81.0, 61.0, True)])
    assert len(log) == 6
    assert log[0] == StepRow(1.0, "prefill", 2, 900, 0, 2, 1, 0.25, 0.5, None, None, None,
                             False, 1.0)
    assert log[2] == StepRow(1.5, "decode", 2, 0, 2, 2, 0, 0.31, 0.5, None, None, None, False,
                             0.25)
    assert log[4] == StepRow(2.5, "mixed", 3, 100, 2, 3, 0, 0.4, 0.6, 900.0, 80.0, 60.0, True,
                             0.5)
    assert log[-1] == StepRow(3.0, "decode", 2, 0, 2, 3, 0, 0.41, 0.6, 890.0, 81.0, 61.0, True,
                              0.5)
    assert [r.time for r in log] == log.floats("time").tolist() == [1.0, 1.25, 1.5, 1.75, 2.5,
                                                                    3.0]
    assert log.ints("kind").tolist() == [KINDS.index(r.kind) for r in log]
    again = StepLog(list(log))
    again.extend(log)
    assert list(again) == list(log) * 2
