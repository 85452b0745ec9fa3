"""Workload generators: length conventions, seeding, prompt groups, multi-turn prefixes,
closed-loop users and open-loop arrivals."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import pytest

from chatfleet.core.documents.sweep import ClosedLoad, OpenLoad
from chatfleet.core.workload import (
    ClosedLoop,
    GroupDraw,
    LengthSpec,
    OpenLoop,
    RequestSpec,
    Workload,
    WorkloadConfig,
    WorkloadError,
    driver_for,
    segment_tokens,
)


def workload(seed: int = 1, **kw: Any) -> Workload:
    kw.setdefault("system_prompt_tokens", 100)
    return Workload(WorkloadConfig(**kw), random.Random(seed))


def spec_key(s: RequestSpec) -> tuple[object, ...]:
    return (s.request_id, s.session_id, s.user, s.turn, s.group, s.segments, s.output_segments,
            s.max_new_tokens, s.scheduled_time)


# ------------------------------------------------------------------------------------------
# lengths


def sample_many(spec: LengthSpec, n: int = 6000, seed: int = 3) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    pairs = [spec.sample(rng) for _ in range(n)]
    return [i for i, _ in pairs], [o for _, o in pairs]


def test_sglang_uniform_convention() -> None:
    # [max(int(len * r), 1), len]: 100 * 0.25 -> [25, 100]; int(50 * 0.25) = 12 -> [12, 50]
    ins, outs = sample_many(LengthSpec("uniform", 100, 50, range_ratio=0.25))
    assert (min(ins), max(ins)) == (25, 100)
    assert (min(outs), max(outs)) == (12, 50)
    assert len(set(ins)) == 76  # every integer of the range shows up


def test_sglang_uniform_ratio_zero_starts_at_one() -> None:
    ins, _ = sample_many(LengthSpec("uniform", 20, 5, range_ratio=0.0))
    assert (min(ins), max(ins)) == (1, 20)


def test_sglang_uniform_ratio_one_is_fixed() -> None:
    ins, outs = sample_many(LengthSpec("uniform", 20, 5, range_ratio=1.0), n=200)
    assert set(ins) == {20}
    assert set(outs) == {5}


def test_vllm_uniform_convention() -> None:
    # [floor(len * (1 - r)), ceil(len * (1 + r))]: 100, 0.25 -> [75, 125]; 50 -> [37, 63]
    spec = LengthSpec("uniform", 100, 50, range_ratio=0.25, convention="vllm")
    ins, outs = sample_many(spec)
    assert (min(ins), max(ins)) == (75, 125)
    assert (min(outs), max(outs)) == (37, 63)
    assert spec.max_lengths() == (125, 63)


def test_fixed_lengths() -> None:
    ins, outs = sample_many(LengthSpec("fixed", 512, 128), n=50)
    assert set(ins) == {512}
    assert set(outs) == {128}


def test_lengths_draw_what_a_live_run_draws_from_the_same_generator() -> None:
    """The draws a session's lengths take from its generator (the twin and a live run replay
    the same ones): none for fixed lengths, one random() each for uniform ones (input first),
    one randrange for pairs."""
    fixed, std = random.Random(7), random.Random(7)
    assert LengthSpec("fixed", 512, 128).sample(fixed) == (512, 128)
    assert fixed.getstate() == std.getstate()
    rng = random.Random(7)
    assert LengthSpec("uniform", 100, 10, 0.5, "vllm").sample(rng) == (
        50 + int(std.random() * 101), 5 + int(std.random() * 11))
    assert rng.getstate() == std.getstate()
    pairs = ((10, 1), (20, 2), (30, 3))
    assert LengthSpec("file", pairs=pairs).sample(rng) == pairs[std.randrange(3)]


def test_pairs_are_drawn_from_the_list() -> None:
    pairs = ((10, 1), (20, 2), (30, 3))
    rng = random.Random(5)
    spec = LengthSpec("file", pairs=pairs)
    drawn = {spec.sample(rng) for _ in range(300)}
    assert drawn == set(pairs)
    assert spec.max_lengths() == (30, 3)


# ------------------------------------------------------------------------------------------
# seeding, groups, sessions


def closed_loop_trace(seed: int) -> list[tuple[object, ...]]:
    wl = workload(seed, lengths=LengthSpec("uniform", 200, 100, range_ratio=0.5), turns=3,
                  think_time_s=2.0, prompt_groups=2)
    loop = ClosedLoop(wl, 4)
    specs = loop.start()
    out = [spec_key(s) for s in specs]
    for k in range(12):
        nxt = loop.on_done(specs[k % 4], now=float(k))
        specs[k % 4] = nxt
        out.append(spec_key(nxt))
    return out


def test_same_seed_same_specs() -> None:
    assert closed_loop_trace(11) == closed_loop_trace(11)
    assert closed_loop_trace(11) != closed_loop_trace(12)


def test_prompt_groups_round_robin_and_shared_system_segment() -> None:
    wl = workload(prompt_groups=3, system_prompt_tokens=64)
    specs = ClosedLoop(wl, 7).start()
    assert [s.group for s in specs] == [0, 1, 2, 0, 1, 2, 0]
    first = [s.prompt_ids()[:64] for s in specs]
    for a, sa in zip(first, specs, strict=True):
        for b, sb in zip(first, specs, strict=True):
            assert (a == b) == (sa.group == sb.group)
    # the rest of the prompt is the user's own
    assert specs[0].prompt_ids()[64:] != specs[3].prompt_ids()[64:]


def groups_by_session(draw: GroupDraw, groups: int, users: int = 16, order_seed: int | None = None,
                      rounds: int = 20, turns: int = 1, seed: int = 9) -> dict[str, list[int]]:
    """Each session's group per turn, over `rounds` completions of every user; `order_seed`
    shuffles the order in which the users' requests complete (a live run's)."""
    cfg = WorkloadConfig(system_prompt_tokens=32, prompt_groups=groups,
                         group_draw=draw,
                         lengths=LengthSpec("uniform", 50, 20, 0.5), turns=turns)
    loop = ClosedLoop(Workload(cfg, random.Random(seed)), users)
    specs = {s.user: s for s in loop.start()}
    seen: dict[str, list[int]] = {s.session_id: [s.group] for s in specs.values()}
    order = random.Random(order_seed)
    for _ in range(rounds):
        users_done = list(range(users))
        if order_seed is not None:
            order.shuffle(users_done)
        for u in users_done:
            nxt = loop.on_done(specs[u], 0.0)
            assert nxt.segments[0] == (nxt.group + 1, 32)  # the group's shared prompt first
            seen.setdefault(nxt.session_id, []).append(nxt.group)
            specs[u] = nxt
    return seen


def distinct_groups(seen: dict[str, list[int]]) -> set[int]:
    return {g for gs in seen.values() for g in gs}


@pytest.mark.parametrize("groups", [16, 32, 64])
def test_a_request_draw_reaches_groups_that_users_never_pinned(groups: int) -> None:
    by_user = groups_by_session("user", groups)
    by_request = groups_by_session("request", groups, rounds=100)
    assert len(distinct_groups(by_user)) == 16  # 16 users: 16 groups, however many exist
    for sid, gs in by_user.items():  # every session of user u: group u mod G
        user = int(sid[1:].split(".")[0]) - 1
        assert set(gs) == {user % groups}
    # 1,616 sessions drawn uniformly over G: every group is used, none far above its share
    assert distinct_groups(by_request) == set(range(groups))
    counts = [sum(gs.count(g) for gs in by_request.values()) for g in range(groups)]
    assert max(counts) < 2.5 * 1616 / groups


def test_a_request_draw_does_not_depend_on_the_order_others_finish() -> None:
    draws: tuple[GroupDraw, ...] = ("user", "request")
    for draw in draws:
        twin_like = groups_by_session(draw, 32, users=6, turns=2)
        live_like = groups_by_session(draw, 32, users=6, turns=2, order_seed=3)
        assert twin_like == live_like, draw
    by_request = groups_by_session("request", 32, users=6, turns=2)
    assert all(len(set(gs)) == 1 for gs in by_request.values())  # a session keeps its group
    assert by_request != groups_by_session("request", 32, users=6, turns=2, seed=10)


def test_no_system_prompt() -> None:
    wl = workload(system_prompt_tokens=0, lengths=LengthSpec("fixed", 30, 10))
    spec = ClosedLoop(wl, 1).start()[0]
    assert spec.prompt_len == 30
    assert len(spec.segments) == 1


@pytest.mark.parametrize("reasoning_share", [0.0, 0.25])
def test_multi_turn_prompt_extends_the_previous_one(reasoning_share: float) -> None:
    wl = workload(lengths=LengthSpec("fixed", 50, 40), turns=3,
                  reasoning_share=reasoning_share)
    loop = ClosedLoop(wl, 1)
    t0 = loop.start()[0]
    t1 = loop.on_done(t0, 10.0)
    t2 = loop.on_done(t1, 20.0)
    assert (t0.turn, t1.turn, t2.turn) == (0, 1, 2)
    assert t0.session_id == t1.session_id == t2.session_id
    reasoning = int(40 * reasoning_share)  # 0 or 10
    content = 40 - reasoning
    # prompt lengths: 100 + 50, then + 30/40 content + 50 per turn
    assert t0.prompt_len == 150
    assert t1.prompt_len == 150 + content + 50
    assert t2.prompt_len == t1.prompt_len + content + 50
    for prev, cur in ((t0, t1), (t1, t2)):
        assert prev.output_len == 40
        assert prev.max_new_tokens == 40
        out = prev.output_ids()
        shared = prev.prompt_ids() + out[reasoning:]
        assert cur.prompt_ids()[: len(shared)] == shared
        # the reasoning is dropped from the next prompt
        assert not set(out[:reasoning]) & set(cur.prompt_ids())


def test_segment_tokens_are_vocabulary_ids_distinct_per_segment() -> None:
    toks = segment_tokens([(1, 3), (2, 2)])
    v = 151643
    assert list(toks) == [7919 % v, (7919 + 104729) % v, (7919 + 2 * 104729) % v,
                          (2 * 7919) % v, (2 * 7919 + 104729) % v]
    firsts = [segment_tokens([(s, 1)])[0] for s in range(1, 5000)]
    assert len(set(firsts)) == len(firsts)  # no two segments share a first token
    assert all(0 <= t < v for t in segment_tokens([(123456, 4000)]))



@pytest.mark.parametrize("system", [0, 100])
def test_a_prompt_built_on_the_shared_system_ids_is_its_segments_tokens(system: int) -> None:
    w = workload(system_prompt_tokens=system, turns=3, prompt_groups=2)
    specs = []
    for u in range(3):
        s = w.new_session(u)
        specs += [w.next_turn(s, 0.0) for _ in range(3)]
    assert all((sp.first_ids is not None) == (system > 0) for sp in specs)
    for sp in specs:
        got = sp.prompt_ids()
        assert got == segment_tokens(sp.segments)
        got[0] = -1  # a new array every time: the shared ids are never handed out
        assert sp.prompt_ids() == segment_tokens(sp.segments)
    if system:  # users 0 and 2 are in group 0 (round-robin): one array of its system prompt
        assert specs[0].first_ids is specs[6].first_ids


@pytest.mark.parametrize("n", [1, 2048, (1 << 16), 151643, 151643 + 7])
def test_segment_tokens_follow_the_formula_at_any_length(n: int) -> None:
    """(sid x 7919 + j x 104729) mod 151643, for segments up to a whole period of the
    precomputed table and beyond it, for segments that start anywhere in the table (near its
    end, too), and again when the segment is seen a second time."""
    for sid in (1, 9_999_991, 151642, 19):
        want = [(sid * 7919 + j * 104729) % 151643 for j in range(n)]
        assert list(segment_tokens([(sid, n)])) == want
        assert list(segment_tokens([(sid, n), (sid, n)])) == want + want


# ------------------------------------------------------------------------------------------
# closed loop


def test_closed_loop_start_all_at_once() -> None:
    specs = ClosedLoop(workload(), 5).start()
    assert len(specs) == 5
    assert [s.scheduled_time for s in specs] == [0.0] * 5
    assert [s.user for s in specs] == [0, 1, 2, 3, 4]
    assert len({s.session_id for s in specs}) == 5


def test_closed_loop_ramp_up() -> None:
    specs = ClosedLoop(workload(ramp_up_s=10.0), 4).start()
    assert [s.scheduled_time for s in specs] == [0.0, 2.5, 5.0, 7.5]


def test_closed_loop_new_session_after_last_turn() -> None:
    wl = workload(lengths=LengthSpec("fixed", 20, 10), turns=2, think_time_s=3.0,
                  think_dist="fixed")
    loop = ClosedLoop(wl, 1)
    a0 = loop.start()[0]
    a1 = loop.on_done(a0, 5.0)
    assert a1.session_id == a0.session_id
    assert a1.turn == 1
    assert a1.scheduled_time == 8.0  # now + fixed think time
    b0 = loop.on_done(a1, 9.0)
    assert b0.session_id != a0.session_id
    assert b0.turn == 0
    assert b0.user == 0
    assert b0.prompt_len == 100 + 20  # fresh history: system prompt and the new message


def test_exponential_think_time_mean() -> None:
    wl = workload(think_time_s=2.0)
    times = [wl.think_time() for _ in range(20_000)]
    assert statistics.fmean(times) == pytest.approx(2.0, rel=0.05)
    assert workload(think_time_s=0.0).think_time() == 0.0


# ------------------------------------------------------------------------------------------
# open loop


def interarrivals(rate: float, burstiness: float, n: int = 20_000) -> list[float]:
    loop = OpenLoop(workload(seed=9), rate, burstiness)
    return [loop.interarrival() for _ in range(n)]


def cv(xs: list[float]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs)


def test_poisson_interarrival() -> None:
    xs = interarrivals(4.0, 1.0)
    assert statistics.fmean(xs) == pytest.approx(0.25, rel=0.03)
    assert cv(xs) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_burstiness(burstiness: float) -> None:
    xs = interarrivals(2.0, burstiness)
    assert statistics.fmean(xs) == pytest.approx(0.5, rel=0.05)
    assert cv(xs) == pytest.approx(1 / math.sqrt(burstiness), rel=0.10)


def test_open_loop_sessions() -> None:
    wl = workload(turns=2, think_time_s=1.0, think_dist="fixed")
    loop = OpenLoop(wl, 1.0)
    a = loop.next_arrival(0.0)
    b = loop.next_arrival(a.scheduled_time)
    assert 0.0 < a.scheduled_time < b.scheduled_time
    assert a.session_id != b.session_id
    assert a.user != b.user
    a1 = loop.on_done(a, 5.0)
    assert a1 is not None
    assert (a1.session_id, a1.turn, a1.scheduled_time) == (a.session_id, 1, 6.0)
    assert loop.on_done(a1, 7.0) is None  # its last turn
    assert loop.on_done(a1, 8.0) is None  # unknown session by now


# ------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "fixed", "input_len": 0},
        {"kind": "fixed", "output_len": 0},
        {"kind": "uniform", "input_len": -5},
        {"kind": "uniform", "range_ratio": -0.1},
        {"kind": "uniform", "range_ratio": 1.1},
        {"kind": "uniform", "range_ratio": 1.0, "convention": "vllm"},
        {"kind": "uniform", "convention": "trt"},
        {"kind": "sharegpt", "pairs": ()},
        {"kind": "file", "pairs": ((10, 0),)},
    ],
)
def test_bad_lengths(kwargs: dict[str, Any]) -> None:
    with pytest.raises(WorkloadError):
        LengthSpec(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prompt_groups": 0},
        {"group_draw": "random"},
        {"turns": 0},
        {"think_time_s": -1.0},
        {"ramp_up_s": -1.0},
        {"system_prompt_tokens": -1},
        {"reasoning_share": 1.0},
        {"reasoning_share": -0.1},
    ],
)
def test_bad_workload_config(kwargs: dict[str, Any]) -> None:
    with pytest.raises(WorkloadError):
        WorkloadConfig(**kwargs)


@pytest.mark.parametrize("users", [0, -3])
def test_bad_user_count(users: int) -> None:
    with pytest.raises(WorkloadError):
        ClosedLoop(workload(), users)


@pytest.mark.parametrize(("rate", "burstiness"), [(0.0, 1.0), (-1.0, 1.0), (1.0, 0.0)])
def test_bad_arrivals(rate: float, burstiness: float) -> None:
    with pytest.raises(WorkloadError):
        OpenLoop(workload(), rate, burstiness)


def test_a_sessions_requests_do_not_depend_on_the_order_others_finish() -> None:
    """The twin and a live run see completions that tie in the model in either order: each
    session's lengths and think times must be its own (the fleet parity check needs it)."""
    cfg = WorkloadConfig(system_prompt_tokens=8,
                         lengths=LengthSpec("uniform", 100, 50, 0.5, "vllm"),
                         turns=3, think_time_s=1.0)

    def run(order: list[int]) -> dict[str, list[tuple[int, float]]]:
        loop = ClosedLoop(Workload(cfg, random.Random(4)), 3)
        specs = {s.user: s for s in loop.start()}
        seen: dict[str, list[tuple[int, float]]] = {}
        for user in order:
            nxt = loop.on_done(specs[user], 10.0)
            seen.setdefault(nxt.session_id, []).append((nxt.prompt_len, nxt.scheduled_time))
            specs[user] = nxt
        return seen

    a = run([0, 1, 2, 0, 1, 2, 2, 1, 0])
    b = run([2, 1, 0, 2, 0, 1, 0, 2, 1])
    assert a == b
    assert "s1.1" in a  # a user's second session


def test_an_open_loop_can_follow_a_trace_of_arrival_times() -> None:
    wl = Workload(WorkloadConfig(), random.Random(1))
    loop = OpenLoop(wl, rate=1.0, arrival_times=[0.5, 0.5, 2.0])
    got = [loop.next_arrival(0.0).scheduled_time for _ in range(4)]
    assert got[:3] == [0.5, 0.5, 2.0] and got[3] == float("inf")
    with pytest.raises(WorkloadError):
        OpenLoop(wl, rate=1.0, arrival_times=[1.0, 0.5])


def test_driver_for_reads_the_load_point() -> None:
    wl = Workload(WorkloadConfig(), random.Random(1))
    closed_loop = driver_for(ClosedLoad(3), wl)
    assert isinstance(closed_loop, ClosedLoop) and closed_loop.users == 3
    open_loop = driver_for(OpenLoad(2.0, burstiness=0.5), wl, [1.0])
    assert isinstance(open_loop, OpenLoop)
    assert (open_loop.rate, open_loop.burstiness, open_loop.arrival_times) == (2.0, 0.5, [1.0])
