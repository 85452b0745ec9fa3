"""The figures the admission controller keeps instead of recomputing (the queue's earliest
deadline and 'ahead' counts, the replicas with room, the sorted replica names) agree with the
brute-force figures after every change."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.fleet.admission import AdmissionController, Decision, FleetRequest
from chatfleet.core.fleet.routing import Router
from chatfleet.core.fleet.waiting import Waiting, WaitQueue

_ids = itertools.count()


def waiting(klass: int, seq: int, deadline: float, avoid: str | None = None) -> Waiting:
    return Waiting(FleetRequest(f"w{next(_ids)}", None, 0.0), klass, seq, deadline, None, avoid)


def check_queue(queue: WaitQueue, model: list[Waiting]) -> None:
    """`model` holds the queue's entries in any order: compare every figure by brute force."""
    ordered = sorted(model, key=lambda w: w.key)
    assert list(queue) == ordered and len(queue) == len(model) and bool(queue) == bool(model)
    assert queue.earliest_deadline() == min((w.deadline for w in model), default=None)
    assert queue.last() is (ordered[-1] if ordered else None)
    for w in model:
        assert w.request.request_id in queue and queue.get(w.request.request_id) is w
    for klass in (0, 1, 2):
        assert queue.num_up_to_class(klass) == sum(1 for w in model if w.klass <= klass)
    for key in [w.key for w in model] + [(0, 0, float("inf")), (1, 1, float("inf")),
                                         (1, 0, -1.0)]:
        assert queue.num_before(key) == sum(1 for w in model if w.key < key)


def test_the_earliest_deadline_follows_the_head_out() -> None:
    queue = WaitQueue()
    first, second, third = waiting(1, 0, 5.0), waiting(1, 1, 3.0), waiting(0, 2, 4.0)
    for w in (first, second, third):
        queue.insert(w)
    assert queue.earliest_deadline() == 3.0 and list(queue) == [third, first, second]
    queue.remove(second)  # held the minimum
    assert queue.earliest_deadline() == 4.0
    assert queue.pop(third.request.request_id) is third and queue.pop("absent") is None
    assert queue.earliest_deadline() == 5.0
    assert queue.pop_last() is first and queue.earliest_deadline() is None


def test_removing_an_entry_that_is_not_queued_is_an_error() -> None:
    queue = WaitQueue()
    queue.insert(waiting(1, 0, 1.0))
    with pytest.raises(ValueError):
        queue.remove(waiting(1, 0, 1.0))  # the same key, another entry


QUEUE_OPS = st.lists(st.one_of(
    st.tuples(st.just("insert"), st.integers(0, 1), st.booleans(), st.floats(0.0, 10.0)),
    st.tuples(st.just("remove"), st.integers(0, 50)),
    st.tuples(st.just("pop_last")),
    st.tuples(st.just("keep_only"), st.lists(st.booleans(), max_size=20)),
), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops=QUEUE_OPS)
def test_the_queue_figures_match_brute_force_after_every_change(ops: list[Any]) -> None:
    queue = WaitQueue()
    model: list[Waiting] = []
    seq = itertools.count()
    for op, *args in ops:
        if op == "insert":
            klass, requeued, deadline = args
            w = waiting(klass, next(seq), deadline, "r0" if requeued else None)
            queue.insert(w)
            model.append(w)
        elif op == "remove" and model:
            w = model.pop(args[0] % len(model))
            queue.remove(w)
        elif op == "pop_last" and model:
            w = queue.pop_last()
            model.remove(w)
            assert all(v.key < w.key for v in model)
        elif op == "keep_only":
            keep = args[0] + [True] * len(model)
            model = [w for w, k in zip(list(queue), keep, strict=False) if k]
            queue.keep_only(list(model))
        check_queue(queue, model)


# --- the controller: random calls, every cached figure checked after each -----------------------
class PerToken:
    def recompute_s(self, tokens: int) -> float:
        return tokens * 1e-4


NAMES = ("r0", "r1", "r2")
CALLS = st.lists(st.one_of(
    st.tuples(st.just("offer"), st.integers(0, 5), st.booleans(), st.floats(0.0, 0.4)),
    st.tuples(st.just("release"), st.integers(0, 20), st.none(), st.floats(0.0, 0.4)),
    st.tuples(st.just("requeue"), st.integers(0, 20), st.none(), st.floats(0.0, 0.4)),
    st.tuples(st.just("cancel"), st.integers(0, 20), st.none(), st.floats(0.0, 0.4)),
    st.tuples(st.just("expire"), st.none(), st.none(), st.floats(0.0, 1.0)),
    st.tuples(st.just("set_cap"), st.integers(0, 2), st.integers(0, 3), st.floats(0.0, 0.4)),
    st.tuples(st.just("add_replica"), st.integers(0, 2), st.integers(0, 3), st.floats(0.0, 0.4)),
    st.tuples(st.just("remove_replica"), st.integers(0, 2), st.none(), st.floats(0.0, 0.4)),
), max_size=80)


def check_controller(ac: AdmissionController, caps: dict[str, int]) -> None:
    assert ac.replicas() == sorted(caps)
    for r in NAMES:
        assert ac.can_admit(r) == (r in caps and ac.in_flight(r) < caps[r])
    queued = ac.queued_requests()
    assert ac.queue_depth() == len(queued)
    assert ac.next_deadline() == min((ac.deadline(q) for q in queued), default=None)


@settings(max_examples=300, deadline=None)
@given(calls=CALLS, start=st.lists(st.integers(0, 3), min_size=0, max_size=3),
       depth=st.integers(0, 5), affinity=st.booleans())
def test_the_controllers_kept_figures_match_brute_force_after_every_call(
        calls: list[tuple[str, Any, Any, float]], start: list[int], depth: int,
        affinity: bool) -> None:
    caps = dict(zip(NAMES, start, strict=False))
    router = Router(PerToken(), shared_prefix_tokens=100)
    ac = AdmissionController(caps, depth, 1.0, route=router.route if affinity else
                             (lambda r, view, now: min(view.replicas(), default=None)))
    running: list[tuple[FleetRequest, str]] = []
    now = 0.0

    def apply(decisions: list[Decision]) -> None:
        router.note(decisions, now)
        running.extend((d.request, d.replica) for d in decisions
                       if d.admitted and d.replica is not None)
        check_controller(ac, caps)

    check_controller(ac, caps)
    for call, a, b, dt in calls:
        now += dt
        if call == "offer":
            apply(ac.offer(FleetRequest(f"q{next(_ids)}", f"s{a}", now, returning=b,
                                        prompt_tokens=200 * a), now))
        elif call in ("release", "requeue") and running:
            request, replica = running.pop(a % len(running))
            apply(ac.release(replica, now) if call == "release"
                  else ac.requeue(request, replica, now))
        elif call == "cancel":
            queued = ac.queued_requests()
            if queued:
                assert ac.cancel(queued[a % len(queued)].request_id)
                check_controller(ac, caps)
        elif call == "expire":
            apply(ac.expire(now))
        elif call == "set_cap" and NAMES[a] in caps:
            caps[NAMES[a]] = b
            apply(ac.set_cap(NAMES[a], b, now))
        elif call == "add_replica" and NAMES[a] not in caps:
            caps[NAMES[a]] = b
            apply(ac.add_replica(NAMES[a], b, now))
        elif call == "remove_replica" and NAMES[a] in caps:
            del caps[NAMES[a]]
            apply(ac.remove_replica(NAMES[a], now))
