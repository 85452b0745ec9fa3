"""SGLang's host tier (HiCache, `--enable-hierarchical-cache`): a radix tree whose nodes can
keep a copy in host memory, so that a prefix evicted from the device stays matchable and is
loaded back instead of recomputed.

Read from SGLang v0.5 (docs/facts.md#sglang-hicache says which files and commits):
`mem_cache/hiradix_cache.py` (HiRadixCache), `mem_cache/memory_pool_host.py` (the host pool),
`managers/cache_controller.py` (the copies) and `managers/schedule_policy.py` (load-back at
admission). What this module does, by their rules:

- **When a node is written to host** (`_hit`, SGLang's `_inc_hit_count`). An insert through a
  device node (or one that makes a new leaf) counts a hit, unless it comes from a chunk of a
  prefill; a node without a host copy is written once its hits reach the write policy's
  threshold: 1 for `write_through` (SGLang's default: every node, at its first complete
  insert), 2 for `write_through_selective` (only what is reused). `write_back` writes nothing
  on a hit, and counts no hit either (so LFU and SLRU see hit counts of 0 with it): it writes a
  node when it is evicted from the device, and the scheduler waits for that copy
  (`writing_check(write_back=True)`), which the step pays (`take_write_back_tokens`).
- **What the host holds.** A copy stays as long as its node is on the device (the device
  cannot drop it) and after: an evicted node with a copy becomes host-only. With a write-through
  policy the host therefore holds a copy of the device's tree as well as what was evicted from
  it; with write-back it holds what was evicted (and what was loaded back since, whose copy
  stays).
- **What is dropped from host, and when** (`_evict_host`, SGLang's `evict_host`): only when a
  write finds the host pool full. Then host-only leaves are dropped in the eviction policy's
  order (the same strategy as the device's) until the node's size is freed, and the write
  tried again; if there is still no room the node gets no copy (write-through: it is dropped
  when evicted, and written at a later hit; write-back: it is dropped).
- **When a prefix is loaded back** (the scheduler's admission, prefill_adder.py, SGLang's
  `init_load_back`): at admission, when the host-only part of the match is at least
  `LOAD_BACK_THRESHOLD` tokens; all of it or none, after evicting device room for it. The copy
  runs layer by layer beside the prefill that uses it (StepTimeModel.prefill_s).
- **How big the host pool is**: `core/memory.hicache_host_tokens` (`--hicache-ratio` times the
  device pool, or `--hicache-size` GB), larger than the device pool, as SGLang requires.

Not modelled: a node's lock while its copy is in flight (write-through copies run on their own
stream; SGLang keeps the node locked until the copy ends, about 12 ms for 2,048 BF16 tokens of
Qwen3-8B over the L4's link, less than one decode step), and the storage tier (L3) behind the
host.
"""

from __future__ import annotations

from dataclasses import dataclass

from chatfleet.core.engine.radix import RadixCache
from chatfleet.core.engine.tree_node import TreeNode
from chatfleet.core.errors import ChatfleetError

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
DEFAULT_WRITE_POLICY = "write_through"  # SGLang v0.5's --hicache-write-policy default
# hits at which a node without a host copy is written (HiRadixCache.write_through_threshold)
WRITE_THRESHOLDS = {"write_through": 1, "write_through_selective": 2}
LOAD_BACK_THRESHOLD = 10  # HiRadixCache.load_back_threshold: fewer host tokens are recomputed


def check_write_policy(policy: str) -> str:
    if policy not in WRITE_POLICIES:
        raise ChatfleetError(f"unknown HiCache write policy {policy!r}: one of "
                             f"{', '.join(WRITE_POLICIES)}")
    return policy


def check_host_tier(pool_tokens: int, host_pool_tokens: int, write_policy: str) -> None:
    """A host tier SGLang would start with: none (0), or one larger than the device pool
    (memory_pool_host.py asserts "The host memory should be larger than the device memory")."""
    check_write_policy(write_policy)
    if host_pool_tokens < 0:
        raise ChatfleetError(f"the host pool must not be negative, got {host_pool_tokens}")
    if 0 < host_pool_tokens <= pool_tokens:
        raise ChatfleetError(f"the host tier ({host_pool_tokens} tokens) must be larger than "
                             f"the KV pool ({pool_tokens} tokens), as SGLang requires")


@dataclass(frozen=True, slots=True)
class HostTierConfig:
    """The host pool's size in tokens and SGLang's `--hicache-write-policy`."""

    capacity_tokens: int
    write_policy: str = DEFAULT_WRITE_POLICY

    def __post_init__(self) -> None:
        if self.capacity_tokens <= 0:
            raise ChatfleetError(f"the host pool must hold at least one token, got "
                                 f"{self.capacity_tokens}")
        check_write_policy(self.write_policy)


class HiRadixCache(RadixCache):
    """The radix tree with a host tier (see the module docstring)."""

    def __init__(self, policy: str, host: HostTierConfig) -> None:
        super().__init__(policy)
        self.host = host
        self.host_capacity_tokens = host.capacity_tokens
        self.write_back = host.write_policy == "write_back"
        self.write_threshold = WRITE_THRESHOLDS.get(host.write_policy, 0)
        self.num_written_tokens = 0  # device -> host copies, every policy
        self.num_written_back_tokens = 0  # of those, made at eviction (write-back)
        self._pending_write_back_tokens = 0

    def take_write_back_tokens(self) -> int:
        num = self._pending_write_back_tokens
        self._pending_write_back_tokens = 0
        return num

    def _hit(self, node: TreeNode, chunked: bool) -> None:
        if self.write_back or chunked:
            return
        node.hit_count += 1
        if not node.on_host and node.hit_count >= self.write_threshold:
            self._write(node)

    def _off_device(self, node: TreeNode) -> None:
        if not node.on_host and self.write_back and self._write(node):
            self.num_written_back_tokens += len(node.key)
            self._pending_write_back_tokens += len(node.key)
        if not node.on_host:
            super()._off_device(node)  # no copy: dropped
            return
        node.on_device = False
        if not node.children:
            self._host_leaves.add(node)

    def _write(self, node: TreeNode) -> bool:
        """Copy a device node to host (HiCacheController.write); when the pool is short, drop
        host-only leaves for the node's size and try again (write_backup). False: no room."""
        need = len(node.key)
        if self.host_capacity_tokens - self._host_size < need:
            self._evict_host(need)
        if self.host_capacity_tokens - self._host_size < need:
            return False
        node.on_host = True
        self._host_size += need
        self.num_written_tokens += need
        return True

    def _evict_host(self, num_tokens: int) -> int:
        """Drop host-only leaves in the eviction policy's order until `num_tokens` are freed or
        none is left; a host-only parent left without children joins them. Returns the host
        tokens freed."""
        num_freed = 0
        while num_freed < num_tokens:
            x = self._host_leaves.pop()
            if x is None:
                break
            parent = x.parent
            assert parent is not None
            num_freed += self._detach(x)
            if not parent.on_device and not parent.children:
                self._host_leaves.add(parent)
        self.num_host_evicted_tokens += num_freed
        return num_freed


def make_tree(policy: str, host_pool_tokens: int = 0,
              write_policy: str = DEFAULT_WRITE_POLICY) -> RadixCache:
    """The engine's prefix cache: with a host tier when `host_pool_tokens` > 0."""
    if host_pool_tokens > 0:
        return HiRadixCache(policy, HostTierConfig(host_pool_tokens, write_policy))
    return RadixCache(policy)
