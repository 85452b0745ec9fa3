"""A node of the radix prefix cache (radix.py): a run of tokens, where its KV is (device,
host), and what the eviction order (eviction.py) reads: access and creation times, hits,
priority, and the creation number that breaks ties."""

from __future__ import annotations

from array import array


class TreeNode:
    """A run of tokens. `on_device`: its KV slots are in the device pool; `on_host`: a copy is in
    the host tier. Every node in the tree is on device, or host-only (then so is its subtree)."""

    __slots__ = (
        "children",
        "creation_time",
        "hit_count",
        "key",
        "last_access_time",
        "lock_ref",
        "num_device_children",
        "on_device",
        "on_host",
        "parent",
        "priority",
        "seq",
    )

    def __init__(
        self, key: array[int], parent: TreeNode | None, now: float, seq: int, priority: int = 0
    ) -> None:
        self.key = key
        self.parent = parent  # None for the root and for nodes removed from the tree
        self.children: dict[int, TreeNode] = {}  # keyed by first token
        self.lock_ref = 0
        self.hit_count = 0
        self.priority = priority
        self.creation_time = now
        self.last_access_time = now
        self.seq = seq
        self.on_device = True
        self.on_host = False
        self.num_device_children = 0

    def __repr__(self) -> str:
        where = "device" if self.on_device else "host"
        return f"TreeNode(seq={self.seq}, len={len(self.key)}, {where}, lock_ref={self.lock_ref})"
