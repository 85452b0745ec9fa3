"""The twin's event loop and runner."""

from __future__ import annotations

import gc

import pytest

from chatfleet.core.documents.sweep import ClosedLoad, OpenLoad
from chatfleet.core.engine.scheduler import Scheduler
from chatfleet.core.engine.steplog import StepRow
from chatfleet.core.engine.vllm_scheduler import VLLMScheduler
from chatfleet.core.workload import WorkloadConfig
from chatfleet.twin.loop import EventLoop
from chatfleet.twin.run import PointRun, run_point
from tests.twin.conftest import MIXED, engine


def test_handlers_return_events_and_only_the_loop_moves_time() -> None:
    loop = EventLoop()
    seen: list[tuple[str, float]] = []

    def tick(name: str, now: float) -> list:
        seen.append((name, now))
        return [loop.at(now + 1.0, tick, name)] if now < 2.0 else []

    loop.push([loop.at(0.0, tick, "a"), loop.at(0.5, tick, "b")])
    loop.run()
    assert seen == [("a", 0.0), ("b", 0.5), ("a", 1.0), ("b", 1.5), ("a", 2.0), ("b", 2.5)]


def test_the_collector_is_paused_while_the_loop_runs_and_restored_after() -> None:
    loop = EventLoop()
    seen: list[bool] = []

    def probe(_: object, now: float) -> list:
        seen.append(gc.isenabled())
        return []

    loop.push([loop.at(1.0, probe)])
    assert gc.isenabled()
    loop.run()
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        loop.push([loop.at(2.0, probe)])
        loop.run()
        assert not gc.isenabled()  # left as the caller had it
    finally:
        gc.enable()


def test_an_event_in_the_past_is_refused() -> None:
    loop = EventLoop()

    def back(_: object, now: float) -> list:
        return [loop.at(now - 1.0, back)]

    loop.push([loop.at(1.0, back)])
    with pytest.raises(ValueError, match="past"):
        loop.run()


def test_decode_runs_give_exactly_what_single_steps_give(monkeypatch: pytest.MonkeyPatch) -> None:
    """The twin runs consecutive decode steps as one event when nothing can happen between
    them; the records must not change by a single token time."""
    spec = engine("fp8")
    wcfg = WorkloadConfig(lengths=MIXED, turns=2, think_time_s=2.0)
    load = ClosedLoad(48)
    fast = run_point(spec, wcfg, load, duration_s=120.0, warmup_s=0.0, seed=7)
    original = Scheduler.schedule
    monkeypatch.setattr(Scheduler, "schedule",
                        lambda self, now, horizon=None: original(self, now, None))
    slow = run_point(spec, wcfg, load, duration_s=120.0, warmup_s=0.0, seed=7)
    assert fast.num_events < slow.num_events
    a = {r.request_id: r for r in fast.records}
    b = {r.request_id: r for r in slow.records}
    assert a.keys() == b.keys()
    for rid, r in a.items():
        assert list(r.token_times) == list(b[rid].token_times), rid
        assert r.cached_tokens == b[rid].cached_tokens


@pytest.mark.parametrize("model", ["sglang", "vllm"])
@pytest.mark.parametrize(("thermal", "drain_s"), [(False, 4.0), (True, 600.0), (True, 4.0)])
def test_decode_runs_give_what_single_steps_give_with_the_thermal_model_and_a_short_drain(
        monkeypatch: pytest.MonkeyPatch, model: str, thermal: bool, drain_s: float) -> None:
    """With the thermal model on, a run steps a copy of the card's state along (each step at
    the clock the one before left); a run never takes a step that ends after the loop's stop
    time, which single steps would never complete. Records, the step log and the point are
    those of single steps."""
    spec = engine("bf16", engine_model=model, thermal=thermal)
    wcfg = WorkloadConfig(lengths=MIXED)
    load = ClosedLoad(24)

    def point() -> tuple[PointRun, list[StepRow]]:
        run = run_point(spec, wcfg, load, duration_s=240.0, warmup_s=10.0, drain_s=drain_s,
                        seed=3)
        return run, list(run.scheduler.log)

    (fast, fast_log) = point()
    cls = VLLMScheduler if model == "vllm" else Scheduler
    original = cls.schedule
    monkeypatch.setattr(cls, "schedule", lambda self, now, horizon=None: original(self, now))
    (slow, slow_log) = point()
    assert fast.num_events < slow.num_events
    assert [r.token_times for r in fast.records] == [r.token_times for r in slow.records]
    assert [r.outcome for r in fast.records] == [r.outcome for r in slow.records]
    assert fast_log == slow_log
    assert fast.point == slow.point
    if thermal:
        assert fast.point.gpu.thermal_slowdown_share > 0
    if drain_s < 60:
        assert any(r.outcome == "timeout" and r.token_times for r in fast.records)


