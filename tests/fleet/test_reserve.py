"""The learned prefill reserve (core/fleet/reserve.py) and the deadlines it moves
(admission.py, rule 5 of docs/fleet-core.md), and Retry-After before a drain window has been
observed (rule 7)."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.fleet.admission import AdmissionController, Decision, DrainRate, FleetRequest
from chatfleet.core.fleet.fleet import Fleet, FleetSettings, FleetTrace, replay
from chatfleet.core.fleet.reserve import ReserveEstimator, ReserveSettings
from chatfleet.core.fleet.routing import route_least_loaded

_ids = itertools.count()
LEARN = ReserveSettings(window_s=30.0, max_samples=100, percentile=99.0, min_samples=4,
                        min_s=0.0, max_s=0.5)


def req(arrival: float, rid: str | None = None, key: str | None = None) -> FleetRequest:
    return FleetRequest(rid or f"r{next(_ids)}", key, arrival)


def controller(caps: dict[str, int], depth: int = 10, budget: float = 1.0,
               **kw: Any) -> AdmissionController:
    kw.setdefault("reserve", LEARN)
    return AdmissionController(caps, depth, budget, route=route_least_loaded, **kw)


# --- the estimator --------------------------------------------------------------------------
def test_the_configured_reserve_holds_until_there_is_data_then_floors_thin_data() -> None:
    est = ReserveEstimator(0.2, LEARN, 0.5)
    assert est.value_s == 0.2 and len(est) == 0 and est.percentile_s() is None
    assert est.observe(0.05, 1.0) is False  # thin data: the prior is a floor
    assert est.value_s == 0.2
    assert est.observe(0.3, 1.1) is True  # above the prior: it counts at once
    assert est.percentile_s() == pytest.approx(0.05 + 0.99 * 0.25)  # 0.2975
    assert est.value_s == pytest.approx(0.30)  # up to a whole 10 ms
    est2 = ReserveEstimator(0.2, LEARN, 0.5)
    for i in range(4):  # min_samples reached: the data alone, even below the prior
        est2.observe(0.10 + 0.01 * i, float(i))
    assert est2.percentile_s() == pytest.approx(0.1297)
    assert est2.value_s == pytest.approx(0.13)


def test_the_percentile_is_linear_between_ranks() -> None:
    est = ReserveEstimator(0.0, ReserveSettings(percentile=50.0, min_samples=1), 0.5)
    for i, x in enumerate((0.4, 0.1, 0.3, 0.2)):
        est.observe(x, float(i))
    assert est.percentile_s() == pytest.approx(0.25)  # halfway between 0.2 and 0.3


def test_the_reserve_moves_in_whole_steps() -> None:
    """Rounded up to 10 ms: a percentile that moves within a step leaves the reserve (and the
    queue's deadlines) alone."""
    est = ReserveEstimator(0.0, ReserveSettings(min_samples=1, percentile=100.0), 0.5)
    assert est.observe(0.2, 0.0) is True and est.value_s == pytest.approx(0.2)
    assert est.observe(0.203, 1.0) is True and est.value_s == pytest.approx(0.21)
    assert est.observe(0.207, 2.0) is False and est.value_s == pytest.approx(0.21)
    fine = ReserveEstimator(0.0, ReserveSettings(min_samples=1, resolution_s=0.001), 0.5)
    fine.observe(0.2031, 0.0)
    assert fine.value_s == pytest.approx(0.204)


def test_the_reserve_is_bounded_above_and_below() -> None:
    est = ReserveEstimator(0.0, LEARN, 0.5)
    for i in range(10):
        est.observe(3.0, float(i))  # a stalled engine: seconds to the first byte
    assert est.value_s == 0.5
    assert ReserveSettings().ceiling_s(1.0) == 0.5 and ReserveSettings().ceiling_s(0.3) == 0.15
    low = ReserveEstimator(0.0, ReserveSettings(min_s=0.05, min_samples=1), 0.5)
    low.observe(0.001, 0.0)
    assert low.value_s == 0.05


def test_the_window_forgets_by_time_and_by_count() -> None:
    est = ReserveEstimator(0.0, ReserveSettings(window_s=10.0, max_samples=3, min_samples=1,
                                                percentile=100.0), 0.5)
    est.observe(0.4, 0.0)
    est.observe(0.1, 1.0)
    assert est.value_s == 0.4
    est.observe(0.1, 10.0)  # 0.0 is now a window old: gone
    assert len(est) == 2 and est.value_s == 0.1
    for t in (11.0, 12.0, 13.0):
        est.observe(0.2, t)
    assert len(est) == 3 and est.value_s == 0.2  # the count bound keeps the newest 3


def test_bad_reserve_settings_are_refused_with_a_reason() -> None:
    for bad in (ReserveSettings(window_s=0.0), ReserveSettings(percentile=0.0),
                ReserveSettings(percentile=101.0), ReserveSettings(min_samples=0),
                ReserveSettings(max_s=1.0), ReserveSettings(min_s=0.3, max_s=0.2),
                ReserveSettings(window_s=float("inf")), ReserveSettings(resolution_s=0.0),
                ReserveSettings(resolution_s=0.5)):
        with pytest.raises(ChatfleetError):
            controller({"a": 1}, reserve=bad)
    controller({"a": 1}, reserve=ReserveSettings(learn=False, max_s=5.0))  # unused: fine


# --- deadlines from the learned reserve -----------------------------------------------------
def test_a_queued_request_is_shed_when_its_first_token_would_miss_the_target() -> None:
    """Budget 1 s, no configured reserve. The replica took 0.3 s from admission to first byte
    for every request so far: a request queued at 0.0 must be admitted by 0.7, or its first
    token comes after 1.0. Without learning it waited until 1.0 (the issue's vLLM run: 15% of
    the admitted missed the target)."""
    ac = controller({"a": 1})
    for i in range(4):
        ac.offer(req(float(i)), float(i))
        ac.first_byte("a", float(i), i + 0.3)
        ac.release("a", i + 0.9)
    assert ac.reserve_s("a") == pytest.approx(0.3)
    ac.offer(req(10.0), 10.0)  # running
    waiting = req(10.0, rid="waiting")
    d = ac.offer(waiting, 10.0)[0]
    assert d.queued and d.deadline == pytest.approx(10.7)
    assert ac.next_deadline() == pytest.approx(10.7)
    assert only(ac.release("a", 10.75), "shed") == ["waiting"]
    fixed = controller({"a": 1}, reserve=ReserveSettings(learn=False))
    assert fixed.first_byte("a", 0.0, 0.3) == []  # not learning: no sample, no change
    assert fixed.reserve_s("a") == 0.0


def test_a_grown_reserve_moves_the_queued_deadlines_and_sheds_the_late_at_once() -> None:
    ac = controller({"a": 1}, reserve=ReserveSettings(min_samples=1, percentile=100.0,
                                                      max_s=0.5))
    ac.offer(req(0.0), 0.0)
    q = ac.offer(req(0.0, rid="q"), 0.0)[0]
    assert q.deadline == pytest.approx(1.0)
    assert ac.first_byte("a", 0.0, 0.1) == []  # 0.1: deadline 0.9, not yet past at 0.1
    assert ac.next_deadline() == pytest.approx(0.9)
    out = ac.first_byte("a", 0.1, 0.7)  # 0.6, bounded to 0.5: deadline 0.5 < now
    assert only(out, "shed") == ["q"] and out[0].reason == "deadline"


def test_each_replica_keeps_its_own_reserve() -> None:
    """A session waiting for its slow home is shed earlier than one waiting for the fast
    replica."""
    def home_of(key: str) -> str:
        return {"sid:slow": "a", "sid:fast": "b"}[key]

    ac = AdmissionController({"a": 1, "b": 1}, 10, 1.0, reserve=LEARN,
                             route=lambda r, view, now: home_of(r.session_key or ""))
    for i in range(4):
        ac.offer(FleetRequest(f"wa{i}", "sid:slow", float(i)), float(i))
        ac.offer(FleetRequest(f"wb{i}", "sid:fast", float(i)), float(i))
        ac.first_byte("b", float(i), i + 0.1)
        ac.first_byte("a", float(i), i + 0.4)
        ac.release("a", i + 0.5)
        ac.release("b", i + 0.5)
    assert ac.reserve_s("a") == pytest.approx(0.4) and ac.reserve_s("b") == pytest.approx(0.1)
    assert ac.reserve_s(None) == pytest.approx(0.4)  # no replica named: the largest
    ac.offer(FleetRequest("busy-a", "sid:slow", 10.0), 10.0)
    ac.offer(FleetRequest("busy-b", "sid:fast", 10.0), 10.0)
    slow = ac.offer(FleetRequest("slow", "sid:slow", 10.0), 10.0)[0]
    fast = ac.offer(FleetRequest("fast", "sid:fast", 10.0), 10.0)[0]
    assert slow.deadline == pytest.approx(10.6) and fast.deadline == pytest.approx(10.9)
    assert only(ac.expire(10.61), "shed") == ["slow"]
    assert only(ac.release("b", 10.8), "admitted") == ["fast"]


def test_a_retarget_to_a_slower_replica_past_its_deadline_is_shed_not_admitted() -> None:
    """Sessionless requests wait for the least loaded replica: with both full, the fast one
    (by name). When the slow one frees first, the request would go there, where its deadline
    (by the slow replica's reserve) has passed: shed, not admitted to miss the target."""
    ac = controller({"a": 1, "b": 1}, reserve=ReserveSettings(min_samples=1, percentile=100.0))
    ac.first_byte("a", 0.0, 0.05)
    ac.first_byte("b", 0.0, 0.45)
    ac.offer(req(1.0), 1.0)  # a
    ac.offer(req(1.0), 1.0)  # b
    d = ac.offer(req(1.0, rid="q"), 1.0)[0]
    assert d.queued and d.replica == "a" and d.deadline == pytest.approx(1.95)
    out = ac.release("b", 1.6)  # b frees: q's deadline there was 1.55
    assert only(out, "shed") == ["q"] and out[0].reason == "deadline"
    assert ac.can_admit("b") and ac.queue_depth() == 0


def only(decisions: list[Decision], outcome: str) -> list[str]:
    return [d.request.request_id for d in decisions if d.outcome == outcome]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 100_000), caps=st.lists(st.integers(1, 3), min_size=1, max_size=3))
