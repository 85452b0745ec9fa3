"""The cache analysis's replay on hand-made traces: core/cache (the trace, the ledger, the
recommendation) and twin/cache_replay.py (the trace through the twin's scheduler)."""

from __future__ import annotations

import itertools
import random
from array import array

import pytest

from chatfleet.core.cache.recommend import recommend, summarize
from chatfleet.core.cache.replay import CacheConfig, ReplayResult, TurnOutcome, unbounded_pool
from chatfleet.core.cache.trace import (
    UNIQUE_ID_BASE,
    SyntheticConfig,
    Turn,
    answer_ids,
    count_prompt_ids,
    sessions_of,
    synthetic_trace,
)
from chatfleet.core.documents.cache import CacheResult
from chatfleet.core.engine.build import EngineSpec, step_time_model
from chatfleet.core.engine.radix import RadixCache
from chatfleet.core.engine.scheduler import Scheduler
from chatfleet.core.plan import host_tier
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.twin import cache_replay
from chatfleet.twin.cache_replay import Replay

L4 = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("bf16", "bf16"))


def replay(trace: list[Turn], cfg: CacheConfig) -> ReplayResult:
    """The replay `chatfleet cache` runs, on the L4 in BF16 (its defaults)."""
    return cache_replay.replay(trace, cfg, L4)


def ids(*ranges: range | list[int]) -> array[int]:
    out = array("q")
    for r in ranges:
        out.extend(r)
    return out


def two_sessions() -> list[Turn]:
    """A: 10-token prompt, 5-token answer; B (t=500) 20 unrelated tokens evict A; A returns at
    t=1000 with its history (10 + 5) and 3 new tokens."""
    a1 = Turn("A", 1, 0.0, ids(range(1, 11)), ids(range(100, 105)))
    b1 = Turn("B", 1, 500.0, ids(range(1000, 1020)), ids(range(2000, 2005)))
    a2 = Turn("A", 2, 1000.0, ids(range(1, 11), range(100, 105), [300, 301, 302]),
              ids(range(400, 405)))
    return [a1, b1, a2]


def by_key(res: ReplayResult) -> dict[tuple[str, int], TurnOutcome]:
    return {(o.session, o.turn): o for o in res.outcomes}


def test_unbounded_pool_hits_the_history_but_the_answers_last_token() -> None:
    res = by_key(replay(two_sessions(), CacheConfig(10_000)))
    assert res[("A", 1)].hit_tokens == 0
    assert res[("B", 1)].hit_tokens == 0
    a2 = res[("A", 2)]
    # prompt (10) + answer minus its last token (4): the last token has no KV
    assert (a2.prompt_tokens, a2.hit_tokens, a2.ceiling_tokens) == (18, 14, 14)
    assert a2.returned_tokens == 0


def test_small_pool_evicts_a_prefix_that_returns() -> None:
    res = replay(two_sessions(), CacheConfig(30))
    a2 = by_key(res)[("A", 2)]
    assert (a2.hit_tokens, a2.ceiling_tokens, a2.returned_tokens) == (0, 14, 14)
    s = summarize(res).to_json()
    assert s["evicted_then_returned"] == 1
    assert s["evicted_then_returned_tokens"] == 14
    assert s["hit_rate_by_turn"] == [0.0, 0.0]
    assert s["ceiling_hit_rate_by_turn"] == [0.0, round(14 / 18, 4)]
    assert res.evicted_tokens >= 14


def test_host_tier_hits_are_counted_and_loaded_back() -> None:
    res = replay(two_sessions(), CacheConfig(30, host_pool_tokens=100))
    a2 = by_key(res)[("A", 2)]
    assert (a2.hit_tokens, a2.host_hit_tokens, a2.returned_tokens) == (14, 14, 0)
    assert res.loaded_back_tokens == 14
    s = summarize(res).to_json()
    assert s["host_hit_rate"] == round(14 / (10 + 20 + 18), 4)


def test_shared_prefix_hits_across_sessions() -> None:
    sys_prompt = list(range(5000, 5008))
    t1 = Turn("x", 1, 0.0, ids(sys_prompt, [1, 2]), ids([3, 4]))
    t2 = Turn("y", 1, 60.0, ids(sys_prompt, [7, 8, 9]), ids([3, 4]))
    res = by_key(replay([t1, t2], CacheConfig(1000)))
    assert res[("y", 1)].hit_tokens == 8