def test_same_seed_same_point_and_a_new_seed_changes_it() -> None:
    spec = engine("bf16")
    wcfg = WorkloadConfig(lengths=MIXED)
    load = ClosedLoad(8)
    p1 = run_point(spec, wcfg, load, duration_s=60.0, warmup_s=10.0, seed=3).point
    p2 = run_point(spec, wcfg, load, duration_s=60.0, warmup_s=10.0, seed=3).point
    p3 = run_point(spec, wcfg, load, duration_s=60.0, warmup_s=10.0, seed=4).point
    assert p1 == p2
    assert p1.ttft_ms != p3.ttft_ms


def test_open_loop_point_counts_requests_from_the_schedule() -> None:
    spec = engine("fp8")
    run = run_point(spec, WorkloadConfig(lengths=MIXED), OpenLoad(1.0),
                    duration_s=300.0, warmup_s=30.0, seed=2)
    offered = run.point.requests.offered
    assert 240 <= offered <= 360  # Poisson at 1/s over 300 s
    assert run.point.load == OpenLoad(1.0)


def test_replicas_split_users_and_each_engine_sees_its_share() -> None:
    spec = engine("fp8")
    run = run_point(spec, WorkloadConfig(lengths=MIXED), ClosedLoad(32),
                    duration_s=60.0, warmup_s=10.0, replicas=4)
    assert {r.replica for r in run.records} == {f"twin-{i}" for i in range(4)}
    assert run.point.engine.max_running == 8
    assert run.point.in_flight_max == 8


def test_a_session_longer_than_the_pool_is_refused_up_front() -> None:
    spec = engine("bf16", pool_tokens=2600)  # one request needs 2,048 + 512 + 128
    with pytest.raises(ValueError, match="KV pool"):
        run_point(spec, WorkloadConfig(), ClosedLoad(1), duration_s=10.0)


def test_the_twins_throughput_counts_arrivals_in_the_window_over_every_record() -> None:
    """Both twin runners (one engine, and a fleet) count output tok/s and the request rate
    the way the live sweep does: tokens that arrive in the window and the ok requests' shares
    of them, from requests sent before the window too; not the tokens of the window's
    requests."""
    from chatfleet.core.measure.point import arrivals_in_window
    from chatfleet.core.workload import LengthSpec
    from chatfleet.twin.fleet import FleetConfig, run_fleet_point

    wcfg = WorkloadConfig(lengths=LengthSpec("fixed", 512, 128))  # waves
    load = ClosedLoad(16)
    window = (10.0, 70.0)
    runs = [run_point(engine("fp8"), wcfg, load, duration_s=60.0, warmup_s=10.0),
            run_fleet_point(engine("fp8"), wcfg, load, FleetConfig(replicas=1, cap=64),
                            duration_s=60.0, warmup_s=10.0)]
    for run in runs:
        arrived = arrivals_in_window(run.records, window)
        tokens = arrived.tokens
        assert run.point.output_tok_s == pytest.approx(tokens / 60.0)
        assert run.point.request_rps == pytest.approx(
            sum(share for _, share in arrived.shares) / 60.0)
        assert run.point.request_rps == pytest.approx(tokens / 128 / 60.0)  # all answers whole
        assert run.point.requests.finished_in_window == arrived.finished
        sent = [r for r in run.records if window[0] <= r.send_time < window[1]]
        assert any(r.send_time < window[0] and r.token_times[-1] >= window[0]
                   for r in run.records)  # a wave sent in the warm-up streams into it
        assert tokens != sum(r.output_tokens for r in sent)