def test_nobody_is_admitted_past_the_deadline_of_its_replica(seed: int,
                                                             caps: list[int]) -> None:
    """Random arrivals, first bytes, releases and expiries: every admission is within the
    deadline its replica's reserve gives at that moment, and every request ends once."""
    rng = random.Random(seed)
    names = [f"r{i}" for i in range(len(caps))]
    ac = controller(dict(zip(names, caps, strict=True)), depth=4,
                    reserve=ReserveSettings(min_samples=2, window_s=5.0, max_s=0.6))
    running: list[tuple[str, float, bool]] = []  # replica, admitted at, first byte seen
    ended: set[str] = set()
    offered = 0
    now = 0.0

    def take(ds: list[Decision]) -> None:
        for d in ds:
            if d.queued:
                continue
            assert d.request.request_id not in ended
            ended.add(d.request.request_id)
            if d.admitted:
                assert d.replica is not None
                assert d.at <= ac.deadline(d.request, d.replica) + 1e-12
                running.append((d.replica, d.at, False))

    for _ in range(120):
        now += rng.random() * 0.2
        op = rng.random()
        if op < 0.45:
            offered += 1
            take(ac.offer(req(now), now))
        elif op < 0.7 and running:
            i = rng.randrange(len(running))
            name, at, seen = running[i]
            if not seen:
                running[i] = (name, at, True)
                take(ac.first_byte(name, at, now))
        elif op < 0.9 and running:
            name, _, _ = running.pop(rng.randrange(len(running)))
            take(ac.release(name, now))
        else:
            take(ac.expire(now))
    now += 10.0
    take(ac.expire(now))
    while running:
        take(ac.release(running.pop()[0], now))
    assert len(ended) == offered and ac.queue_depth() == 0


