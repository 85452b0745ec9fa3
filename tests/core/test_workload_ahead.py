"""A run's turns listed ahead (`TurnsAhead`): the shadow lists exactly the turns the run's own
driver sends, whatever the order in which its users finish, and `turns_to_build` reads a
user's turns from the sweep's finished points."""

from __future__ import annotations

import random

import pytest

from chatfleet.core.documents.sweep import ClosedLoad, OpenLoad, SweepPoint
from chatfleet.core.workload import (
    ClosedLoop,
    GroupDraw,
    LengthSpec,
    OpenLoop,
    RequestSpec,
    Workload,
    WorkloadConfig,
)
from chatfleet.core.workload.ahead import Turn, TurnsAhead, turns_to_build

CFG = WorkloadConfig(system_prompt_tokens=100, prompt_groups=3,
                     lengths=LengthSpec("uniform", 200, 50, 0.5), turns=3, think_time_s=1.0)


def closed_run(cfg: WorkloadConfig, seed: int, users: int, sends: int,
               order: random.Random) -> list[RequestSpec]:
    """A closed loop's requests as sent when its users finish in a random order."""
    driver = ClosedLoop(Workload(cfg, random.Random(seed)), users)
    waiting = list(driver.start())
    sent = []
    for _ in range(sends):
        spec = waiting.pop(order.randrange(len(waiting)))
        sent.append(spec)
        waiting.append(driver.on_done(spec, order.uniform(0, 100)))
    return sent


@pytest.mark.parametrize("group_draw", ["round-robin", "request"])
def test_the_shadow_lists_each_users_turns_whatever_the_order_of_completions(
        group_draw: GroupDraw) -> None:
    cfg = WorkloadConfig(system_prompt_tokens=100, prompt_groups=3, group_draw=group_draw,
                         lengths=LengthSpec("uniform", 200, 50, 0.5), turns=3,
                         think_time_s=1.0)
    a = closed_run(cfg, 7, users=8, sends=200, order=random.Random(1))
    b = closed_run(cfg, 7, users=8, sends=200, order=random.Random(2))
    # the two orders allocate different segment ids to the same turn: the shadow must not
    # name turns by them
    assert {(s.session_id, s.turn): s.segments[-1][0] for s in a} != {
        (s.session_id, s.turn): s.segments[-1][0] for s in b}
    ahead = TurnsAhead(cfg, 7, ClosedLoad(8), window_end=1e9)  # no end in sight
    assert ahead.streams == 8
    for sent in (a, b):
        for user in range(8):
            mine = [Turn.of(s) for s in sent if s.user == user]
            assert ahead.turns(user, len(mine)) == mine
        assert all(ahead.knows(s) for s in sent)
    # each turn's successors in its stream are that user's next turns
    for spec in a[:20]:
        later = [Turn.of(s) for s in a if s.user == spec.user]
        i = later.index(Turn.of(spec))
        assert ahead.following(spec, 2) == ahead.turns(spec.user, i + 3)[i + 1:]


def test_a_users_lookahead_stops_at_what_it_will_send_before_the_window_ends() -> None:
    """At its pace so far (a turn every 20 s here) a user at 55 s of a 60 s window sends one
    more turn at most: two are built ahead (half again, and one), not three."""
    driver = ClosedLoop(Workload(CFG, random.Random(5)), 1)
    ahead = TurnsAhead(CFG, 5, ClosedLoad(1), window_end=60.0)
    first = driver.start()[0]
    assert len(ahead.following(first, 3)) == 3  # no pace yet
    second = driver.on_done(first, 20.0)  # think time comes on top of the 20 s
    assert len(ahead.following(second, 3)) == 3
    third = driver.on_done(second, 40.0)
    third.scheduled_time = 55.0
    assert len(ahead.following(third, 3)) == 2
    third.scheduled_time = 70.0  # past the window's end: still the one after it
    assert len(ahead.following(third, 3)) == 1


def test_the_first_turns_come_in_the_order_they_are_needed() -> None:
    ahead = TurnsAhead(CFG, 3, ClosedLoad(4), window_end=60.0)
    first = ahead.first(2)
    assert [t.turn for t in first] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [t.session_id for t in first[:4]] == ["s1", "s2", "s3", "s4"]
    with pytest.raises(ValueError, match="without end"):
        ahead.first(None)


def test_an_open_loops_sessions_are_all_listed_in_arrival_order() -> None:
    load = OpenLoad(rate_rps=2.0)
    driver = OpenLoop(Workload(CFG, random.Random(9)), load.rate_rps)
    spec = driver.next_arrival(0.0)
    arrivals = []
    while spec.scheduled_time < 60.0:
        arrivals.append(spec)
        spec = driver.next_arrival(spec.scheduled_time)
    sent = []
    for first in arrivals:  # each session's turns, as the run sends them
        cur: RequestSpec | None = first
        while cur is not None:
            sent.append(cur)
            cur = driver.on_done(cur, cur.scheduled_time + 5.0)
    ahead = TurnsAhead(CFG, 9, load, window_end=60.0)
    assert ahead.streams == 1
    assert ahead.first(None) == [Turn.of(s) for s in sent]
    assert len({s.session_id for s in sent}) == len(arrivals) > 60
    assert ahead.following(sent[0], 2) == [Turn.of(s) for s in sent[1:3]]


def test_a_turn_the_run_never_makes_has_no_successors() -> None:
    ahead = TurnsAhead(CFG, 3, ClosedLoad(2), window_end=60.0)
    stranger = closed_run(CFG, 4, users=2, sends=1, order=random.Random(0))[0]
    stranger.session_id = "s99"
    assert ahead.following(stranger, 3) == []
    assert not ahead.knows(stranger)


def closed_point(users: int, rps: float) -> SweepPoint:
    return SweepPoint(load=ClosedLoad(users), request_rps=rps)


def test_turns_to_build_bounds_a_users_turns_from_the_points_under_its_load() -> None:
    done = [closed_point(4, 2.0), closed_point(16, 4.0), closed_point(64, 6.0),
            SweepPoint(load=OpenLoad(rate_rps=1.0), request_rps=1.0)]
    # 32 users: the 16-user point's cycle (16 / 4 = 4 s) is no longer than theirs: 40 s of
    # sends hold at most 10 turns, with 25% and 2 turns on top
    assert turns_to_build(ClosedLoad(32), 40.0, done) == 15
    assert turns_to_build(ClosedLoad(16), 40.0, done) == 15
    # under every point: the fewest users above it (an estimate that may fall short)
    assert turns_to_build(ClosedLoad(2), 40.0, done) == 27
    assert turns_to_build(ClosedLoad(2), 40.0, []) is None
    assert turns_to_build(OpenLoad(rate_rps=2.0), 40.0, done) is None
    # a point that measured no rate tells nothing
    assert turns_to_build(ClosedLoad(8), 40.0, [closed_point(8, 0.0)]) is None
