from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.engine.eviction import EVICTION_POLICIES
from chatfleet.core.engine.host_tier import (
    WRITE_POLICIES,
    HiRadixCache,
    HostTierConfig,
    make_tree,
)
from chatfleet.core.engine.radix import RadixCache
from chatfleet.core.engine.tree_node import TreeNode

# ----- helpers -----


def hi(host_tokens: int, policy: str = "lru", write: str = "write_through") -> HiRadixCache:
    return HiRadixCache(policy, HostTierConfig(host_tokens, write))


def walk(cache: RadixCache) -> list[TreeNode]:
    nodes: list[TreeNode] = []
    stack = list(cache.root.children.values())
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    return nodes


def check_invariants(cache: RadixCache) -> None:
    nodes = walk(cache)
    device = [n for n in nodes if n.on_device]
    assert cache.total_size() == cache.evictable_size() + cache.protected_size()
    assert cache.evictable_size() >= 0
    assert cache.protected_size() >= 0
    assert cache.host_size() >= 0
    assert sum(len(n.key) for n in device) == cache.total_size()
    assert sum(len(n.key) for n in device if n.lock_ref > 0) == cache.protected_size()
    assert sum(len(n.key) for n in nodes if n.on_host) == cache.host_size()
    if cache.host_capacity_tokens == 0:
        assert cache.host_size() == 0
        assert all(n.on_device for n in nodes)
    assert cache.host_size() <= cache.host_capacity_tokens
    for node in [cache.root, *nodes]:
        assert all(len(c.key) > 0 for c in node.children.values())
        for first, child in node.children.items():
            assert child.key[0] == first
            assert child.parent is node
            assert child.lock_ref <= node.lock_ref or node is cache.root
            if not node.on_device:  # host-only subtrees
                assert not child.on_device
        assert node.num_device_children == sum(c.on_device for c in node.children.values())
        if not node.on_device:
            assert node.on_host
            assert node.lock_ref == 0
    leaves = {n for n in device if n.lock_ref == 0 and n.num_device_children == 0}
    assert set(cache._device_leaves.members) == leaves
    host_leaves = {n for n in nodes if not n.on_device and not n.children}
    assert set(cache._host_leaves.members) == host_leaves


def evict_order(cache: RadixCache, names: dict[int, str]) -> list[str]:
    """Evict one leaf at a time; leaves have distinct lengths so the freed count names them."""
    order = []
    while cache.evictable_size() > 0:
        order.append(names[cache.evict(1, now=100.0)])
    return order


# ----- match / insert -----


def test_empty_match_returns_root() -> None:
    cache = RadixCache()
    m = cache.match_prefix([1, 2, 3], now=0.0)
    assert m.node is cache.root
    assert (m.device_len, m.host_len) == (0, 0)
    assert cache.match_prefix([], now=0.0).node is cache.root


def test_insert_counts_only_new_tokens() -> None:
    cache = RadixCache()
    assert cache.insert([1, 2, 3, 4], now=0.0) == 4
    assert cache.insert([1, 2, 3, 4], now=1.0) == 0
    assert cache.insert([1, 2, 5, 6, 7], now=2.0) == 3
    assert cache.insert((1, 2), now=3.0) == 0
    assert cache.insert(range(10, 20), now=4.0) == 10
    assert cache.total_size() == 17
    check_invariants(cache)


def test_match_prefix_splits_node() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5], now=0.0)
    assert len(cache.root.children) == 1
    m = cache.match_prefix([1, 2, 3, 9], now=1.0)
    assert m.device_len == 3
    assert m.host_len == 0
    assert list(m.node.key) == [1, 2, 3]
    assert [list(c.key) for c in m.node.children.values()] == [[4, 5]]
    assert m.node.last_access_time == 1.0
    assert cache.total_size() == 5
    # a query that ends inside a node splits it too
    m = cache.match_prefix([1, 2], now=2.0)
    assert list(m.node.key) == [1, 2]
    assert m.device_len == 2
    # a match on the whole path
    m = cache.match_prefix([1, 2, 3, 4, 5, 6], now=3.0)
    assert m.device_len == 5
    assert list(m.node.key) == [4, 5]
    check_invariants(cache)