# --- Retry-After before the drain rate is known ---------------------------------------------
def test_retry_after_in_the_first_second_is_not_twenty_seconds() -> None:
    """One request drained 0.5 s into the run, one is queued ahead: the 10 s window read
    0.1 completions/s and told the next client (1 + 1) / 0.1 = 20 s (the issue's vLLM run,
    15 clients). Counted from the first completion, a single completion knows no rate: the
    floor, 1 s."""
    ac = controller({"a": 2}, depth=1)
    ac.offer(req(0.0), 0.0)
    ac.offer(req(0.0), 0.0)
    ac.release("a", 0.5)
    ac.offer(req(0.6), 0.6)  # takes the slot
    ac.offer(req(0.7), 0.7)  # queued
    d = ac.offer(req(0.9), 0.9)[0]
    assert d.shed and d.reason == "queue_full"
    assert (d.retry_after_s, d.retry_after_ms) == (1, 1000)


def test_retry_after_early_in_a_run_counts_the_time_since_the_first_completion() -> None:
    """Answers take 5 s; completions start at 5.0 and come every 0.2 s (5 per second). At 5.5,
    two more came in the 0.5 s since the first: 4 per second. 15 ahead: 16 / 4 = 4 s (the
    window's count would say 3 / 10 = 0.3 per second: 53 s)."""
    drain = DrainRate(10.0)
    for t in (5.0, 5.2, 5.4):
        drain.observe(t)
    assert drain.rate(5.5) == pytest.approx(0.3)
    assert drain.rate_since_first(5.5) == pytest.approx(4.0)
    assert drain.rate_since_first(14.99) == pytest.approx(2 / 9.99)
    assert drain.rate_since_first(15.0) == drain.rate(15.0) == 0.2  # a window old: the window's
    assert DrainRate(10.0).rate_since_first(3.0) == 0.0


