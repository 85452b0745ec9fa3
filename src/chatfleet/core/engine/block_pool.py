"""vLLM V1's KV block pool with hash-based prefix caching (read from vLLM 0.26.0,
vllm/v1/core/block_pool.py, kv_cache_utils.py and single_type_kv_cache_manager.py).

- The pool holds `num_gpu_blocks` blocks of `block_size` tokens; one is vLLM's null block,
  never handed out, so `num_usable` = num_gpu_blocks - 1. Usage (`vllm:kv_cache_usage_perc`)
  is 1 - free / usable, where free counts every block in the free queue, cached ones included.
- A full block is cached under a hash chained over the prefix that ends with it: hash(parent
  hash, its 16 token ids). Only full blocks are ever cached (the partial last block never is),
  so a request's cached prefix is the longest run of its leading full blocks whose hashes are
  in the map (FullAttentionManager.find_longest_cache_hit). Two blocks may carry one hash
  (computed twice before either was cached); a lookup takes the first.
- The free queue (FreeKVCacheBlockQueue): allocation pops from its head. A freed block whose
  ref count reaches 0 goes to the tail if it carries a hash (it stays a cache hit until it
  reaches the head and is popped: popping evicts it), to the head if it does not
  (BlockPool.free_blocks). Requests free their blocks last first, so within one request the
  tail blocks are evicted first. A hit on a free cached block takes it out of the queue
  (`touch`); freeing it again puts it back at the tail: least recently used first.

Blocks without a hash carry nothing a later request can find, so they are counted, not kept as
objects: the free queue is `num_empty_free` empty blocks at the head followed by the cached
free blocks in eviction order (an empty block can never sit behind a cached one, because only
unhashed blocks are prepended and a cached block loses its hash only when popped or reset).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from chatfleet.core.errors import ChatfleetError

BLOCK_SIZE = 16  # vLLM's default for full attention on CUDA
ROOT_HASH = 0x5EED_0F_C4A1_F1EE7  # parent of a request's first block (vLLM: NONE_HASH)
TOKEN_BYTES = 8  # token ids as array("q") bytes


@dataclass(slots=True, eq=False, init=False)
class Block:
    """A block that carries a hash (a cached full block). `ref_cnt` counts the requests
    holding it; at 0 it waits in the free queue, still a cache hit."""

    key: int
    ref_cnt: int

    # __init__ written out (init=False): chatfleet/_native.py says why
    def __init__(self, key: int, ref_cnt: int = 0) -> None:
        self.key = key
        self.ref_cnt = ref_cnt


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Token ids as the bytes `chain_keys` reads (8 per token)."""
    return array("q", tokens).tobytes()