def test_a_turn_waits_for_its_previous_turn_and_for_room() -> None:
    # B's turn needs the whole pool while A runs: it waits until A finishes
    a1 = Turn("A", 1, 0.0, ids(range(1, 21)), ids(range(100, 110)))
    b1 = Turn("B", 1, 0.01, ids(range(1000, 1020)), ids(range(2000, 2010)))
    res = replay([a1, b1], CacheConfig(40))
    b = by_key(res)[("B", 1)]
    assert res.waited == 1
    assert b.wait_s > 0
    # too long for the pool: never admitted, reported
    big = Turn("C", 1, 0.0, ids(range(1, 100)), ids(range(100, 110)))
    res = replay([big], CacheConfig(50))
    assert res.not_admitted == 1
    assert summarize(res).holds is False


def test_the_replay_drives_the_engine_radix_cache() -> None:
    """The replay's cache is the scheduler's own radix tree, and the scheduler's own counters
    show it admitted, inserted, evicted and unlocked there (counters, not spies on its methods:
    the compiled engine calls them directly, chatfleet/_native.py)."""
    r = Replay(two_sessions(), CacheConfig(30), L4)
    assert type(r.tree) is RadixCache
    assert type(r.scheduler) is Scheduler and r.tree is r.scheduler.tree
    res = r.run()
    input_tokens, _ = r.scheduler.prefix_cache_counters()
    assert input_tokens > 0  # prompts admitted (each matched against the tree first)
    assert r.tree.total_size() > 0  # finished turns were inserted
    assert r.tree.num_evicted_tokens >= 1 and res.evicted_tokens == r.tree.num_evicted_tokens
    assert r.tree.protected_size() == 0  # every lock was released
    assert r.pool.num_request_tokens == 0


def small_synthetic(seed: int = 3) -> list[Turn]:
    cfg = SyntheticConfig(sessions=8, turns=5, system_prompt_tokens=512, user_tokens=64,
                          answer_tokens=128, arrival_gap_s=60.0)
    return synthetic_trace(cfg, random.Random(seed), step_time_model(L4))


def test_policies_differ_under_pressure_and_agree_without_it() -> None:
    trace = small_synthetic()
    tight = {p: summarize(replay(trace, CacheConfig(2500, p))).hit_rate
             for p in ("lru", "lfu", "mru")}
    assert len(set(tight.values())) > 1
    roomy = {p: summarize(replay(trace, CacheConfig(unbounded_pool(trace), p))).hit_rate
             for p in ("lru", "lfu", "mru")}
    assert len(set(roomy.values())) == 1


def test_synthetic_trace_is_seeded_and_sessions_extend_their_prompts() -> None:
    a, b = small_synthetic(1), small_synthetic(1)
    assert [(t.session, t.turn, t.time, t.prompt) for t in a] == [
        (t.session, t.turn, t.time, t.prompt) for t in b]
    for turns in sessions_of(a).values():
        for prev, nxt in itertools.pairwise(turns):
            assert nxt.prompt[: prev.prompt_len] == prev.prompt
            assert nxt.time > prev.time


def test_thinking_drops_the_last_reasoning_from_the_cached_prefix() -> None:
    cfg = SyntheticConfig(sessions=1, turns=2, system_prompt_tokens=16, user_tokens=8,
                          answer_tokens=10, length_spread=0.0, reasoning_share=0.5)
    t1, t2 = synthetic_trace(cfg, random.Random(1), step_time_model(L4))
    a2 = by_key(replay([t1, t2], CacheConfig(1000)))[("s1", 2)]
    assert a2.hit_tokens == t1.prompt_len  # the answer's reasoning is not in the next prompt


