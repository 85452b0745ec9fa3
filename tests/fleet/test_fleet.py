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
    running: list[str] = []
    now = 0.0
    for i in range(60):
        now += rng.random() * 0.3
        op = rng.random()
        if op < 0.55:
            key = f"sid:{rng.randrange(5)}" if rng.random() < 0.8 else None
            ds = fleet.offer(FleetRequest(f"r{i}", key, now), now)
        elif op < 0.85 and running:
            ds = fleet.release(running.pop(rng.randrange(len(running))), now)
        elif op < 0.9:
            fleet.observe_usage(f"sid:{rng.randrange(5)}", rng.randrange(1, 4000), 0, now)
            ds = []
        else:
            ds = fleet.expire(now)
        running += [d.replica for d in ds if d.admitted and d.replica is not None]
        made += ds
    again = replay(trace, {"a": 2, "b": 1}, SETTINGS, Flat())
    assert [(d.request.request_id, d.outcome, d.replica, d.reason) for d in again] == [
        (d.request.request_id, d.outcome, d.replica, d.reason) for d in made]
