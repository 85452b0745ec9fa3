"""vLLM V1's KV cache manager (0.26.0: vllm/v1/core/kv_cache_manager.py, get_computed_blocks
and allocate_slots; single_type_kv_cache_manager.py, FullAttentionManager): a request's blocks
in the block pool (block_pool.py), its prefix-cache hits, and the hashes of its full blocks.

- A request's cached prefix is the longest run of its leading full blocks found in the cache,
  at most `max_blocks` (the scheduler caps it below the request's last token).
- A request that is admitted takes its hit blocks (a free hit block leaves the free queue: it
  uses a free block too) and new blocks for its first chunk. With `reserve_full_isl`
  (scheduler_reserve_full_isl, on by default in 0.26) its whole sequence must fit the free
  blocks as well.
- Full blocks get their hash as soon as they are allocated for computed tokens (vLLM caches
  them at allocation; nothing can hit them before the request frees them).
- Freeing gives back every block, last first (block_pool.free).

The manager walks blocks one by one only at admission, allocation of a chunk and free; a
decoding request's blocks are counted by the scheduler, which takes them from the pool
directly (vllm_scheduler.py).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from chatfleet.core.engine.block_pool import (
    TOKEN_BYTES,
    Block,
    BlockPool,
    chain_keys,
    common_blocks,
)
from chatfleet.core.engine.request import EngineRequest

Mode = Literal["waiting", "prefill", "decode", "done"]
KEY_MEMO_ENTRIES = 1024  # distinct first blocks whose latest hash chain is kept for reuse


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True, eq=False, init=False)
class VLLMRequest:
    """The scheduler's view of one request (vLLM's Request). While decoding, its counts follow
    from `req.join_step` and `req.gen_base`; otherwise they are kept here."""

    req: EngineRequest
    tokens: bytes  # prompt + every output it will produce, as token_bytes (hashed by prefix)
    ready: float  # when the API server has handed it to the engine core
    # its state in the engine, which starts empty (replace() gives it back unscheduled)
    keys: list[int] = field(init=False)  # chained hashes of its full blocks so far
    blocks: list[Block] = field(init=False)  # its leading cached blocks
    num_blocks: int = field(init=False)  # blocks held (cached + not); derived while decoding
    num_computed: int = field(init=False)  # num_computed_tokens; derived while decoding
    generated: int = field(init=False)  # tokens sampled so far; derived while decoding
    mode: Mode = field(init=False)
    phase: int = field(init=False)  # decoding: (computed tokens - global step) mod block size

    # __init__ written out (init=False): chatfleet/_native.py says why
    def __init__(self, req: EngineRequest, tokens: bytes, ready: float = 0.0) -> None:
        self.req = req
        self.tokens = tokens
        self.ready = ready
        self.keys = []
        self.blocks = []
        self.num_blocks = 0
        self.num_computed = 0
        self.generated = 0
        self.mode = "waiting"
        self.phase = 0

    @property
    def num_tokens(self) -> int:
        """Its tokens so far: the prompt and what it sampled."""
        return self.req.prompt_len + self.generated


class KVCacheManager:
    def __init__(self, num_gpu_blocks: int, block_size: int,
                 enable_prefix_caching: bool = True) -> None:
        self.pool = BlockPool(num_gpu_blocks, block_size)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        # first block's bytes -> the latest request that began so, and its hash chain
        self._key_memo: OrderedDict[bytes, tuple[bytes, list[int]]] = OrderedDict()

    def computed_blocks(self, seq: VLLMRequest, max_blocks: int) -> list[Block]:
        """get_computed_blocks: the leading blocks of its tokens found in the cache, at most
        `max_blocks`."""
        if not self.enable_prefix_caching:
            return []
        self._hash_blocks(seq, max_blocks)
        return self.pool.longest_hit(seq.keys, max_blocks)

    def allocate_new(self, seq: VLLMRequest, hits: list[Block], num_new_tokens: int,
                     reserve_full_isl: bool) -> bool:
        """allocate_slots for a waiting request: its hit blocks and the blocks of its first
        `num_new_tokens` after them, or False (and nothing taken) when they do not fit."""
        bs = self.block_size
        pool = self.pool
        hit = len(hits) * bs
        evictable = pool.num_evictable(hits)
        free = pool.num_free()
        if reserve_full_isl and cdiv(seq.num_tokens, bs) - len(hits) + evictable > free:
            return False
        new_blocks = cdiv(hit + num_new_tokens, bs) - len(hits)
        if new_blocks + evictable > free:
            return False
        pool.touch(hits)
        pool.take(new_blocks)
        seq.blocks = hits
        seq.num_blocks = len(hits) + new_blocks
        seq.num_computed = hit + num_new_tokens
        self.cache_full_blocks(seq)
        return True

    def blocks_needed(self, seq: VLLMRequest, num_new_tokens: int) -> int:
        """New blocks its next `num_new_tokens` computed tokens take (a running prefill)."""
        return cdiv(seq.num_computed + num_new_tokens, self.block_size) - seq.num_blocks

    def allocate_slots(self, seq: VLLMRequest, num_new_tokens: int) -> None:
        """Take the blocks of its next `num_new_tokens` (they fit: see blocks_needed)."""
        need = self.blocks_needed(seq, num_new_tokens)
        self.pool.take(need)
        seq.num_blocks += need
        seq.num_computed += num_new_tokens
        self.cache_full_blocks(seq)

    def cache_full_blocks(self, seq: VLLMRequest) -> None:
        """Give hashes to the full blocks of its computed tokens that have none yet."""
        if not self.enable_prefix_caching:
            return
        full = seq.num_computed // self.block_size
        have = len(seq.blocks)
        if full <= have:
            return
        self._hash_blocks(seq, full)
        seq.blocks.extend(self.pool.cache(seq.keys[have:full]))

    def free(self, seq: VLLMRequest) -> None:
        """Its blocks go back to the pool (its full blocks cached first)."""
        self.cache_full_blocks(seq)
        self.pool.free(seq.blocks, seq.num_blocks - len(seq.blocks))
        seq.blocks = []
        seq.num_blocks = 0

    def _hash_blocks(self, seq: VLLMRequest, upto: int) -> None:
        """Its block hashes up to `upto` blocks. A prompt that starts like the last one seen
        with the same first block (a shared system prompt) takes the hashes of their common
        blocks from it: the chain depends only on the tokens, so they are the same."""
        keys = seq.keys
        if len(keys) >= upto:
            return
        bs = self.block_size
        width = bs * TOKEN_BYTES
        first = seq.tokens[:width]
        if not keys and len(first) == width:
            memo = self._key_memo
            seen = memo.pop(first, None)
            if seen is not None:
                n = common_blocks(seq.tokens, seen[0], min(upto, len(seen[1])), bs)
                keys.extend(seen[1][:n])
            memo[first] = (seq.tokens, keys)
            if len(memo) > KEY_MEMO_ENTRIES:
                memo.popitem(last=False)
        chain_keys(seq.tokens, keys, upto, bs)
