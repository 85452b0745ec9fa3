"""One prefill round's admission, as SGLang v0.5's PrefillAdder makes it (schedule_policy.py):
the chunk budget, the token budget with what the running requests may still decode reserved,
and the batch the round builds (scheduler.py runs the round and prices the batch).

- A waiting request's cached prefix is locked first (the budget shrinks when it stops being
  evictable); it is admitted when its extend length + min(max_new, 4096) fits the free and
  evictable tokens left after the reservation, and the first that does not fit ends the round.
- A host-tier prefix of at least the load-back threshold (10 tokens) is loaded back at
  admission, all of it (SGLang's init_load_back: a shorter one is recomputed).
- SGLang always computes the last prompt token (its logits are sampled), so a fully cached
  prompt still extends by one token.
- A chunk that does not complete its prompt makes it the chunked request, whose next chunks go
  first in the next rounds; its new tokens are reserved once its prompt is complete (add_one_req
  and add_chunked_req).
"""

from __future__ import annotations

from collections.abc import Callable

from chatfleet.core.engine.kv_pool import KVPool
from chatfleet.core.engine.radix import RadixCache
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.step_time import attention_pairs

CLIP_MAX_NEW_TOKENS = 4096


class PrefillAdder:
    """`reserved`: what the running requests may still decode (times new_token_ratio);
    `free_tokens()` and `ensure_free(tokens, now)`: the scheduler's view of the pool (free =
    pool - tree - requests; ensure_free evicts from the tree to make room)."""

    def __init__(self, tree: RadixCache, pool: KVPool, chunk_tokens: int,
                 load_back_threshold: int, reserved: float, free_tokens: Callable[[], int],
                 ensure_free: Callable[[int, float], None], now: float) -> None:
        self.tree = tree
        self.pool = pool
        self.load_back_threshold = load_back_threshold
        self.free_tokens = free_tokens
        self.ensure_free = ensure_free
        self.now = now
        self.rem_chunk = chunk_tokens
        self.reserved = reserved  # plus what this round admits
        self.chunked: EngineRequest | None = None  # a prompt this round did not complete
        self.num_input_tokens = 0  # prompts of the requests admitted for the first time
        self.num_cached_tokens = 0  # ... and their cache hits
        self.batch: list[tuple[EngineRequest, int]] = []
        self.admitted: list[EngineRequest] = []  # from the waiting queue
        self.pairs = 0.0  # causal query-key pairs of the batch
        self.cached_read = 0  # cached tokens its chunks attend over
        self.logits = 0  # requests whose prompt completes in this batch
        self.load_back = 0  # host-tier tokens loaded back

    def add_chunked(self, req: EngineRequest) -> bool:
        """The chunked request's next chunk. False: the round ends."""
        return self._add(req, req.num_computed)

    def add_one(self, req: EngineRequest) -> bool:
        """A waiting request, if its prompt and its reserved output fit. False: the round
        ends (it did not fit, or it was chunked)."""
        tree = self.tree
        now = self.now
        fill = req.fill
        m = tree.match_prefix(fill, now)
        prefix = min(m.device_len, len(fill) - 1)
        loaded = m.host_len if m.host_len >= self.load_back_threshold else 0
        extend_all = len(fill) - prefix - loaded
        total = extend_all + min(req.max_new_tokens - req.gen_base, CLIP_MAX_NEW_TOKENS)
        tree.inc_lock_ref(m.node)  # lock first: see the module docstring
        if total + loaded >= self.free_tokens() + tree.evictable_size() - self.reserved:
            tree.dec_lock_ref(m.node)
            return False
        if loaded:
            old_node = m.node  # locked above; load_back moves m.node deeper
            self.ensure_free(loaded, now)
            tree.load_back(m, now)
            m = tree.match_prefix(fill, now)
            tree.inc_lock_ref(m.node)
            tree.dec_lock_ref(old_node)
            prefix = min(m.device_len, len(fill) - 1)
            req.num_loaded_back_tokens += loaded
            self.load_back += loaded
        req.prefix_node = m.node
        req.prefix_len = m.device_len
        req.num_computed = prefix
        if not req.seen_by_admission:
            req.num_cached_tokens = prefix
            req.seen_by_admission = True
            self.num_input_tokens += len(fill)
            self.num_cached_tokens += prefix
        self.admitted.append(req)
        return self._add(req, prefix)

    def _add(self, req: EngineRequest, prefix: int) -> bool:
        """Its next chunk joins the batch. False when it did not complete its prompt."""
        fill_len = len(req.fill)
        extend = min(fill_len - prefix, self.rem_chunk)
        self.ensure_free(extend, self.now)
        self.pool.allocate(extend)
        req.num_own_tokens = extend
        req.state = "prefilling"
        self.batch.append((req, extend))
        self.rem_chunk -= extend
        self.pairs += attention_pairs(prefix, extend)
        self.cached_read += prefix
        if prefix + extend >= fill_len:
            self.logits += 1
            self.reserved += min(req.max_new_tokens - req.gen_base, CLIP_MAX_NEW_TOKENS)
            return True
        self.chunked = req  # the rest of its prompt goes first in the next batches
        return False
