"""SGLang's radix prefix cache, counting KV slots (page size 1): the tree, its locks and its
device eviction. The eviction order is `eviction.py`'s; the host tier (HiCache), which decides
when a node is copied to host memory and which host copies are dropped, is `host_tier.py`'s
`HiRadixCache`, a subclass of this one, as SGLang's HiRadixCache subclasses its RadixCache.

The tree does not allocate memory: it tracks how many device KV slots its nodes hold. The
engine's KV pool asks `evictable_size()` and calls `evict(n, now)` when it needs free slots.

Every device token in the tree is either protected (its node is locked by a running request,
`inc_lock_ref`) or evictable, so `total_size() == evictable_size() + protected_size()`.

Semantics follow SGLang's RadixCache:

- `match_prefix` refreshes `last_access_time` of every node it walks through and splits a node
  when the match ends inside it. Hit counts are bumped by `insert` (as SGLang does when a request
  is cached), not by `match_prefix`; an insert with `chunked=True` does not bump them (`_hit`,
  which the host tier overrides: its write policy acts on the hit).
- `insert` takes the max of the request priority along the path.
- `evict` removes unlocked device leaves in policy order until enough tokens are freed; a parent
  that becomes a leaf joins the candidates. The order is that of SGLang's heap built from the
  current leaves at evict time; here the heap persists across calls (`eviction.LeafHeap`).
  What becomes of an evicted node is `_off_device`'s: without a host tier it is dropped.

A node is on the device, or host-only (`on_device` False, `on_host` True: only a host tier
makes such nodes, and then its whole subtree is host-only). `match_prefix` reports the
host-only part of a match as `host_len`; `load_back` (or an `insert` through it, which takes
the request's freshly computed KV, as SGLang's does) brings it back to the device. A node
dropped from the device takes its host-only subtree with it.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

from chatfleet.core.engine.eviction import LeafHeap, evict_key
from chatfleet.core.engine.request import as_tokens
from chatfleet.core.engine.tree_node import TreeNode


class MatchResult:
    """A prefix match (a plain class, as every admission matches: chatfleet/_native.py says
    why)."""

    __slots__ = ("device_len", "host_len", "host_node", "node")

    def __init__(self, node: TreeNode, device_len: int, host_len: int,
                 host_node: TreeNode | None = None) -> None:
        self.node = node  # deepest matched device node (root if none): lock/unlock/insert
        self.device_len = device_len  # prefix tokens resident on the device
        self.host_len = host_len  # further prefix tokens held only on host (need load_back)
        self.host_node = host_node  # deepest matched host-only node; None when host_len == 0

    def __repr__(self) -> str:
        return (f"MatchResult(device_len={self.device_len}, host_len={self.host_len}, "
                f"node={self.node!r})")


def _common_prefix_len(node_key: array[int], tokens: array[int], pos: int) -> int:
    """Length of the common prefix of node_key and tokens[pos:], by slice comparisons.

    The caller found the node by its first token, so at least 1 token matches."""
    hi = len(node_key)
    if hi <= len(tokens) - pos:
        if node_key == tokens[pos : pos + hi]:
            return hi
    else:
        hi = len(tokens) - pos
        if node_key[:hi] == tokens[pos:]:
            return hi
    lo = 1  # invariant: node_key[:lo] matches; the mismatch is in [lo, hi)
    hi -= 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if node_key[lo:mid] == tokens[pos + lo : pos + mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class RadixCache:
    """The device tree (no host tier: `host_tier.HiRadixCache` adds one)."""

    def __init__(self, policy: str = "lru") -> None:
        policy = policy.lower()
        self.policy = policy
        self._evict_key = evict_key(policy)
        self.host_capacity_tokens = 0  # the host tier's (HiRadixCache sets it)
        self.num_evicted_tokens = 0  # device tokens evicted (moved to host or dropped)
        self.num_loaded_back_tokens = 0
        self.num_host_evicted_tokens = 0  # host copies dropped
        self._next_seq = 0
        self.root = self._new_node(array("q"), None, 0.0)
        self._evictable_size = 0
        self._protected_size = 0
        self._host_size = 0
        self._device_leaves = LeafHeap(self._evict_key)  # unlocked, on device, no device child
        self._host_leaves = LeafHeap(self._evict_key)  # host-only, no children
        self.reset()

    # ----- sizes -----

    def total_size(self) -> int:
        return self._evictable_size + self._protected_size

    def evictable_size(self) -> int:
        return self._evictable_size

    def protected_size(self) -> int:
        return self._protected_size

    def host_size(self) -> int:
        return self._host_size

    @property
    def has_host_tier(self) -> bool:
        return self.host_capacity_tokens > 0

    def reset(self) -> None:
        """flush_cache: drop every node, device and host. Cumulative counters are kept."""
        if self._protected_size > 0:
            raise RuntimeError(f"cannot reset: {self._protected_size} tokens are locked")
        self.root = self._new_node(array("q"), None, 0.0)
        self.root.lock_ref = 1  # never evicted, never counted
        self.root.on_host = True
        self._evictable_size = 0
        self._protected_size = 0
        self._host_size = 0
        self._device_leaves.clear()
        self._host_leaves.clear()

    # ----- match / insert -----

    def match_prefix(self, tokens: Sequence[int], now: float) -> MatchResult:
        key = as_tokens(tokens)
        node = self.root
        node.last_access_time = now
        pos = 0
        device_node, device_len = node, 0
        while pos < len(key):  # after a split the next lookup misses (or pos == len(key))
            child = node.children.get(key[pos])
            if child is None:
                break
            child.last_access_time = now
            self._touch(child)
            num_matched = _common_prefix_len(child.key, key, pos)
            if num_matched < len(child.key):
                child = self._split(child, num_matched, now)
            node = child
            pos += num_matched
            if node.on_device:
                device_node, device_len = node, pos
        host_node = node if pos > device_len else None
        return MatchResult(device_node, device_len, pos - device_len, host_node)

    def insert(
        self, tokens: Sequence[int], now: float, priority: int = 0, chunked: bool = False
    ) -> int:
        """Cache tokens; returns the device tokens added (host-only nodes brought back count).

        `chunked=True` (a chunked-prefill step) does not bump hit counts, as in SGLang."""
        return self.insert_node(tokens, now, priority, chunked)[0]

    def insert_node(
        self, tokens: Sequence[int], now: float, priority: int = 0, chunked: bool = False
    ) -> tuple[int, TreeNode]:
        """`insert`, also returning the node that ends the inserted sequence (to lock it)."""
        self.root.last_access_time = now
        return self._insert_from(self.root, as_tokens(tokens), now, priority, chunked)

    def insert_below(
        self, node: TreeNode, tokens: Sequence[int], now: float, priority: int = 0,
        chunked: bool = False,
    ) -> tuple[int, TreeNode]:
        """`insert_node(path(node) + tokens)` without comparing the path again: `node` must be a
        device node in the tree (a running request's locked prefix). The path's nodes get what
        an insert through them gets: access time, priority, a hit (`_hit`)."""
        if not node.on_device:
            raise ValueError(f"{node} is host-only: load_back before inserting below it")
        x = node
        while x is not self.root:
            x.last_access_time = now
            x.priority = max(x.priority, priority)
            self._hit(x, chunked)
            self._touch(x)
            if x.parent is None:
                raise ValueError(f"{node} is no longer in the tree (evicted or reset)")
            x = x.parent
        self.root.last_access_time = now
        return self._insert_from(node, as_tokens(tokens), now, priority, chunked)

    def _insert_from(
        self, node: TreeNode, key: array[int], now: float, priority: int, chunked: bool
    ) -> tuple[int, TreeNode]:
        pos = 0
        num_new = 0
        while pos < len(key):
            child = node.children.get(key[pos])
            if child is None:
                break
            child.last_access_time = now
            num_matched = _common_prefix_len(child.key, key, pos)
            if num_matched < len(child.key):
                self._touch(child)  # the tail, maybe a leaf, was accessed too
                child = self._split(child, num_matched, now)
            child.priority = max(child.priority, priority)
            if child.on_device:
                self._hit(child, chunked)
            else:  # it takes the request's freshly computed KV, and no hit (as SGLang's insert)
                num_new += self._move_to_device(child)
            self._touch(child)
            node = child
            pos += num_matched
        if pos < len(key):
            node = self._add_leaf(node, key[pos:], now, priority, chunked)
            num_new += len(node.key)
        return num_new, node

    # ----- locking -----

    def inc_lock_ref(self, node: TreeNode) -> int:
        """Lock node and its ancestors; returns the change in evictable size (<= 0)."""
        self._check_attached(node)
        if not node.on_device:
            raise ValueError(f"{node} is host-only: load_back before locking it")
        delta = 0
        self._device_leaves.discard(node)
        x = node
        while x is not self.root:
            if x.lock_ref == 0:
                delta -= len(x.key)
            x.lock_ref += 1
            assert x.parent is not None
            x = x.parent
        self._evictable_size += delta
        self._protected_size -= delta
        return delta

    def dec_lock_ref(self, node: TreeNode) -> int:
        """Unlock node and its ancestors; returns the change in evictable size (>= 0)."""
        if node is self.root:
            return 0
        if node.lock_ref <= 0:
            raise ValueError(f"{node} is not locked")
        delta = 0
        x = node
        while x is not self.root:
            x.lock_ref -= 1
            if x.lock_ref == 0:
                delta += len(x.key)
            assert x.parent is not None
            x = x.parent
        self._evictable_size += delta
        self._protected_size -= delta
        self._update_evictable_leaf(node)
        return delta

    # ----- eviction / load-back -----

    def evict(self, num_tokens: int, now: float) -> int:
        """Evict unlocked device leaves in policy order until num_tokens are freed or nothing is
        evictable; returns the device tokens freed (what becomes of each node: `_off_device`).
        `now` does not change any node."""
        num_freed = 0
        while num_freed < num_tokens:
            x = self._device_leaves.pop()
            if x is None:
                break
            parent = x.parent
            assert parent is not None
            num_freed += len(x.key)
            self._evictable_size -= len(x.key)
            parent.num_device_children -= 1
            self._off_device(x)
            if self._is_evictable_leaf(parent):
                self._device_leaves.add(parent)
        self.num_evicted_tokens += num_freed
        return num_freed

    def load_back(self, match: MatchResult, now: float) -> int:
        """Bring the host-only part of a match back to the device; returns the tokens loaded
        (the scheduler prices the copy: StepTimeModel.prefill_s).

        The caller must have room for them, and should lock `match.node` before evicting to
        make that room (else it may be evicted too, and then loaded back here as well). The match
        is updated in place: `node` becomes the deepest matched node, `host_len` 0."""
        if match.host_node is None:
            return 0
        self._check_attached(match.host_node)
        chain: list[TreeNode] = []
        x = match.host_node
        while not x.on_device:
            chain.append(x)
            assert x.parent is not None
            x = x.parent
        num_loaded = 0
        for x in reversed(chain):
            x.last_access_time = now
            num_loaded += self._move_to_device(x)
        self.num_loaded_back_tokens += num_loaded
        match.node = match.host_node
        match.device_len += match.host_len
        match.host_len = 0
        match.host_node = None
        return num_loaded

    def take_write_back_tokens(self) -> int:
        """Tokens written to host by evictions since the last call, which the scheduler waited
        for (only a write-back host tier writes at eviction: HiRadixCache)."""
        return 0

    # ----- what a host tier changes (HiRadixCache overrides these) -----

    def _hit(self, node: TreeNode, chunked: bool) -> None:
        """An insert went through (or made) a device node: a hit, unless it was a chunk."""
        if not chunked:
            node.hit_count += 1

    def _off_device(self, node: TreeNode) -> None:
        """An evicted node (its device slots already counted free): without a host tier it is
        dropped, with whatever host-only subtree it has."""
        self.num_host_evicted_tokens += self._detach(node)

    # ----- helpers -----

    def _new_node(
        self, key: array[int], parent: TreeNode | None, now: float, priority: int = 0
    ) -> TreeNode:
        self._next_seq += 1
        return TreeNode(key, parent, now, self._next_seq, priority)

    def _add_leaf(
        self, parent: TreeNode, key: array[int], now: float, priority: int, chunked: bool
    ) -> TreeNode:
        leaf = self._new_node(key, parent, now, priority)
        parent.children[key[0]] = leaf
        parent.num_device_children += 1
        self._device_leaves.discard(parent)
        self._hit(leaf, chunked)  # before it joins the candidates: its key may hold the count
        self._device_leaves.add(leaf)
        self._evictable_size += len(key)
        return leaf

    def _split(self, child: TreeNode, split_len: int, now: float) -> TreeNode:
        """child -> new_node (first split_len tokens) -> child (the rest). Sizes are unchanged."""
        parent = child.parent
        assert parent is not None
        new_node = self._new_node(child.key[:split_len], parent, now, child.priority)
        new_node.lock_ref = child.lock_ref
        new_node.hit_count = child.hit_count
        new_node.on_device = child.on_device
        new_node.on_host = child.on_host
        new_node.num_device_children = 1 if child.on_device else 0
        child.key = child.key[split_len:]
        child.parent = new_node
        new_node.children[child.key[0]] = child
        parent.children[new_node.key[0]] = new_node
        return new_node

    def _move_to_device(self, node: TreeNode) -> int:
        """A host-only node (whose parent is on device) comes back to the device, unlocked."""
        parent = node.parent
        assert parent is not None and parent.on_device and node.lock_ref == 0
        node.on_device = True
        parent.num_device_children += 1
        self._device_leaves.discard(parent)
        self._host_leaves.discard(node)
        self._device_leaves.add(node)  # no device child yet
        self._evictable_size += len(node.key)
        return len(node.key)

    def _detach(self, node: TreeNode) -> int:
        """Remove node (off device by now) and its host-only subtree; returns host tokens freed."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.key[0]]
        node.parent = None
        num_freed = 0
        stack = [node]
        while stack:
            x = stack.pop()
            if x.on_host:
                num_freed += len(x.key)
            self._host_leaves.discard(x)
            stack.extend(x.children.values())
        self._host_size -= num_freed
        return num_freed

    def _is_evictable_leaf(self, node: TreeNode) -> bool:
        return (
            node.on_device
            and node.lock_ref == 0
            and node.num_device_children == 0
            and node is not self.root
        )

    def _update_evictable_leaf(self, node: TreeNode) -> None:
        if self._is_evictable_leaf(node):
            self._device_leaves.add(node)
        else:
            self._device_leaves.discard(node)

    def _touch(self, node: TreeNode) -> None:
        """Call after changing a node's access time, hit count or priority."""
        if node in self._device_leaves.members:
            self._device_leaves.push(node)
        if node in self._host_leaves.members:
            self._host_leaves.push(node)

    def _check_attached(self, node: TreeNode) -> None:
        x = node
        while x.parent is not None:
            x = x.parent
        if x is not self.root:
            raise ValueError(f"{node} is no longer in the tree (evicted or reset)")