def test_match_updates_access_time_but_not_hit_count() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3], now=0.0)
    node = cache.match_prefix([1, 2, 3], now=5.0).node
    assert node.last_access_time == 5.0
    assert node.hit_count == 1
    cache.insert([1, 2, 3], now=6.0)
    assert node.hit_count == 2
    cache.insert([1, 2, 3], now=7.0, chunked=True)
    assert node.hit_count == 2
    assert node.last_access_time == 7.0


def test_long_keys_match_without_token_loops() -> None:
    cache = RadixCache()
    prefix = list(range(100_000, 110_000))
    cache.insert([*prefix, 1, 2, 3], now=0.0)
    assert cache.match_prefix([*prefix[:7_777], -1], now=1.0).device_len == 7_777
    assert cache.match_prefix([*prefix, 1, 2, 4], now=2.0).device_len == 10_002
    assert cache.insert([*prefix[:5_000], 7], now=3.0) == 1
    check_invariants(cache)


# ----- locking -----


def test_locking_protects_from_eviction() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], now=0.0)
    cache.insert([1, 2, 5, 6], now=1.0)
    node = cache.match_prefix([1, 2, 3, 4], now=2.0).node
    assert cache.inc_lock_ref(node) == -4  # [1, 2] and [3, 4]
    assert cache.inc_lock_ref(node) == 0
    assert (cache.protected_size(), cache.evictable_size()) == (4, 2)
    assert cache.evict(100, now=3.0) == 2  # only [5, 6]
    assert cache.total_size() == 4
    assert cache.match_prefix([1, 2, 3, 4], now=4.0).device_len == 4
    assert cache.dec_lock_ref(node) == 0
    assert cache.dec_lock_ref(node) == 4
    with pytest.raises(ValueError):
        cache.dec_lock_ref(node)
    assert cache.evict(1, now=5.0) == 2  # [3, 4]
    assert cache.evict(1, now=5.0) == 2  # its parent [1, 2] became a leaf
    assert cache.total_size() == 0
    check_invariants(cache)


def test_lock_survives_split() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], now=0.0)
    node = cache.match_prefix([1, 2, 3, 4], now=1.0).node
    cache.inc_lock_ref(node)
    cache.match_prefix([1, 2, 9], now=2.0)  # splits the locked node
    check_invariants(cache)
    assert cache.protected_size() == 4
    assert cache.dec_lock_ref(node) == 4
    check_invariants(cache)


def test_parent_becomes_candidate_after_its_leaves() -> None:
    cache = RadixCache("lru")
    cache.insert([1, 1, 1, 2], now=0.0)  # shared [1, 1, 1] old, then two leaves
    cache.insert([1, 1, 1, 3, 3], now=1.0)
    cache.insert([7, 7, 7, 7, 7, 7], now=2.0)
    # [1,1,1] was accessed at 1.0, older than [7]*6, yet it goes only after both its leaves
    assert cache.evict(1, now=3.0) == 1  # [2]
    assert cache.evict(1, now=3.0) == 2  # [3, 3]
    assert cache.evict(1, now=3.0) == 3  # [1, 1, 1], now a leaf
    assert cache.evict(1, now=3.0) == 6
    check_invariants(cache)


def test_evict_frees_at_least_requested() -> None:
    cache = RadixCache()
    for i in range(5):
        cache.insert([i] * 10, now=float(i))
    assert cache.evict(15, now=9.0) == 20
    assert cache.evict(0, now=9.0) == 0
    assert cache.num_evicted_tokens == 20
    assert cache.total_size() == 30


# ----- policies -----


def build_policy_scenario(policy: str) -> tuple[RadixCache, dict[int, str]]:
    """Four leaves A..D (lengths 1..4) whose orders differ under every policy.

    Final state: A(hits 1, access 7, created 0, prio 2), B(hits 3, access 6, created 1, prio 0),
    C(hits 1, access 5, created 2, prio 1), D(hits 2, access 8, created 3, prio 0).
    """
    cache = RadixCache(policy)
    a, b, c, d = [10], [20, 21], [30, 31, 32], [40, 41, 42, 43]
    cache.insert(a, now=0.0, priority=2)
    cache.insert(b, now=1.0)
    cache.insert(c, now=2.0, priority=1)
    cache.insert(d, now=3.0)
    cache.insert(b, now=4.0)
    cache.match_prefix(c, now=5.0)
    cache.insert(b, now=6.0)
    cache.match_prefix(a, now=7.0)
    cache.insert(d, now=8.0)
    return cache, {1: "A", 2: "B", 3: "C", 4: "D"}


