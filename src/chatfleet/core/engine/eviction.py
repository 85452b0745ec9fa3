"""The eviction order of SGLang's radix cache: each policy's key, and the heap of candidates.

Keys, smallest evicted first, as SGLang's eviction strategies (`mem_cache/evict_policy.py`)
order nodes; each is (rank, time, seq): a rank where the policy has one (0 where not), then a
time, then `seq`, the node creation number, which breaks ties (mru and filo break them newest
first):

- lru: last_access_time; mru: -last_access_time
- fifo: creation_time; filo: -creation_time
- lfu: (hit_count, last_access_time)
- slru: (hit_count >= 2, last_access_time): probationary nodes by LRU, then protected ones
- priority: (priority, last_access_time); a node's priority is the max over its inserts

The same order picks device leaves to evict (`RadixCache.evict`) and host-only leaves to drop
from the host tier (`HiRadixCache`, as SGLang's `evict_host` heaps by the same strategy).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from chatfleet.core.engine.tree_node import TreeNode
from chatfleet.core.errors import ChatfleetError

EVICTION_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "slru", "priority")

SLRU_PROTECTED_HITS = 2  # SGLang's SLRUStrategy protected_threshold

# (rank, time, seq); a policy without a rank puts NO_RANK (one comparison of equal floats more
# per sift than a shorter key, for one shape of entry)
EvictKey = tuple[float, float, int]
NO_RANK = 0.0

# A LeafHeap entry (a plain tuple, built in LeafHeap.push alone: chatfleet/_native.py says why):
# the node's key flat (a nested key tuple is compared twice, for equality then order, at every
# sift), the entry's push number and the node.
LeafEntry = tuple[float, float, int, int, TreeNode]


def lru_key(node: TreeNode) -> EvictKey:
    return (NO_RANK, node.last_access_time, node.seq)


def lfu_key(node: TreeNode) -> EvictKey:
    return (node.hit_count, node.last_access_time, node.seq)


def fifo_key(node: TreeNode) -> EvictKey:
    return (NO_RANK, node.creation_time, node.seq)


def mru_key(node: TreeNode) -> EvictKey:
    return (NO_RANK, -node.last_access_time, -node.seq)


def filo_key(node: TreeNode) -> EvictKey:
    return (NO_RANK, -node.creation_time, -node.seq)


def slru_key(node: TreeNode) -> EvictKey:
    protected = 1 if node.hit_count >= SLRU_PROTECTED_HITS else 0
    return (protected, node.last_access_time, node.seq)


def priority_key(node: TreeNode) -> EvictKey:
    return (node.priority, node.last_access_time, node.seq)


EVICT_KEYS: dict[str, Callable[[TreeNode], EvictKey]] = {
    "lru": lru_key,
    "lfu": lfu_key,
    "fifo": fifo_key,
    "mru": mru_key,
    "filo": filo_key,
    "slru": slru_key,
    "priority": priority_key,
}


def evict_key(policy: str) -> Callable[[TreeNode], EvictKey]:
    """The key of a policy named as SGLang's `--radix-eviction-policy` names it."""
    key = EVICT_KEYS.get(policy)
    if key is None:
        raise ChatfleetError(f"unknown eviction policy {policy!r}; one of {EVICTION_POLICIES}")
    return key


class LeafHeap:
    """Eviction candidates in key order, kept across calls.

    A node's key may change while it waits (an access, a hit): `touch` pushes a fresh entry and
    `pop` skips entries that are stale or whose node is no longer a member. This gives the order
    of a heap built from the current leaves at evict time (SGLang rebuilds one every call),
    without rebuilding it every call.

    An entry is a LeafEntry. `members` maps each member to the push number of its newest
    entry, so an entry is current when its number is its node's: every change of a member's
    key pushes (`RadixCache._touch`), and keys end with the node's unique `seq`, so this is the
    entry whose key is the node's key now."""

    __slots__ = ("_entries", "_num_pushed", "key_of", "members")

    def __init__(self, key_of: Callable[[TreeNode], EvictKey]) -> None:
        self.key_of = key_of
        self.members: dict[TreeNode, int] = {}
        self._entries: list[LeafEntry] = []
        self._num_pushed = 0

    def add(self, node: TreeNode) -> None:
        if node not in self.members:
            self.push(node)

    def discard(self, node: TreeNode) -> None:
        self.members.pop(node, None)

    def touch(self, node: TreeNode) -> None:
        if node in self.members:
            self.push(node)

    def pop(self) -> TreeNode | None:
        members = self.members
        while self._entries:
            _, _, _, pushed, node = heapq.heappop(self._entries)
            if members.get(node, -1) == pushed:
                del members[node]
                return node
        return None

    def clear(self) -> None:
        self.members.clear()
        self._entries.clear()

    def push(self, node: TreeNode) -> None:
        """A fresh entry for a member whose key changed (or that just joined)."""
        heapq.heappush(self._entries, self._entry(node))
        if len(self._entries) > 2 * len(self.members) + 64:  # drop stale entries
            entries = [self._entry(x) for x in list(self.members)]
            heapq.heapify(entries)
            self._entries = entries

    def _entry(self, node: TreeNode) -> LeafEntry:
        """The node's newest entry (it becomes the member's current one)."""
        self._num_pushed += 1
        self.members[node] = self._num_pushed
        rank, time, seq = self.key_of(node)
        return (rank, time, seq, self._num_pushed, node)
