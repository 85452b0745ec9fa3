"""core.fleet.Fleet: admission and routing wired as the gateway and the twin drive them, and
replaying its traced calls."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.fleet.admission import FleetRequest
from chatfleet.core.fleet.fleet import Fleet, FleetSettings, FleetTrace, replay


class Flat:
    """Recompute costs 1 ms per token."""

    def recompute_s(self, tokens: int) -> float:
        return tokens / 1000


SETTINGS = FleetSettings(queue_depth=3, ttft_budget_s=1.0, shared_prefix_tokens=0)


def test_a_session_goes_home_and_spills_only_when_home_is_full() -> None:
    fleet = Fleet({"a": 1, "b": 1}, SETTINGS, Flat())
    first = fleet.offer(FleetRequest("r1", "sid:x", 0.0), 0.0)[0]
    assert first.admitted
    home = first.replica
    assert home is not None
    fleet.release(home, 1.0)
    fleet.observe_usage("sid:x", 5000, 0, 1.0)
    assert fleet.is_returning("sid:x", 1.0) and not fleet.is_returning("sid:y", 1.0)
    # home is busy with another session's request and nothing has drained: the wait is
    # unknown (infinite), so the returning session spills
    other = next(k for k in (f"sid:o{i}" for i in range(50))
                 if fleet.router is not None and fleet.router.home(k, ["a", "b"], 2.0) == home)
    assert fleet.offer(FleetRequest("r2", other, 2.0), 2.0)[0].replica == home
    d = fleet.offer(FleetRequest("r3", "sid:x", 2.0, returning=True), 2.0)[0]
    assert d.admitted and d.replica != home
    assert fleet.num_routes == {"hit": 2, "spill": 1}


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_replaying_a_trace_makes_the_same_decisions(seed: int) -> None:
    rng = random.Random(seed)
    trace = FleetTrace()
    fleet = Fleet({"a": 2, "b": 1}, SETTINGS, Flat(), trace)
    made = []
    running: list[tuple[FleetRequest, str]] = []
    now = 0.0
    for i in range(60):
        now += rng.random() * 0.3
        op = rng.random()
        if op < 0.55:
            key = f"sid:{rng.randrange(5)}" if rng.random() < 0.8 else None
            ds = fleet.offer(FleetRequest(f"r{i}", key, now), now)
        elif op < 0.75 and running:
            ds = fleet.release(running.pop(rng.randrange(len(running)))[1], now)
        elif op < 0.85 and running:  # failed before its first byte
            ds = fleet.requeue(*running.pop(rng.randrange(len(running))), now)
        elif op < 0.9:
            fleet.observe_usage(f"sid:{rng.randrange(5)}", rng.randrange(1, 4000), 0, now)
            ds = []
        else:
            ds = fleet.expire(now)
        running += [(d.request, d.replica) for d in ds if d.admitted and d.replica is not None]
        made += ds
    again = replay(trace, {"a": 2, "b": 1}, SETTINGS, Flat())
    assert [(d.request.request_id, d.outcome, d.replica, d.reason) for d in again] == [
        (d.request.request_id, d.outcome, d.replica, d.reason) for d in made]


def test_a_failure_before_the_first_byte_waits_in_the_queue_and_replays_exactly() -> None:
    """Two replicas, the session's home fails before the first byte while the other is at its
    cap: requeued with its original deadline, admitted when a slot frees before it; a second
    one is not, and is shed with a Retry-After. The trace replays to the same decisions."""
    trace = FleetTrace()
    fleet = Fleet({"a": 1, "b": 1}, SETTINGS, Flat(), trace)
    made = []
    r1 = FleetRequest("r1", "sid:x", 0.0)
    made += fleet.offer(r1, 0.0)
    home = made[0].replica
    assert home is not None
    other = "b" if home == "a" else "a"
    r2 = FleetRequest("r2", None, 0.0)
    made += fleet.offer(r2, 0.0)
    assert made[-1].replica == other  # at its cap now
    made += fleet.requeue(r1, home, 0.1)
    assert made[-1].queued and made[-1].deadline == 1.0
    made += fleet.release(other, 0.6)
    assert (made[-1].request, made[-1].outcome, made[-1].replica) == (r1, "admitted", other)
    # the session now lives where it ran
    assert fleet.router is not None and fleet.router.home("sid:x", ["a", "b"], 0.6) == other
    # again, but no slot frees in time
    r3 = FleetRequest("r3", None, 0.7)
    made += fleet.offer(r3, 0.7)
    assert made[-1].replica == home
    made += fleet.requeue(r3, home, 0.8)
    assert made[-1].queued and made[-1].deadline == 1.7
    made += fleet.expire(1.71)
    assert made[-1].request == r3 and made[-1].reason == "deadline"
    assert made[-1].retry_after_s is not None and made[-1].retry_after_ms is not None
    again = replay(trace, {"a": 1, "b": 1}, SETTINGS, Flat())
    assert [(d.request.request_id, d.outcome, d.replica, d.reason) for d in again] == [
        (d.request.request_id, d.outcome, d.replica, d.reason) for d in made]


def test_key_limits_are_the_cores_and_replay_exactly() -> None:
    """The per-key limit sheds in the core (so the twin and the parity replay see it), and a
    hot change of the limits is a traced call too."""
    trace = FleetTrace()
    settings_ = FleetSettings(queue_depth=3, ttft_budget_s=1.0, key_limits={"alice": 1})
    fleet = Fleet({"a": 2}, settings_, Flat(), trace)
    made = fleet.offer(FleetRequest("r1", None, 0.0, key="alice"), 0.0)
    made += fleet.offer(FleetRequest("r2", None, 0.1, key="alice"), 0.1)
    assert made[-1].reason == "key_limit"
    fleet.set_key_limits({"alice": 2}, 0.2)
    made += fleet.offer(FleetRequest("r3", None, 0.3, key="alice"), 0.3)
    assert made[-1].admitted
    made += fleet.release("a", 0.4, key="alice")
    made += fleet.offer(FleetRequest("r4", None, 0.5, key="alice"), 0.5)
    assert made[-1].admitted
    again = replay(trace, {"a": 2}, settings_, Flat())
    assert [(d.request.request_id, d.outcome, d.reason) for d in again] == [
        (d.request.request_id, d.outcome, d.reason) for d in made]