EXPECTED_ORDERS = {
    "lru": ["C", "B", "A", "D"],  # last access 5, 6, 7, 8
    "mru": ["D", "A", "B", "C"],
    "fifo": ["A", "B", "C", "D"],  # created 0, 1, 2, 3
    "filo": ["D", "C", "B", "A"],
    "lfu": ["C", "A", "D", "B"],  # hits 1, 1, 2, 3 (ties by LRU)
    "slru": ["C", "A", "B", "D"],  # probationary C, A by LRU; then protected B, D by LRU
    "priority": ["B", "D", "C", "A"],  # priority 0, 0, 1, 2 (ties by LRU)
}


def test_expected_orders_all_differ() -> None:
    orders = [tuple(o) for o in EXPECTED_ORDERS.values()]
    assert len(set(orders)) == len(EVICTION_POLICIES) == len(orders)


@pytest.mark.parametrize("policy", EVICTION_POLICIES)
def test_policy_eviction_order(policy: str) -> None:
    cache, names = build_policy_scenario(policy)
    assert evict_order(cache, names) == EXPECTED_ORDERS[policy]
    assert cache.total_size() == 0


def test_priority_is_max_over_inserts_and_inherited_by_split() -> None:
    cache = RadixCache("priority")
    cache.insert([1, 2, 3, 4], now=0.0, priority=5)
    cache.insert([1, 2, 7], now=1.0, priority=1)
    shared = cache.match_prefix([1, 2], now=2.0).node
    assert shared.priority == 5
    assert cache.match_prefix([1, 2, 7], now=2.0).node.priority == 1


def test_mru_ties_break_deterministically() -> None:
    orders = []
    for _ in range(2):
        cache = RadixCache("mru")
        for i in range(1, 5):
            cache.insert([i] * i, now=0.0)
        orders.append([cache.evict(1, now=1.0) for _ in range(4)])
    assert orders[0] == orders[1] == [4, 3, 2, 1]


def test_bad_policy_and_size() -> None:
    with pytest.raises(ValueError):
        RadixCache("random")
    with pytest.raises(ValueError):
        HostTierConfig(-1)
    with pytest.raises(ValueError, match="write policy"):
        HostTierConfig(10, "write_around")
    assert RadixCache("LRU").policy == "lru"


# ----- host tier -----


def test_host_tier_keeps_evicted_prefix_matchable() -> None:
    cache = hi(100)
    seq = list(range(10))
    assert cache.insert(seq, now=0.0) == 10
    assert cache.host_size() == 10  # write-through
    assert cache.evict(10, now=1.0) == 10
    assert cache.total_size() == 0
    assert cache.host_size() == 10
    m = cache.match_prefix([*seq[:6], 99], now=2.0)
    assert (m.device_len, m.host_len) == (0, 6)
    assert m.node is cache.root
    assert m.host_node is not None
    with pytest.raises(ValueError):
        cache.inc_lock_ref(m.host_node)
    check_invariants(cache)
    assert cache.load_back(m, now=3.0) == 6
    assert (m.device_len, m.host_len, m.host_node) == (6, 0, None)
    assert cache.total_size() == 6
    assert cache.num_loaded_back_tokens == 6
    assert cache.inc_lock_ref(m.node) == -6
    m2 = cache.match_prefix(seq, now=4.0)
    assert (m2.device_len, m2.host_len) == (6, 4)
    check_invariants(cache)
    cache.dec_lock_ref(m.node)


def test_insert_brings_host_only_nodes_back() -> None:
    cache = hi(100)
    cache.insert([1, 2, 3, 4], now=0.0)
    cache.evict(4, now=1.0)
    assert cache.insert([1, 2, 3, 4, 5], now=2.0) == 5
    m = cache.match_prefix([1, 2, 3, 4, 5], now=3.0)
    assert (m.device_len, m.host_len) == (5, 0)
    check_invariants(cache)