def chain_keys(buf: bytes, keys: list[int], upto_blocks: int,
               block_size: int = BLOCK_SIZE) -> list[int]:
    """Extend `keys` (the chained hashes of the first len(keys) full blocks of the tokens in
    `buf`, see token_bytes) to `upto_blocks` blocks, never past the full blocks `buf` holds.
    A block's hash is Python's hash of (parent hash, the block's token ids as one integer):
    deterministic across runs, so the chain is reproducible."""
    width = block_size * TOKEN_BYTES
    upto = min(upto_blocks, len(buf) // width)
    parent = keys[-1] if keys else ROOT_HASH
    from_bytes = int.from_bytes
    append = keys.append
    for start in range(len(keys) * width, upto * width, width):
        parent = hash((parent, from_bytes(buf[start:start + width], "little")))
        append(parent)
    return keys


def common_blocks(a: bytes, b: bytes, most: int, block_size: int = BLOCK_SIZE) -> int:
    """How many leading full blocks two token byte strings share (at most `most`)."""
    width = block_size * TOKEN_BYTES
    lo, hi = 0, min(most, len(a) // width, len(b) // width)
    view = memoryview(b)  # a view's slice copies nothing; startswith is one memcmp
    if a.startswith(view[:hi * width]):
        return hi
    hi -= 1
    while lo < hi:  # binary search on equal prefixes
        mid = (lo + hi + 1) // 2
        if a.startswith(view[:mid * width]):
            lo = mid
        else:
            hi = mid - 1
    return lo


class BlockPool:
    def __init__(self, num_gpu_blocks: int, block_size: int = BLOCK_SIZE) -> None:
        if block_size <= 0:
            raise ChatfleetError("block size must be positive")
        if num_gpu_blocks < 2:
            raise ChatfleetError("the KV pool needs at least 2 blocks (one is vLLM's null block)")
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self.num_usable = num_gpu_blocks - 1
        self.num_empty_free = self.num_usable
        self.cached_free: OrderedDict[Block, None] = OrderedDict()  # head: evicted first
        self.by_key: dict[int, Block] = {}  # the block a lookup finds for a hash
        self.dups: dict[int, list[Block]] = {}  # more blocks that carry the same hash
        self.num_evicted_blocks = 0

    # --- figures ---------------------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        """What vLLM logs as 'GPU KV cache size': every block, the null block included."""
        return self.num_gpu_blocks * self.block_size

    def num_free(self) -> int:
        return self.num_empty_free + len(self.cached_free)

    def num_cached(self) -> int:
        """Blocks that carry a hash (held or free)."""
        return len(self.by_key) + sum(len(v) for v in self.dups.values())

    def cached_blocks(self) -> list[Block]:
        """Every block that carries a hash (for invariant checks)."""
        return [*self.by_key.values(), *(b for v in self.dups.values() for b in v)]

    def usage(self) -> float:
        return 1.0 - self.num_free() / self.num_usable

    # --- prefix cache ----------------------------------------------------------------------
    def longest_hit(self, keys: Sequence[int], max_blocks: int) -> list[Block]:
        """The leading blocks of `keys` found in the cache, at most `max_blocks`: a missing
        block ends the run (the chain makes every later hash differ too)."""
        found = list(map(self.by_key.get, keys[:max_blocks]))  # one C-level pass
        if None in found:
            del found[found.index(None):]
        return found  # type: ignore[return-value]  # no None is left

    @staticmethod
    def num_evictable(blocks: Sequence[Block]) -> int:
        """Of these hit blocks, those waiting in the free queue: taking them uses free blocks."""
        return sum(1 for b in blocks if b.ref_cnt == 0)

    def touch(self, blocks: Sequence[Block]) -> None:
        for b in blocks:
            if b.ref_cnt == 0:
                del self.cached_free[b]
            b.ref_cnt += 1

    def take(self, n: int) -> int:
        """Pop `n` blocks from the head of the free queue for new (unhashed) contents; cached
        blocks popped lose their hash. Returns how many cached blocks were evicted."""
        if n > self.num_free():
            raise ValueError(f"cannot take {n} blocks: {self.num_free()} free")
        empty = min(n, self.num_empty_free)
        self.num_empty_free -= empty
        evicted = n - empty
        popitem = self.cached_free.popitem
        by_key = self.by_key
        for _ in range(evicted):
            block, _ = popitem(last=False)
            if self.dups or by_key[block.key] is not block:
                self._drop_key(block)
            else:  # the common case of _drop_key: the block the map names, no duplicates
                del by_key[block.key]
        self.num_evicted_blocks += evicted
        return evicted

    def cache(self, keys: Sequence[int]) -> list[Block]:
        """Give hashes to blocks a request already holds (taken with `take`): they become
        cached blocks it holds with ref count 1."""
        out = []
        by_key = self.by_key
        for key in keys:
            b = Block(key, 1)
            if key in by_key:
                self.dups.setdefault(key, []).append(b)
            else:
                by_key[key] = b
            out.append(b)
        return out

    def free(self, cached: Sequence[Block], num_unhashed: int) -> None:
        """A request frees its blocks: `cached` (its leading cached blocks, in order) and
        `num_unhashed` blocks after them. Last block first (free_blocks(reversed(...))):
        unhashed ones return to the head as empty blocks, cached ones reaching ref 0 join the
        tail with the request's last block nearest the head."""
        self.num_empty_free += num_unhashed
        tail = self.cached_free
        for b in reversed(cached):
            b.ref_cnt -= 1
            if b.ref_cnt == 0:
                tail[b] = None
            elif b.ref_cnt < 0:
                raise RuntimeError("a block was freed more often than it was taken")

    def reset(self) -> bool:
        """vLLM's reset_prefix_cache: only when no request holds a block."""
        if self.num_free() != self.num_usable:
            return False
        self.by_key.clear()
        self.dups.clear()
        self.cached_free.clear()
        self.num_empty_free = self.num_usable
        return True

    def _drop_key(self, block: Block) -> None:
        key = block.key
        extra = self.dups.get(key)
        if self.by_key[key] is block:
            if extra:
                self.by_key[key] = extra.pop(0)
            else:
                del self.by_key[key]
        else:
            assert extra is not None
            extra.remove(block)
        if extra is not None and not extra:
            del self.dups[key]
