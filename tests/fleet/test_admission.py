"""Admission: caps, the one queue, deadlines, Retry-After from the drain rate, priority for
returning sessions, hot cap changes, replicas joining and leaving."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.fleet.admission import (
    AdmissionController,
    Decision,
    DrainRate,
    FleetRequest,
    FleetView,
    retry_after,
)
from chatfleet.core.fleet.routing import route_least_loaded

_ids = itertools.count()


def req(arrival: float = 0.0, returning: bool = False, rid: str | None = None) -> FleetRequest:
    return FleetRequest(rid or f"r{next(_ids)}", None, arrival, returning=returning)


def controller(caps: dict[str, int], depth: int = 10, budget: float = 100.0,
               **kw: Any) -> AdmissionController:
    return AdmissionController(caps, depth, budget, route=route_least_loaded, **kw)


def only(decisions: list[Decision], outcome: str) -> list[str]:
    return [d.request.request_id for d in decisions if d.outcome == outcome]


# --- caps ----------------------------------------------------------------------------------------
def test_admits_up_to_the_caps_then_queues() -> None:
    ac = controller({"a": 3, "b": 2})
    decisions = [ac.offer(req(), 0.0)[0] for _ in range(8)]
    assert [d.outcome for d in decisions] == ["admitted"] * 5 + ["queued"] * 3
    assert (ac.in_flight("a"), ac.in_flight("b"), ac.queue_depth()) == (3, 2, 3)
    # least-loaded with ties by name: a, b, a, b, a
    assert [d.replica for d in decisions[:5]] == ["a", "b", "a", "b", "a"]


def test_release_admits_the_head_of_the_queue() -> None:
    ac = controller({"a": 1})
    first, second, third = req(rid="first"), req(rid="second"), req(rid="third")
    for r in (first, second, third):
        ac.offer(r, 0.0)
    out = ac.release("a", 1.0)
    assert only(out, "admitted") == ["second"]
    assert out[0].replica == "a" and out[0].at == 1.0
    assert ac.queued_requests() == [third]


def test_release_without_anything_in_flight_is_an_error() -> None:
    ac = controller({"a": 1})
    with pytest.raises(ValueError):
        ac.release("a", 0.0)


def test_cancel_drops_a_queued_request() -> None:
    ac = controller({"a": 1})
    ac.offer(req(), 0.0)
    ac.offer(req(rid="gone"), 0.0)
    assert ac.cancel("gone") and not ac.cancel("gone")
    assert ac.release("a", 1.0) == []
    assert ac.num_cancelled == 1


def test_a_queued_request_id_cannot_be_offered_twice() -> None:
    ac = controller({"a": 1})
    ac.offer(req(), 0.0)
    ac.offer(req(rid="dup"), 0.0)
    with pytest.raises(ValueError):
        ac.offer(req(rid="dup"), 0.0)


# --- the property: random arrivals, completions, cap changes ------------------------------------
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.booleans(), st.floats(0.0, 0.5)),
        st.tuples(st.just("release"), st.integers(0, 10), st.floats(0.0, 0.5)),
        st.tuples(st.just("cap"), st.tuples(st.integers(0, 2), st.integers(0, 4)),
                  st.floats(0.0, 0.5)),
        st.tuples(st.just("fail"), st.integers(0, 10), st.floats(0.0, 0.5)),
    ),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(ops=OPS, caps=st.lists(st.integers(0, 4), min_size=1, max_size=3),
       depth=st.integers(0, 6), priority=st.booleans())
def test_random_orders_keep_every_invariant(ops: list[tuple[str, Any, float]],
                                            caps: list[int], depth: int,
                                            priority: bool) -> None:
    names = [f"r{i}" for i in range(len(caps))]
    ac = controller(dict(zip(names, caps, strict=True)), depth=depth, budget=2.0,
                    prioritize_returning=priority)
    now = 0.0
    final: dict[str, Decision] = {}
    offered: list[FleetRequest] = []
    admitted_order: list[FleetRequest] = []
    running: list[tuple[FleetRequest, str]] = []  # admitted, not yet released or failed
    requeued: set[str] = set()
    num_failed = 0

    def apply(decisions: Iterable[Decision], before: dict[str, int],
              queued_before: list[FleetRequest]) -> None:
        decisions = list(decisions)
        for d in decisions:
            if d.outcome == "queued":
                continue
            assert d.request.request_id not in final, "a request ended twice"
            final[d.request.request_id] = d
            if d.admitted:
                assert d.at <= ac.deadline(d.request), "admitted past its deadline"
                admitted_order.append(d.request)
                running.append((d.request, d.replica or ""))
            else:
                assert d.retry_after_s is not None and d.retry_after_s >= 1
                assert d.retry_after_ms is not None
                assert (d.retry_after_s - 1) * 1000 < d.retry_after_ms <= d.retry_after_s * 1000
        for r in names:
            # a call never takes a replica above its cap (a lowered cap only stops admissions)
            assert ac.in_flight(r) <= max(ac.cap(r), before[r])
        # work-conserving: nothing waits while a replica it may go to has room (a requeued
        # request never goes back to the replica it failed on)
        for q in ac.queued_requests():
            assert not any(ac.can_admit(r) for r in names if r != ac.avoids(q.request_id))
        # returning sessions go first: no new-session request was admitted from the queue
        # while a returning one that was already waiting is still waiting
        if priority:
            still = {q.request_id for q in ac.queued_requests()}
            waiting_returning = [q for q in queued_before if q.returning
                                 and q.request_id in still]
            from_queue = [d.request for d in decisions if d.admitted
                          and d.request in queued_before]
            assert not (waiting_returning and any(not q.returning for q in from_queue))

    for op, arg, dt in ops:
        now += dt
        before = {r: ac.in_flight(r) for r in names}
        queued_before = ac.queued_requests()
        if op == "offer":
            r = req(now, returning=bool(arg))
            offered.append(r)
            apply(ac.offer(r, now), before, queued_before)
        elif op == "release":
            if running:
                _, where = running.pop(arg % len(running))
                apply(ac.release(where, now), before, queued_before)
        elif op == "fail":  # failed before its first byte: placed again
            if running:
                failed, where = running.pop(arg % len(running))
                num_failed += 1
                del final[failed.request_id]
                requeued.add(failed.request_id)
                out = ac.requeue(failed, where, now)
                assert out[0].request == failed and out[0].replica != where
                apply(out, before, queued_before)
        else:
            which, cap = arg
            apply(ac.set_cap(names[which % len(names)], cap, now), before, queued_before)

    # drain: past every deadline, then finish everything running
    now += 10.0
    apply(ac.expire(now), {r: ac.in_flight(r) for r in names}, ac.queued_requests())
    while running:
        apply(ac.release(running.pop()[1], now), {n: ac.in_flight(n) for n in names}, [])
    assert all(ac.in_flight(r) == 0 for r in names)
    assert ac.queue_depth() == 0
    assert set(final) == {r.request_id for r in offered}, "every request ends admitted or shed"
    # FCFS within a class (sessionless requests, least-loaded route: any slot fits anyone),
    # requeued ones aside (they go ahead of their class)
    for classes in ([True], [False]) if priority else ([True, False],):
        order = [offered.index(r) for r in admitted_order
                 if r.returning in classes and r.request_id not in requeued]
        assert order == sorted(order)
    assert ac.num_admitted + sum(ac.num_shed.values()) == len(offered) + ac.num_requeued
    assert ac.num_requeued == num_failed


# --- deadlines -----------------------------------------------------------------------------------
def test_a_request_past_its_deadline_is_shed_never_admitted() -> None:
    ac = controller({"a": 1}, budget=1.0)
    ac.offer(req(0.0), 0.0)
    late = req(0.2, rid="late")
    queued = ac.offer(late, 0.2)[0]
    assert queued.queued and queued.deadline == pytest.approx(1.2)
    assert ac.next_deadline() == pytest.approx(1.2)
    assert ac.expire(1.2) == []  # at the deadline it may still go
    shed = ac.expire(1.3)
    assert only(shed, "shed") == ["late"]
    assert shed[0].reason == "deadline" and shed[0].retry_after_s == 1  # nothing drained yet
    assert ac.release("a", 1.5) == []


def test_release_skips_and_sheds_the_expired() -> None:
    ac = controller({"a": 1}, budget=1.0)
    ac.offer(req(0.0), 0.0)
    ac.offer(req(0.0, rid="old"), 0.0)
    ac.offer(req(0.5, rid="young"), 0.5)
    out = ac.release("a", 1.2)
    assert only(out, "shed") == ["old"] and only(out, "admitted") == ["young"]


def test_prefill_reserve_moves_the_deadline_earlier() -> None:
    ac = controller({"a": 1}, budget=1.0, prefill_reserve_s=0.19)
    ac.offer(req(0.0), 0.0)
    d = ac.offer(req(0.0), 0.0)[0]
    assert d.deadline == pytest.approx(0.81)
    assert only(ac.expire(0.82), "shed") == [d.request.request_id]


def test_a_request_already_past_its_deadline_is_shed_on_arrival() -> None:
    ac = controller({"a": 1}, budget=1.0)
    d = ac.offer(req(0.0), 1.5)[0]
    assert d.shed and d.reason == "deadline" and ac.in_flight("a") == 0


def test_bad_budget_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        controller({"a": 1}, budget=1.0, prefill_reserve_s=1.0)
    with pytest.raises(ValueError):
        controller({"a": -1})


# --- Retry-After ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("ahead", "rate", "expected"), [
    (5, 2.0, (3, 3000)),  # 6 / 2 = 3 s exactly
    (2, 0.8, (4, 3750)),  # 3 / 0.8 = 3.75 s: 4 whole seconds, 3,750 ms
    (3, 3.0, (2, 1334)),  # 4 / 3 = 1.333.. s: ms rounded up, seconds rounded up
    (0, 10.0, (1, 1000)),  # 0.1 s: the 1 s floor
    (500, 2.0, (60, 60000)),  # 250.5 s: the 60 s ceiling
    (3, 0.0, (1, 1000)),  # nothing drained: the floor (ask again soon)
])
def test_retry_after_hand_cases(ahead: int, rate: float, expected: tuple[int, int]) -> None:
    assert retry_after(ahead, rate) == expected


@settings(max_examples=300, deadline=None)
@given(ahead=st.integers(0, 10_000), rate=st.floats(0.0, 1000.0))
def test_retry_after_seconds_and_ms_agree_within_bounds(ahead: int, rate: float) -> None:
    seconds, ms = retry_after(ahead, rate)
    assert 1 <= seconds <= 60 and 1000 <= ms <= 60_000
    assert (seconds - 1) * 1000 < ms <= seconds * 1000


def test_drain_rate_is_a_sliding_window() -> None:
    drain = DrainRate(10.0)
    for t in (1.0, 2.0, 3.0):
        drain.observe(t)
    assert drain.rate(5.0) == pytest.approx(0.3)
    assert drain.rate(11.5) == pytest.approx(0.2)  # (1.5, 11.5] holds 2 and 3
    assert drain.rate(13.0) == 0.0


def test_retry_after_from_the_observed_drain_rate() -> None:
    """20 completions in the last 10 s: 2 per second. The queue holds 5: the next arrival is
    shed with (5 + 1) / 2 = 3 s."""
    ac = controller({"a": 20}, depth=5)
    for _ in range(20):
        ac.offer(req(0.0), 0.0)
    for k in range(1, 21):
        ac.release("a", 0.5 * k)  # 0.5 .. 10.0 s
    assert ac.drain_rate(None, 10.0) == pytest.approx(2.0)
    assert ac.drain_rate("a", 10.0) == pytest.approx(2.0)
    for _ in range(25):
        ac.offer(req(10.0), 10.0)
    assert ac.queue_depth() == 5
    d = ac.offer(req(10.0), 10.0)[0]
    assert d.shed and d.reason == "queue_full"
    assert (d.retry_after_s, d.retry_after_ms) == (3, 3000)


# --- returning sessions first --------------------------------------------------------------------
def test_returning_sessions_go_ahead_of_new_ones() -> None:
    ac = controller({"a": 1})
    ac.offer(req(), 0.0)
    for r in (req(rid="new1"), req(rid="new2"), req(returning=True, rid="back")):
        ac.offer(r, 0.0)
    assert [q.request_id for q in ac.queued_requests()] == ["back", "new1", "new2"]
    admitted = [only(ac.release("a", t), "admitted") for t in (1.0, 2.0, 3.0)]
    assert admitted == [["back"], ["new1"], ["new2"]]


def test_without_priority_the_queue_is_plain_fcfs() -> None:
    ac = controller({"a": 1}, prioritize_returning=False)
    ac.offer(req(), 0.0)
    for r in (req(rid="new1"), req(returning=True, rid="back")):
        ac.offer(r, 0.0)
    assert only(ac.release("a", 1.0), "admitted") == ["new1"]


def test_a_returning_session_displaces_the_newest_new_one_from_a_full_queue() -> None:
    ac = controller({"a": 1}, depth=2)
    ac.offer(req(), 0.0)
    ac.offer(req(rid="new1"), 0.0)
    ac.offer(req(rid="new2"), 0.0)
    out = ac.offer(req(returning=True, rid="back"), 0.0)
    assert out[0].queued and out[0].request.request_id == "back"
    assert out[1].shed and out[1].reason == "displaced" and out[1].request.request_id == "new2"
    assert [q.request_id for q in ac.queued_requests()] == ["back", "new1"]
    # a new session meets a full queue: shed, two ahead of it
    d = ac.offer(req(rid="new3"), 0.0)[0]
    assert d.shed and d.reason == "queue_full"
    # a returning one meets a queue of returning ones: shed too
    ac2 = controller({"a": 1}, depth=1)
    ac2.offer(req(), 0.0)
    ac2.offer(req(returning=True), 0.0)
    assert ac2.offer(req(returning=True), 0.0)[0].reason == "queue_full"


# --- hot changes ---------------------------------------------------------------------------------
def test_lowering_a_cap_cancels_nothing_and_stops_admissions() -> None:
    ac = controller({"a": 4})
    for _ in range(4):
        ac.offer(req(), 0.0)
    assert ac.set_cap("a", 2, 0.0) == []
    assert ac.in_flight("a") == 4
    waiting = ac.offer(req(rid="waits"), 0.1)[0]
    assert waiting.queued
    assert ac.release("a", 1.0) == [] and ac.in_flight("a") == 3
    assert ac.release("a", 2.0) == [] and ac.in_flight("a") == 2
    assert only(ac.release("a", 3.0), "admitted") == ["waits"]
    assert ac.in_flight("a") == 2


def test_raising_a_cap_admits_waiting_requests() -> None:
    ac = controller({"a": 1})
    for _ in range(4):
        ac.offer(req(), 0.0)
    out = ac.set_cap("a", 3, 1.0)
    assert len(only(out, "admitted")) == 2 and ac.in_flight("a") == 3
    assert ac.queue_depth() == 1


def test_replicas_join_and_leave() -> None:
    ac = controller({"a": 1})
    ac.offer(req(), 0.0)
    ac.offer(req(rid="waits"), 0.0)
    assert only(ac.add_replica("b", 1, 1.0), "admitted") == ["waits"]
    assert ac.in_flight("b") == 1 and ac.replicas() == ["a", "b"]
    ac.remove_replica("b", 2.0)
    assert ac.replicas() == ["a"] and ac.in_flight("b") == 1  # still running there
    assert ac.release("b", 3.0) == []
    assert ac.in_flight("b") == 0
    assert ac.offer(req(), 4.0)[0].queued  # a is full; b takes nothing any more
    with pytest.raises(ValueError):
        ac.add_replica("a", 1, 5.0)


def test_a_route_that_names_one_replica_waits_for_it() -> None:
    def to_a(request: FleetRequest, view: FleetView, now: float) -> str | None:
        return "a"

    ac = AdmissionController({"a": 1, "b": 5}, 10, 100.0, route=to_a)
    ac.offer(req(), 0.0)
    assert ac.offer(req(), 0.0)[0].queued
    assert ac.queued_ahead("a", req()) == 1
    assert ac.in_flight("b") == 0


# --- a failure before the first byte: requeue ----------------------------------------------------
def test_a_request_failed_before_its_first_byte_waits_for_a_slot_elsewhere() -> None:
    ac = controller({"a": 1, "b": 1}, budget=1.0)
    failing = req(0.0, rid="failing")
    assert ac.offer(failing, 0.0)[0].replica == "a"
    assert ac.offer(req(0.0), 0.0)[0].replica == "b"  # b is at its cap
    ac.offer(req(0.05, rid="earlier"), 0.05)  # waiting before the failure
    out = ac.requeue(failing, "a", 0.1)
    # b is full and a is where it failed: queued, its deadline the original one, ahead of
    # the request that was already waiting; a's slot is free for others
    assert out[0].queued and out[0].deadline == pytest.approx(1.0)
    assert only(out[1:], "admitted") == ["earlier"] and out[1].replica == "a"
    assert [q.request_id for q in ac.queued_requests()] == ["failing"]
    assert ac.avoids("failing") == "a" and ac.num_requeued == 1
    assert ac.drain_rate(None, 0.1) == 0.0  # a failure is not a completion
    # a frees again: it does not go back there
    assert ac.release("a", 0.3) == [] and ac.queue_depth() == 1
    # a slot frees at b before the deadline: admitted there
    back = ac.release("b", 0.5)
    assert [(d.request.request_id, d.outcome, d.replica) for d in back] == [
        ("failing", "admitted", "b")]


def test_a_requeued_request_not_admitted_by_its_deadline_is_shed_with_retry_after() -> None:
    ac = controller({"a": 1, "b": 1}, budget=1.0)
    failing = req(0.0, rid="failing")
    ac.offer(failing, 0.0)
    ac.offer(req(0.0), 0.0)
    assert ac.requeue(failing, "a", 0.1)[0].queued
    assert ac.next_deadline() == pytest.approx(1.0)
    shed = ac.expire(1.01)
    assert only(shed, "shed") == ["failing"]
    assert shed[0].reason == "deadline"
    assert shed[0].retry_after_s == 1 and shed[0].retry_after_ms == 1000
    # past its deadline it is shed at once, even with room elsewhere
    late = req(2.0, rid="late")
    ac.offer(late, 2.0)
    ac.release("b", 2.5)
    assert [d.reason for d in ac.requeue(late, "a", 3.5)] == ["deadline"]


def test_a_request_that_can_go_elsewhere_now_is_admitted_there_least_loaded_first() -> None:
    ac = controller({"a": 1, "b": 4, "c": 2})
    failing = req(rid="failing")
    assert ac.offer(failing, 0.0)[0].replica == "a"
    ac.offer(req(), 0.0)  # b
    out = ac.requeue(failing, "a", 0.1)
    assert (out[0].outcome, out[0].replica) == ("admitted", "c")  # 0/2 before 1/4
    assert ac.in_flight("a") == 0 and ac.num_admitted == 3


def test_with_no_other_replica_a_requeued_request_is_shed_no_replica() -> None:
    ac = controller({"a": 2})
    failing = req(rid="failing")
    ac.offer(failing, 0.0)
    d = ac.requeue(failing, "a", 0.1)[0]
    assert d.shed and d.reason == "no_replica" and d.retry_after_s is not None
    # queued for b, which then leaves: nowhere left to go
    ac2 = controller({"a": 1, "b": 1})
    ac2.offer(failing, 0.0)
    ac2.offer(req(), 0.0)
    assert ac2.requeue(failing, "a", 0.1)[0].queued
    out = ac2.remove_replica("b", 0.2)
    assert [(d.request.request_id, d.reason) for d in out] == [("failing", "no_replica")]


def test_a_requeued_request_displaces_the_last_in_a_full_queue() -> None:
    ac = controller({"a": 1, "b": 1}, depth=1)
    first, second = req(rid="first"), req(rid="second")
    ac.offer(first, 0.0)
    ac.offer(second, 0.0)
    ac.offer(req(rid="new"), 0.0)  # waits: the queue is full
    ac.set_cap("a", 0, 0.0)  # a's freed slot will take no one
    out = ac.requeue(first, "a", 0.1)
    assert out[0].queued and out[1].shed and out[1].reason == "displaced"
    assert out[1].request.request_id == "new"
    # a second requeued request ranks behind the first: the full queue sheds it (b's freed
    # slot would take the first one: closed too)
    ac.set_cap("b", 0, 0.2)
    out = ac.requeue(second, "b", 0.2)
    assert out[0].shed and out[0].reason == "queue_full" and out[0].retry_after_s == 1


def test_the_freed_slot_goes_to_the_queue_before_the_request_is_placed_again() -> None:
    ac = controller({"a": 1, "b": 1}, depth=1)
    failing = req(rid="failing")
    ac.offer(failing, 0.0)
    ac.offer(req(), 0.0)
    ac.offer(req(rid="new"), 0.0)  # the queue is full
    out = ac.requeue(failing, "a", 0.1)
    # "new" takes a's slot, which makes room in the queue: nobody is displaced
    assert [(d.request.request_id, d.outcome) for d in out] == [
        ("failing", "queued"), ("new", "admitted")]
    assert out[1].replica == "a"
    # a queue of depth 0: nothing can wait, shed at once
    ac0 = controller({"a": 1, "b": 1}, depth=0)
    ac0.offer(failing, 0.0)
    ac0.offer(req(), 0.0)
    assert ac0.requeue(failing, "a", 0.1)[0].reason == "queue_full"


def test_an_empty_fleet_sheds_at_once_no_replica() -> None:
    ac = controller({})
    d = ac.offer(req(rid="none"), 0.0)[0]
    assert d.shed and d.reason == "no_replica" and d.retry_after_s == 1
    ac.add_replica("a", 1, 1.0)
    ac.offer(req(), 1.0)
    ac.offer(req(rid="waits"), 1.0)
    out = ac.remove_replica("a", 1.5)  # the last replica leaves (ejected, say)
    assert [(d.request.request_id, d.reason) for d in out] == [("waits", "no_replica")]
    assert ac.num_shed["no_replica"] == 2


# --- per-key limits ------------------------------------------------------------------------------
def keyed(key: str, arrival: float = 0.0, rid: str | None = None) -> FleetRequest:
    return FleetRequest(rid or f"r{next(_ids)}", None, arrival, key=key)


def test_a_key_at_its_limit_is_shed_at_once_with_a_retry_after() -> None:
    """alice may have 2 requests queued or in flight: the third is shed (key_limit) even
    though the fleet has room, bob is not held back, and a release lets alice in again."""
    ac = controller({"a": 1, "b": 1}, depth=4, key_limits={"alice": 2})
    first = ac.offer(keyed("alice"), 0.0)[0]
    second = ac.offer(keyed("alice"), 0.0)[0]
    assert (first.outcome, second.outcome) == ("admitted", "admitted")
    third = ac.offer(keyed("alice"), 0.1)[0]
    assert third.shed and third.reason == "key_limit"
    assert third.retry_after_s == 1 and third.retry_after_ms == 1000  # nothing drained yet
    assert ac.num_shed["key_limit"] == 1 and ac.key_count("alice") == 2
    assert ac.offer(keyed("bob"), 0.1)[0].queued  # bob waits for a slot, alice's limit aside
    ac.release(first.replica or "", 0.5, key="alice")
    assert ac.key_count("alice") == 1
    assert ac.offer(keyed("alice"), 0.6)[0].queued  # behind bob


def test_a_key_counts_its_queued_requests_until_they_leave() -> None:
    """Queued requests count against their key; each way out of the queue (a deadline shed,
    a cancel, being displaced) gives the place back."""
    ac = controller({"a": 1}, depth=1, budget=1.0, key_limits={"k": 3})
    ac.offer(FleetRequest("run", None, 0.0), 0.0)  # a is full from now on
    q1 = keyed("k", 0.0, "q1")
    assert ac.offer(q1, 0.0)[0].queued and ac.key_count("k") == 1
    assert ac.cancel("q1") and ac.key_count("k") == 0
    assert ac.offer(keyed("k", 0.2, "q2"), 0.2)[0].queued
    out = ac.expire(1.3)  # q2's deadline was 1.2
    assert [(d.request.request_id, d.reason) for d in out] == [("q2", "deadline")]
    assert ac.key_count("k") == 0
    assert ac.offer(keyed("k", 1.4, "q3"), 1.4)[0].queued
    returning = FleetRequest("ret", None, 1.4, returning=True, key="k")
    ds = ac.offer(returning, 1.4)  # the full queue: q3 is displaced by the returning one
    assert [(d.request.request_id, d.outcome) for d in ds] == [("ret", "queued"),
                                                               ("q3", "shed")]
    assert ac.key_count("k") == 1


def test_a_requeued_request_keeps_its_place_under_its_key() -> None:
    ac = controller({"a": 1, "b": 1}, depth=2, budget=1.0, key_limits={"k": 1})
    d = ac.offer(keyed("k", 0.0, "x"), 0.0)[0]
    assert d.admitted and d.replica is not None
    assert ac.offer(keyed("k", 0.0), 0.0)[0].reason == "key_limit"
    again = ac.requeue(d.request, d.replica, 0.1)[0]
    assert again.admitted and again.replica != d.replica and ac.key_count("k") == 1
    assert ac.offer(keyed("k", 0.2), 0.2)[0].reason == "key_limit"
    assert again.replica is not None
    ac.release(again.replica, 0.3, key="k")
    assert ac.key_count("k") == 0


def test_releasing_a_key_with_nothing_under_it_is_an_error() -> None:
    ac = controller({"a": 1}, key_limits={"k": 1})
    ac.offer(req(), 0.0)
    with pytest.raises(ValueError, match="key 'k'"):
        ac.release("a", 0.1, key="k")
    with pytest.raises(ValueError, match="at least 1"):
        ac.set_key_limits({"k": 0})


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2)), min_size=1, max_size=80),
       limit=st.integers(1, 3))
def test_a_key_never_holds_more_than_its_limit(ops: list[tuple[int, int]], limit: int) -> None:
    """Random offers, releases, cancels, requeues and expiries: every key's count is exactly
    its requests queued or in flight, and never above its limit."""
    ac = controller({"a": 1, "b": 2}, depth=3, budget=1.0, key_limits={"k0": limit, "k1": limit})
    running: list[tuple[FleetRequest, str]] = []
    queued: dict[str, FleetRequest] = {}
    now = 0.0

    def apply(ds: list[Decision]) -> None:
        for d in ds:
            queued.pop(d.request.request_id, None)
            if d.admitted and d.replica is not None:
                running.append((d.request, d.replica))
            elif d.queued:
                queued[d.request.request_id] = d.request

    for op, k in ops:
        now += 0.15
        key = None if k == 2 else f"k{k}"
        if op <= 1:
            apply(ac.offer(FleetRequest(f"r{next(_ids)}", None, now, key=key), now))
        elif op == 2 and running:
            r, replica = running.pop(0)
            apply(ac.release(replica, now, key=r.key))
        elif op == 3 and queued:
            rid = next(iter(queued))
            assert ac.cancel(rid)
            del queued[rid]
        elif op == 4 and running:
            r, replica = running.pop()
            apply(ac.requeue(r, replica, now))
        else:
            apply(ac.expire(now))
        for name in ("k0", "k1"):
            held = sum(1 for r, _ in running if r.key == name) + sum(
                1 for r in queued.values() if r.key == name)
            assert ac.key_count(name) == held <= limit