def test_host_capacity_respected_with_lru_host_eviction() -> None:
    cache = hi(10)
    cache.insert([1] * 6, now=0.0)
    cache.evict(6, now=1.0)  # [1]*6 is host-only now
    assert cache.host_size() == 6
    cache.insert([2] * 4, now=2.0)  # fits: host 10
    cache.evict(4, now=3.0)
    cache.match_prefix([2] * 4, now=4.0)  # [2]*4 more recently used than [1]*6
    cache.insert([3] * 5, now=5.0)  # needs 5: drops the LRU host-only leaf [1]*6
    assert cache.host_size() == 9
    assert cache.match_prefix([1] * 6, now=6.0).host_len == 0
    assert cache.match_prefix([2] * 4, now=6.0).host_len == 4
    # larger than the host: as SGLang's write_backup, the write first drops host-only leaves
    # for its size ([2]*4; [3]*5 is still on the device) and then finds no room anyway
    cache.insert([4] * 11, now=7.0)
    assert cache.host_size() == 5
    assert cache.num_host_evicted_tokens == 10
    cache.evict(100, now=8.0)
    assert cache.total_size() == 0
    assert cache.match_prefix([4] * 11, now=9.0).host_len == 0
    assert cache.match_prefix([2] * 4, now=9.0).host_len == 0
    assert cache.match_prefix([3] * 5, now=9.0).host_len == 5
    check_invariants(cache)


def test_no_host_tier_drops_evicted_nodes() -> None:
    cache = RadixCache()
    cache.insert([1, 2, 3], now=0.0)
    cache.evict(3, now=1.0)
    m = cache.match_prefix([1, 2, 3], now=2.0)
    assert (m.device_len, m.host_len) == (0, 0)
    assert walk(cache) == []


def test_evicting_node_without_host_copy_drops_host_only_children() -> None:
    cache = hi(4)
    cache.insert([1, 2, 3, 4, 5, 6], now=0.0)  # larger than the host: no copy
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], now=1.0)  # [7, 8] is copied
    assert cache.host_size() == 2
    assert cache.evict(1, now=2.0) == 2  # [7, 8] is host-only now
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8], now=3.0)
    assert (m.device_len, m.host_len) == (6, 2)
    assert cache.evict(1, now=4.0) == 6  # dropped, and [7, 8] with it
    assert cache.host_size() == 0
    assert cache.num_host_evicted_tokens == 2
    assert walk(cache) == []
    with pytest.raises(ValueError):
        cache.load_back(m, now=5.0)


def test_stale_match_is_rejected() -> None:
    cache = hi(4)
    cache.insert([1, 2, 3, 4], now=0.0)
    cache.evict(4, now=1.0)
    m = cache.match_prefix([1, 2, 3, 4], now=2.0)
    cache.insert([5, 6, 7, 8], now=3.0)  # write-through drops the host-only [1, 2, 3, 4]
    with pytest.raises(ValueError):
        cache.load_back(m, now=4.0)


# ----- reset -----


def test_reset() -> None:
    cache = hi(50)
    cache.insert([4, 5], now=0.0)
    cache.insert([1, 2, 3], now=1.0)
    assert cache.evict(2, now=2.0) == 2  # [4, 5] kept on host
    node = cache.match_prefix([1, 2, 3], now=3.0).node
    assert list(node.key) == [1, 2, 3]
    cache.inc_lock_ref(node)
    with pytest.raises(RuntimeError):
        cache.reset()
    cache.dec_lock_ref(node)
    cache.reset()
    assert (cache.total_size(), cache.evictable_size(), cache.host_size()) == (0, 0, 0)
    m = cache.match_prefix([4, 5], now=4.0)
    assert (m.device_len, m.host_len) == (0, 0)
    assert cache.num_evicted_tokens == 2  # counters are cumulative
    with pytest.raises(ValueError):
        cache.inc_lock_ref(node)  # from the old tree
    check_invariants(cache)


# ----- property tests -----

Op = tuple[object, ...]
Running = list[tuple[TreeNode, list[int]]]  # locked node and its device prefix