# --- through Fleet: traced, replayed ----------------------------------------------------------
class Flat:
    def recompute_s(self, tokens: int) -> float:
        return tokens / 1000


def test_first_bytes_are_traced_and_replay_to_the_same_decisions() -> None:
    settings_ = FleetSettings(queue_depth=4, ttft_budget_s=1.0, prefill_reserve_s=0.1,
                              reserve=ReserveSettings(min_samples=2))
    rng = random.Random(3)
    trace = FleetTrace()
    fleet = Fleet({"a": 1, "b": 2}, settings_, Flat(), trace)
    made: list[Decision] = []
    running: list[tuple[str, float]] = []
    now = 0.0
    for i in range(200):
        now += rng.random() * 0.15
        op = rng.random()
        if op < 0.5:
            ds = fleet.offer(FleetRequest(f"r{i}", f"sid:{rng.randrange(6)}", now), now)
        elif op < 0.75 and running:
            name, at = running[rng.randrange(len(running))]
            ds = fleet.first_byte(name, at, now)
        elif op < 0.95 and running:
            ds = fleet.release(running.pop(rng.randrange(len(running)))[0], now)
        else:
            ds = fleet.expire(now)
        running += [(d.replica, d.at) for d in ds if d.admitted and d.replica is not None]
        made += ds
    assert any(name == "first_byte" for _, name, _, _ in trace.calls)
    assert fleet.ac.reserve_s("a") != 0.1 or fleet.ac.reserve_s("b") != 0.1
    again = replay(trace, {"a": 1, "b": 2}, settings_, Flat())
    assert [(d.request.request_id, d.outcome, d.replica, d.reason) for d in again] == [
        (d.request.request_id, d.outcome, d.replica, d.reason) for d in made]