def test_count_prompts_share_a_sessions_prefix_and_the_system_prompt() -> None:
    p1 = count_prompt_ids(0, 30, 10)
    p2 = count_prompt_ids(0, 50, 10)
    q = count_prompt_ids(1, 30, 10)
    assert p2[:30] == p1
    assert q[:10] == p1[:10] and q[10] != p1[10]
    counter = [UNIQUE_ID_BASE]
    out = answer_ids(p1, 5, p2, counter)
    assert out == p2[30:35]
    assert answer_ids(p1, 5, None, counter)[0] >= UNIQUE_ID_BASE


def entry(pool: int, policy: str, host: int, holds: bool, hit: float = 0.5) -> CacheResult:
    return CacheResult.from_json({"pool_tokens": pool, "policy": policy,
                                  "host_pool_tokens": host, "holds": holds, "hit_rate": hit},
                                 "entry")


def test_recommendation_grows_the_pool_first() -> None:
    results = [entry(8192, "lru", 0, False), entry(8192, "lfu", 0, True, 0.9),
               entry(16384, "lru", 0, True), entry(8192, "lru", 16384, True)]
    rec = recommend(results, working_set_peak=12000)
    assert (rec.pool_tokens, rec.policy, rec.host_pool_tokens) == (16384, "lru", 0)


def test_recommendation_adds_a_host_tier_only_inside_its_window() -> None:
    results = [entry(8192, "lru", 0, False), entry(8192, "lru", 4096, True),
               entry(8192, "lru", 16384, True)]
    # working set 12,000: 8,192 + 4,096 = 12,288 holds it: the smaller host tier
    rec = recommend(results, working_set_peak=12000)
    assert rec.host_pool_tokens == 4096
    # working set 20,000: only 16,384 of host is inside the window
    assert recommend(results, working_set_peak=20000).host_pool_tokens == 16384
    # working set below the pool: a host tier is outside its window, never recommended
    rec = recommend(results, working_set_peak=6000)
    assert rec.host_pool_tokens == 0
    assert "nothing swept holds" in rec.reason


def test_recommendation_changes_the_policy_last() -> None:
    results = [entry(8192, "lru", 0, False), entry(16384, "lru", 0, False, 0.7),
               entry(16384, "slru", 0, True, 0.8), entry(16384, "lru", 4096, False)]
    rec = recommend(results, working_set_peak=18000)
    assert (rec.pool_tokens, rec.policy, rec.host_pool_tokens) == (16384, "slru", 0)
    rec = recommend(results, working_set_peak=18000, card_pool_tokens=10000)
    assert "planned pool is 10000" in rec.reason


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(ValueError, match="pool tokens"):
        CacheConfig(0)
    with pytest.raises(ValueError, match="unknown eviction policy"):
        CacheConfig(100, "random")
    with pytest.raises(ValueError, match="host pool"):
        CacheConfig(100, host_pool_tokens=-1)
    with pytest.raises(ValueError, match="turns must be numbered"):
        replay([Turn("a", 2, 0.0, ids([1]), ids([2]))], CacheConfig(100))


def test_the_recommendation_and_the_plan_share_the_host_tier_window() -> None:
    """`chatfleet cache` and `chatfleet plan` turn a host tier on for the same working sets:
    larger than the pool, no larger than pool + host (core/plan.in_host_tier_window)."""
    results = [entry(8192, "lru", 0, False), entry(8192, "lru", 4096, True)]
    for ws in (6000, 8192, 8193, 12288, 12289, 20000):
        picked = recommend(results, working_set_peak=ws).host_pool_tokens == 4096
        assert picked is host_tier(ws, 8192, 4096).enable, ws


def test_the_ceiling_is_the_schedulers_own_tree_when_nothing_is_evicted() -> None:
    """The unbounded pool sees the scheduler's inserts: with a pool nothing fills, every turn's
    hit is its ceiling; with a small pool, no turn hits more than its ceiling."""
    trace = small_synthetic()
    roomy = replay(trace, CacheConfig(unbounded_pool(trace)))
    assert roomy.evicted_tokens == 0
    assert all(o.hit_tokens == o.ceiling_tokens for o in roomy.outcomes)
    tight = replay(trace, CacheConfig(2500))
    assert tight.evicted_tokens > 0
    assert all(o.hit_tokens <= o.ceiling_tokens for o in tight.outcomes)
    assert any(o.returned_tokens > 0 for o in tight.outcomes)