def apply_op(cache: RadixCache, running: Running, op: Op, t: float) -> None:
    before = cache.total_size()
    if op[0] == "insert":
        _, tokens, prio, chunked = op
        assert isinstance(tokens, list) and isinstance(prio, int)
        added = cache.insert(tokens, t, priority=prio, chunked=bool(chunked))
        assert added == cache.total_size() - before
        assert cache.match_prefix(tokens, t).device_len == len(tokens)
    elif op[0] == "run":  # admit a request: match, maybe load back, lock; maybe insert
        _, tokens, load, do_insert = op
        assert isinstance(tokens, list)
        m = cache.match_prefix(tokens, t)
        assert m.device_len + m.host_len <= len(tokens)
        assert (m.host_node is None) == (m.host_len == 0)
        if load and m.host_len:
            host_len = m.host_len
            assert cache.load_back(m, t) == host_len == cache.total_size() - before
        if do_insert:
            cache.insert(tokens, t)
            m = cache.match_prefix(tokens, t)
        evictable = cache.evictable_size()
        assert cache.inc_lock_ref(m.node) == cache.evictable_size() - evictable
        running.append((m.node, tokens[: m.device_len]))
    elif op[0] == "finish" and running:
        idx = op[1]
        assert isinstance(idx, int)
        node, _ = running.pop(idx % len(running))
        evictable = cache.evictable_size()
        assert cache.dec_lock_ref(node) == cache.evictable_size() - evictable
    elif op[0] == "evict":
        n = op[1]
        assert isinstance(n, int)
        protected = cache.protected_size()
        leaves = cache._device_leaves.members
        first = min(leaves, key=cache._evict_key) if leaves else None
        freed = cache.evict(n, t)
        assert freed >= 0
        assert cache.total_size() == before - freed
        assert freed >= n or cache.evictable_size() == 0
        assert cache.protected_size() == protected
        if first is not None and n > 0:
            assert not first.on_device or first.parent is None  # policy order
        for node, prefix in running:
            assert node.on_device
            assert cache.match_prefix(prefix, t).device_len >= len(prefix)
    elif op[0] == "match":
        tokens = op[1]
        assert isinstance(tokens, list)
        cache.match_prefix(tokens, t)
        assert cache.total_size() == before
    check_invariants(cache)


def drain(cache: RadixCache, running: Running) -> None:
    for node, _ in running:
        cache.dec_lock_ref(node)
    assert cache.protected_size() == 0
    cache.evict(10**9, 1e9)
    assert cache.total_size() == 0
    check_invariants(cache)
    cache.reset()
    check_invariants(cache)


tokens_st = st.lists(st.integers(0, 2), min_size=0, max_size=8)
op_st = st.one_of(
    st.tuples(st.just("insert"), tokens_st, st.integers(0, 2), st.booleans()),
    st.tuples(st.just("run"), tokens_st, st.booleans(), st.booleans()),
    st.tuples(st.just("finish"), st.integers(0, 100)),
    st.tuples(st.just("evict"), st.integers(0, 20)),
    st.tuples(st.just("match"), tokens_st),
)


@settings(max_examples=300, deadline=None)
@given(
    policy=st.sampled_from(EVICTION_POLICIES),
    host_capacity=st.sampled_from([0, 6, 20, 1000]),
    write=st.sampled_from(WRITE_POLICIES),
    ops=st.lists(op_st, max_size=40),
)
def test_random_operations_keep_sizes_consistent(
    policy: str, host_capacity: int, write: str, ops: list[Op]
) -> None:
    cache = make_tree(policy, host_capacity, write)
    running: Running = []
    for now, op in enumerate(ops):
        apply_op(cache, running, op, float(now))
    drain(cache, running)


@settings(max_examples=60, deadline=None)
@given(
    policy=st.sampled_from(EVICTION_POLICIES),
    host_capacity=st.sampled_from([0, 8, 30]),
    write=st.sampled_from(WRITE_POLICIES),
    rng=st.randoms(use_true_random=False),
)
def test_long_random_walks_keep_sizes_consistent(
    policy: str, host_capacity: int, write: str, rng: random.Random
) -> None:
    """Longer runs than the op lists above, with a shared prefix, so that host-only nodes,
    load-backs and host eviction happen often, under every write policy."""
    cache = make_tree(policy, host_capacity, write)
    running: Running = []
    prefixes = [[rng.randrange(3) for _ in range(rng.randrange(1, 6))] for _ in range(4)]

    def tokens() -> list[int]:
        return [*rng.choice(prefixes), *(rng.randrange(3) for _ in range(rng.randrange(6)))]

    for now in range(200):
        kind = rng.choice(["insert", "run", "run", "finish", "evict", "evict", "match"])
        op: Op
        if kind == "insert":
            op = (kind, tokens(), rng.randrange(3), rng.random() < 0.2)
        elif kind == "run":
            op = (kind, tokens(), rng.random() < 0.8, rng.random() < 0.5)
        elif kind == "finish" or len(running) > 3:
            op = ("finish", rng.randrange(100))
        elif kind == "evict":
            op = (kind, rng.randrange(12))
        else:
            op = (kind, tokens())
        apply_op(cache, running, op, float(now))
    drain(cache, running)
