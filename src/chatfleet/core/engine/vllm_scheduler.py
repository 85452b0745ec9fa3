"""vLLM V1's scheduler (0.26.0), modelled step by step, with its block pool and prefix cache.

Read from vLLM 0.26.0: vllm/v1/core/sched/scheduler.py (Scheduler.schedule, _preempt_request,
reset_prefix_cache), vllm/v1/core/kv_cache_manager.py (get_computed_blocks, allocate_slots),
vllm/v1/core/single_type_kv_cache_manager.py and block_pool.py (see block_pool.py here).
Defaults from vllm/config/scheduler.py and vllm/engine/arg_utils.py.

One step (`schedule`), under a token budget of `max_num_batched_tokens`:
1. The running requests, in order (admission order): each gets what it still lacks, a decode's
   one token or a running chunked prefill's rest, clipped to `long_prefill_token_threshold`
   (0: off) and to the budget left. Its new KV slots come from the block pool
   (`allocate_slots`); when they do not fit, the last request in `running` is preempted
   (FCFS: the newest) and the allocation is tried again, until it fits or the request itself
   was the one preempted. A preempted request frees its blocks (its cached full blocks stay
   in the free queue as hits), goes back to the *front* of the waiting queue with
   num_computed_tokens = 0, and is prefilled again later (recompute), usually mostly from its
   own cached blocks.
2. If nothing was preempted in this step, the waiting requests, in queue order, while the budget
   lasts and fewer than `max_num_seqs` run: a request's cached prefix is the longest run of its
   leading full 16-token blocks found in the cache, capped at num_tokens - 1 (the last token is
   always computed: its logits are sampled), so a prompt that is entirely cached still computes
   its last block. Its chunk is the rest of its tokens, clipped to the threshold and the budget
   left (the first chunk of a long prompt; its rest continues in the next steps as a running
   request). It is admitted when its whole sequence fits the free blocks
   (`scheduler_reserve_full_isl`, on by default in 0.26) and its first chunk does; the first
   that does not fit ends the pass (FCFS head of line).
Every scheduled token runs in one forward pass (mixed_step.py prices it). A request whose
computed tokens reach its token count samples one token at the step's end; decodes therefore
get a token every step, and never wait for a prefill to finish (at most one chunked prefill
runs, and it is the last in `running`, so decodes are scheduled before it takes the budget).

Full blocks are cached as soon as they are allocated for computed tokens (a decode fills its
block and the block is cached), so a finished request leaves its prompt and output (all but
the last token, which has no KV) in the cache.

Left out: async scheduling's one-step lookahead (it hides CPU time: the fixed step cost holds
what is left), speculative decoding, priorities, LoRA, multimodal and KV connectors, the
watermark (0 by default) and partial-block hits (hash block size = block size).

Cost: decodes are O(1) per step. Each decoding request remembers the step at which it began
decoding; its token count, its KV blocks and the batch's context follow from running sums, and
the blocks a step needs come from a count of decoding requests per position within a block
(a decode needs a new block when its computed tokens are a multiple of 16). Requests are
walked one by one only when blocks run short (preemption), at admission, finish and abort.
With a `horizon` (the twin), decode-only steps run as one event up to the first finish, the
first step at or after the horizon, or the last step whose blocks fit: nothing inside the
engine can change in between (a waiting request that could not be admitted stays blocked while
only decodes run: they only take blocks).
"""

from __future__ import annotations

import bisect
import heapq
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from chatfleet.core.engine.block_pool import (
    BLOCK_SIZE,
    TOKEN_BYTES,
    Block,
    BlockPool,
    chain_keys,
    common_blocks,
)
from chatfleet.core.engine.mixed_step import MixedStepModel
from chatfleet.core.engine.radix import as_tokens
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.step import Step, StepKind, StepResult
from chatfleet.core.engine.step_time import attention_pairs
from chatfleet.core.engine.thermal import ThermalState
from chatfleet.core.errors import ChatfleetError

Mode = Literal["waiting", "prefill", "decode", "done"]
KEY_MEMO_ENTRIES = 1024  # distinct first blocks whose latest hash chain is kept for reuse


@dataclass(frozen=True, slots=True)
class VLLMConfig:
    """vLLM's engine arguments that the model follows (names as vLLM spells them)."""

    num_gpu_blocks: int  # the pool, null block included ('GPU KV cache size' / block_size)
    block_size: int = BLOCK_SIZE
    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 256
    long_prefill_token_threshold: int = 0
    max_model_len: int = 40960
    enable_prefix_caching: bool = True
    scheduler_reserve_full_isl: bool = True
    # the API server's work per request before the engine core sees it (chat template,
    # tokenization, hand-off), one request after another: calibration.py's frontend_s
    frontend_s: float = 0.0

    def __post_init__(self) -> None:
        if self.num_gpu_blocks < 2:
            raise ChatfleetError("the KV pool must hold at least 2 blocks")
        if self.max_num_seqs < 1:
            raise ChatfleetError("max_num_seqs must be at least 1")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM's SchedulerConfig refuses it too: every running decode needs a token
            raise ChatfleetError(f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be "
                                 f"at least max_num_seqs ({self.max_num_seqs})")
        if self.long_prefill_token_threshold < 0:
            raise ChatfleetError("long_prefill_token_threshold must not be negative")
        if self.max_model_len < 1:
            raise ChatfleetError("max_model_len must be positive")
        if self.frontend_s < 0:
            raise ChatfleetError("the front-end time must not be negative")

    @property
    def pool_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size


@dataclass(slots=True, eq=False)
class _Seq:
    """The scheduler's view of one request (vLLM's Request). While decoding, its counts follow
    from `req.join_step` and `req.gen_base`; otherwise they are kept here."""

    req: EngineRequest
    tokens: bytes  # prompt + every output it will produce, as token_bytes (hashed by prefix)
    keys: list[int] = field(default_factory=list)  # chained hashes of its full blocks so far
    blocks: list[Block] = field(default_factory=list)  # its leading cached blocks
    num_blocks: int = 0  # blocks held (cached + not); derived while decoding
    num_computed: int = 0  # vLLM's num_computed_tokens; derived while decoding
    generated: int = 0  # tokens sampled so far; derived while decoding
    mode: Mode = "waiting"
    phase: int = 0  # decoding: (computed tokens - global step) mod block size
    ready: float = 0.0  # when the API server has handed it to the engine core


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class VLLMScheduler:
    engine_name = "vllm"

    def __init__(self, cfg: VLLMConfig, step_model: MixedStepModel,
                 thermal: ThermalState | None = None) -> None:
        self.cfg = cfg
        self.step_model = step_model
        self.thermal = thermal
        self.pool = BlockPool(cfg.num_gpu_blocks, cfg.block_size)
        self.waiting: deque[_Seq] = deque()
        self.running: dict[str, _Seq] = {}  # insertion order: vLLM's `running` list
        self.in_flight: Step | None = None
        self.num_steps = 0  # completed steps (a decode run counts each of its steps)
        self.step_end_times: list[float] = []
        self.log: list[tuple[object, ...]] = []  # rows of step.LOG_FIELDS
        # decoding requests: counts by phase, running sums, finish heap
        bs = cfg.block_size
        self._phase_count = [0] * bs
        self._num_decoding = 0
        self._sum_ctx_base = 0  # sum over decodes of (computed tokens - global step)
        self._finish_heap: list[tuple[int, int, int, _Seq]] = []
        self._seq_no = 0
        self._prefilling: list[_Seq] = []  # running requests still prefilling, in order
        # first block's bytes -> the latest request that began so, and its hash chain
        self._key_memo: OrderedDict[bytes, tuple[bytes, list[int]]] = OrderedDict()
        self._pending: list[tuple[_Seq, int, int, bool]] = []  # in-flight chunks
        self._pending_preempted: list[EngineRequest] = []
        self._run_blocks_needed = 0  # extra decode blocks a run's later steps take
        self._busy_until = 0.0
        self._frontend_free = 0.0  # when the API server is done with what it was given
        self.num_prefill_input_tokens = 0
        self.num_prefill_cached_tokens = 0
        self.num_retractions = 0  # preemptions (vllm:num_preemptions)
        # vllm:prefix_cache_queries / hits: every lookup of a request not preempted before
        self.num_prefix_queries = 0
        self.num_prefix_hits = 0

    # --- the engine-model interface (protocol.py) ----------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.pool.capacity_tokens

    @property
    def context_length(self) -> int:
        return self.cfg.max_model_len

    @property
    def num_evicted_tokens(self) -> int:
        return self.pool.num_evicted_blocks * self.cfg.block_size

    def num_running(self) -> int:
        return len(self.running)

    def num_queued(self) -> int:
        return len(self.waiting)

    def num_used_tokens(self) -> int:
        return (self.pool.num_usable - self.pool.num_free()) * self.cfg.block_size

    def token_usage(self) -> float:
        return self.pool.usage()

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def prefix_cache_counters(self) -> tuple[int, int]:
        """vllm:prefix_cache_queries / hits: every lookup of a never-preempted request."""
        return self.num_prefix_queries, self.num_prefix_hits

    def decoding_requests(self) -> list[EngineRequest]:
        return [s.req for s in self.running.values() if s.mode == "decode"]

    def step_tokens(self, result: StepResult) -> list[EngineRequest]:
        """The requests that got a token in this (single) step."""
        last = self.num_steps - 1
        out = [s.req for s in self.running.values()
               if s.mode == "decode" and s.req.join_step <= last]
        first = {id(r) for r in result.first_tokens}
        out.extend(r for r in result.finished if id(r) not in first)
        out.extend(result.first_tokens)
        return out

    # --- requests in and out -------------------------------------------------------------
    def check_request(self, prompt_len: int, max_new_tokens: int) -> str | None:
        if prompt_len <= 0:
            return "the prompt is empty"
        if max_new_tokens <= 0:
            return "max_new_tokens must be positive"
        if prompt_len + max_new_tokens > self.cfg.max_model_len:
            return (f"prompt ({prompt_len}) plus max_new_tokens ({max_new_tokens}) exceeds the "
                    f"maximum model length ({self.cfg.max_model_len})")
        usable = self.pool.num_usable * self.cfg.block_size
        if prompt_len + max_new_tokens > usable:
            return (f"prompt ({prompt_len}) plus max_new_tokens ({max_new_tokens}) does not fit "
                    f"the KV cache ({usable} tokens)")
        return None

    def max_new_tokens_room(self, prompt_len: int) -> int:
        """vLLM's default max_tokens: what the model length leaves (and the pool holds)."""
        return min(self.cfg.max_model_len, self.pool.num_usable * self.cfg.block_size) - prompt_len

    def add_request(self, req: EngineRequest, now: float) -> None:
        why = self.check_request(req.prompt_len, req.max_new_tokens)
        if why is not None:
            raise ValueError(why)
        if req.output_len < 1 or req.output_len > req.max_new_tokens:
            raise ValueError("output_ids must hold between 1 and max_new_tokens tokens")
        if req.rid in self.running:
            raise ValueError(f"request id {req.rid!r} is already running")
        req.arrival_time = now
        req.state = "waiting"
        req.prompt = as_tokens(req.prompt)
        req.output_ids = as_tokens(req.output_ids)
        req.fill = req.prompt
        buf = (as_tokens(req.prompt) + as_tokens(req.output_ids)).tobytes()
        ready = max(now, self._frontend_free) + self.cfg.frontend_s
        self._frontend_free = ready
        self.waiting.append(_Seq(req, buf, ready=ready))

    def abort(self, rid: str) -> EngineRequest | None:
        """Drop a request wherever it is and free its blocks at once (finish_requests)."""
        for i, seq in enumerate(self.waiting):
            if seq.req.rid == rid:
                del self.waiting[i]
                seq.req.state = "aborted"
                seq.mode = "done"
                return seq.req
        found = self.running.pop(rid, None)
        if found is None:
            return None
        seq = found
        in_step = 1 if seq.mode == "decode" and self.in_flight is not None else 0
        self._materialize(seq, in_step)
        seq.num_computed -= in_step  # the in-flight slot is freed, not cached
        if seq in self._prefilling:
            self._prefilling.remove(seq)
        self._free(seq)
        seq.req.state = "aborted"
        seq.mode = "done"
        self._close_segment(seq.req)
        return seq.req

    def flush(self) -> bool:
        """POST /reset_prefix_cache: refused (False) while any request holds blocks."""
        if self.in_flight is not None or self.running:
            return False
        return self.pool.reset()

    # --- decoding requests (lazy) --------------------------------------------------------
    def _tokens_now(self, seq: _Seq) -> int:
        return seq.req.prompt_len + seq.generated

    def _enter_decode(self, seq: _Seq) -> None:
        req = seq.req
        req.state = "running"
        req.join_step = self.num_steps
        req.gen_base = seq.generated
        seq.mode = "decode"
        bs = self.cfg.block_size
        base = seq.num_computed - self.num_steps  # computed = base + steps since
        seq.phase = base % bs
        self._phase_count[seq.phase] += 1
        self._num_decoding += 1
        self._sum_ctx_base += base
        finish_step = req.join_step + req.output_len - seq.generated - 1
        self._seq_no += 1
        heapq.heappush(self._finish_heap, (finish_step, self._seq_no, req.join_step, seq))

    def _materialize(self, seq: _Seq, in_step: int = 0) -> None:
        """A decoding request's counts as explicit fields, and it leaves the decode sums.
        `in_step`: 1 when a step it decodes in is in flight (its slot is already taken)."""
        if seq.mode != "decode":
            return
        req = seq.req
        steps = self.num_steps - req.join_step
        seq.generated = req.gen_base + steps
        seq.num_computed = self._tokens_now(seq) - 1 + in_step
        seq.num_blocks = cdiv(seq.num_computed, self.cfg.block_size)
        self._phase_count[seq.phase] -= 1
        self._num_decoding -= 1
        self._sum_ctx_base -= seq.num_computed - in_step - self.num_steps
        seq.mode = "prefill"  # explicit from here on; the caller sets what it becomes

    def _cache_full_blocks(self, seq: _Seq) -> None:
        """Give hashes to the full blocks of its computed tokens that have none yet
        (vLLM does it at allocation; nothing can hit them before the request frees them)."""
        if not self.cfg.enable_prefix_caching:
            return
        full = seq.num_computed // self.cfg.block_size
        have = len(seq.blocks)
        if full <= have:
            return
        self._hash_blocks(seq, full)
        seq.blocks.extend(self.pool.cache(seq.keys[have:full]))

    def _hash_blocks(self, seq: _Seq, upto: int) -> None:
        """Its block hashes up to `upto` blocks. A prompt that starts like the last one seen
        with the same first block (a shared system prompt) takes the hashes of their common
        blocks from it: the chain depends only on the tokens, so they are the same."""
        keys = seq.keys
        if len(keys) >= upto:
            return
        bs = self.cfg.block_size
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

    def _free(self, seq: _Seq) -> None:
        self._cache_full_blocks(seq)
        self.pool.free(seq.blocks, seq.num_blocks - len(seq.blocks))
        seq.blocks = []
        seq.num_blocks = 0

    def _close_segment(self, req: EngineRequest) -> None:
        if req.segments and req.segments[-1][2] is None:
            req.segments[-1][2] = self.num_steps

    def _preempt(self, seq: _Seq, in_step: int = 0) -> None:
        """_preempt_request: free its blocks, back to the front of the queue, recompute."""
        del self.running[seq.req.rid]
        self._materialize(seq, in_step)
        seq.num_computed -= in_step  # a slot taken in this step is freed, never computed
        if seq in self._prefilling:
            self._prefilling.remove(seq)
        self._free(seq)
        self._close_segment(seq.req)
        req = seq.req
        req.state = "waiting"
        req.fill = as_tokens(req.prompt) + as_tokens(req.output_ids)[:seq.generated]
        req.gen_base = seq.generated
        req.num_computed = 0
        req.num_retractions += 1
        seq.num_computed = 0
        seq.mode = "waiting"
        self.num_retractions += 1
        self.waiting.appendleft(seq)
        self._pending_preempted.append(req)

    # --- scheduling ----------------------------------------------------------------------
    def schedule(self, now: float, horizon: float | None = None) -> Step | None:
        """Choose the next step, take its KV blocks, and return it with its modelled duration.
        With a `horizon` (and the thermal model off), a decode-only step may run on as several
        steps (see the module docstring); `truncate_decode_run` cuts it when something
        arrives."""
        if self.in_flight is not None:
            raise RuntimeError("a step is already running")
        if self.thermal is not None and now > self._busy_until:
            self.thermal.advance(now - self._busy_until, 0.0)
            self._busy_until = now
        for _ in range(3):  # a step that preempted everything it had is retried at once
            step = self._schedule_once(now, horizon)
            if step is not None or not self.waiting or self.running:
                break
        if step is not None:
            self.in_flight = step
        return step

    def _schedule_once(self, now: float, horizon: float | None) -> Step | None:
        cfg = self.cfg
        bs = cfg.block_size
        pool = self.pool
        budget = cfg.max_num_batched_tokens
        s = self.num_steps
        preempted_before = len(self._pending_preempted)
        # 1a. decodes: one token each, a block for those whose last block is full
        need = self._phase_count[(-s) % bs]
        if need > pool.num_free():
            self._allocate_decodes_one_by_one(s)
        else:
            pool.take(need)
        budget -= self._num_decoding
        # 1b. the running chunked prefill (the last in `running`)
        chunks: list[tuple[_Seq, int, int, bool]] = []  # (seq, prefix, new tokens, completes)
        for seq in list(self._prefilling):
            if budget <= 0 or seq.mode != "prefill":
                break
            n = self._chunk(self._tokens_now(seq) - seq.num_computed, budget)
            decoding = self._num_decoding
            if not self._allocate_running_chunk(seq, n):
                break
            budget += decoding - self._num_decoding  # decodes it preempted (see below)
            chunks.append((seq, seq.num_computed - n, n,
                           seq.num_computed >= self._tokens_now(seq)))
            budget -= n
        num_decode = self._num_decoding
        preempted = len(self._pending_preempted) > preempted_before
        # 2. the waiting queue, when nothing was preempted in this step
        new_cached = 0
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs:
                if self.waiting[0].ready > now:
                    break  # the API server has not handed it over yet
                admitted = self._admit(self.waiting[0], budget)
                if admitted is None:
                    break
                seq, hit, n = admitted
                chunks.append((seq, hit, n, seq.num_computed >= self._tokens_now(seq)))
                new_cached += hit if seq.req.num_retractions == 0 else 0
                budget -= n
        if not chunks and not num_decode:
            return None
        return self._make_step(now, horizon, num_decode, chunks, new_cached, preempted)

    def _chunk(self, remaining: int, budget: int) -> int:
        thr = self.cfg.long_prefill_token_threshold
        if 0 < thr < remaining:
            remaining = thr
        return min(remaining, budget)

    def _allocate_decodes_one_by_one(self, s: int) -> None:
        """Blocks run short: vLLM's running loop, request by request in `running` order; a
        request that cannot get its block preempts the last one (itself at worst)."""
        bs = self.cfg.block_size
        order = list(self.running.values())
        end = len(order)
        i = 0
        while i < end:
            seq = order[i]
            i += 1
            if seq.mode != "decode":
                continue  # the chunked prefill comes after every decode (module docstring)
            if (seq.phase + s) % bs:
                continue  # its last block has room
            while self.pool.num_free() == 0:
                end -= 1
                victim = order[end]
                self._preempt(victim)
                if victim is seq:
                    break
            if seq.mode == "decode":
                self.pool.take(1)

    def _allocate_running_chunk(self, seq: _Seq, n: int) -> bool:
        """allocate_slots for a running chunked prefill; when it does not fit, the last running
        request is preempted until it does. With the threshold off this one is the last, and
        goes itself. With it on, several chunked prefills can run and a decode admitted after
        one of them can be the last: it already has this step's block (decodes are allocated
        before chunks here; vLLM keeps `running` order, which differs only in who is preempted
        and in which step's budget runs out first)."""
        bs = self.cfg.block_size
        while True:
            need = cdiv(seq.num_computed + n, bs) - seq.num_blocks
            if need <= self.pool.num_free():
                break
            victim = next(reversed(self.running.values()))
            self._preempt(victim, 1 if victim.mode == "decode" else 0)
            if victim is seq:
                return False
        self.pool.take(need)
        seq.num_blocks += need
        seq.num_computed += n
        self._cache_full_blocks(seq)
        return True

    def _admit(self, seq: _Seq, budget: int) -> tuple[_Seq, int, int] | None:
        """get_computed_blocks + allocate_slots for the head of the queue, or None when it
        does not fit (the pass ends)."""
        cfg = self.cfg
        bs = cfg.block_size
        pool = self.pool
        req = seq.req
        num_tokens = self._tokens_now(seq)
        hits: list[Block] = []
        if cfg.enable_prefix_caching:
            max_blocks = (num_tokens - 1) // bs  # the last token is always computed
            self._hash_blocks(seq, max_blocks)
            hits = pool.longest_hit(seq.keys, max_blocks)
        hit = len(hits) * bs
        if req.num_retractions == 0:
            self.num_prefix_queries += num_tokens
            self.num_prefix_hits += hit
        n = self._chunk(num_tokens - hit, budget)
        evictable = pool.num_evictable(hits)
        free = pool.num_free()
        if cfg.scheduler_reserve_full_isl and (
                cdiv(num_tokens, bs) - len(hits) + evictable > free):
            return None
        new_blocks = cdiv(hit + n, bs) - len(hits)
        if new_blocks + evictable > free:
            return None
        pool.touch(hits)
        pool.take(new_blocks)
        seq.blocks = hits
        seq.num_blocks = len(hits) + new_blocks
        seq.num_computed = hit + n
        self._cache_full_blocks(seq)
        self.waiting.popleft()
        self.running[req.rid] = seq
        req.state = "prefilling"
        req.num_computed = hit
        if req.num_retractions == 0 and not req.seen_by_admission:
            req.seen_by_admission = True
            req.num_cached_tokens = hit
            self.num_prefill_input_tokens += num_tokens
            self.num_prefill_cached_tokens += hit
        seq.mode = "prefill"
        self._prefilling.append(seq)
        return seq, hit, n

    def _make_step(self, now: float, horizon: float | None, num_decode: int,
                   chunks: list[tuple[_Seq, int, int, bool]], new_cached: int,
                   preempted: bool) -> Step:
        s = self.num_steps
        bs = self.cfg.block_size
        sm, mem = self._clock_factors()
        kv = self._sum_ctx_base + num_decode * s + num_decode  # contexts + this step's token
        p_tokens = sum(n for _, _, n, _ in chunks)
        pairs = sum(attention_pairs(p, n) for _, p, n, _ in chunks)
        cached_read = sum(p for _, p, _, _ in chunks)
        logits = sum(1 for *_, done in chunks if done)
        step_s = self.step_model.step_s
        t = now + step_s(num_decode, kv, p_tokens, pairs, cached_read, len(chunks), logits,
                         sm, mem)
        ends = [t]
        self._run_blocks_needed = 0
        until = horizon if horizon is not None else t
        pending = self.next_ready_time()
        if pending is not None and pending > now:
            until = min(until, pending)  # the step at whose end it is ready comes last
        if (horizon is not None and not chunks and not preempted and self.thermal is None
                and t < until and self._finish_heap):
            # a decode-only run: up to the first finish, the horizon, the next request the
            # API server hands over, and the blocks that fit
            last = self._finish_heap[0][0]
            free = self.pool.num_free()
            taken = 0
            j = s + 1
            while j <= last and t < until:
                need = self._phase_count[(-j) % bs]
                if taken + need > free:
                    break
                taken += need
                kv += num_decode
                t += step_s(num_decode, kv, 0, 0.0, 0, 0, 0, sm, mem)
                ends.append(t)
                j += 1
        kind: StepKind = ("mixed" if chunks and num_decode
                          else "prefill" if chunks else "decode")
        self._pending = chunks
        return Step(kind, now, ends[-1] - now,
                    batch=[(seq.req, n) for seq, _, n, _ in chunks], num_decode=num_decode,
                    num_prefill_tokens=p_tokens, num_cached_tokens=new_cached,
                    num_waiting=len(self.waiting), decode_ends=ends)

    def next_ready_time(self) -> float | None:
        """When the next waiting request reaches the engine core (None: nothing waits). The
        queue is in hand-over order, so its head is the first (a preempted request at the
        front is ready already)."""
        return self.waiting[0].ready if self.waiting else None

    def truncate_decode_run(self, t: float) -> float | None:
        """Something arrived at `t` during a decode run: cut the run after the step running at
        `t`. Returns the run's new end, or None when nothing changed."""
        step = self.in_flight
        if step is None or len(step.decode_ends) <= 1:
            return None
        ends = step.decode_ends
        keep = bisect.bisect_left(ends, t) + 1
        if keep >= len(ends):
            return None
        del ends[keep:]
        step.duration = ends[-1] - step.start
        return ends[-1]

    def advance_idle(self, now: float) -> None:
        if self.thermal is not None and self.in_flight is None and now > self._busy_until:
            self.thermal.advance(now - self._busy_until, 0.0)
            self._busy_until = now

    def _clock_factors(self) -> tuple[float, float]:
        if self.thermal is None:
            return 1.0, 1.0
        return self.thermal.sm_factor, self.thermal.mem_factor

    # --- completing a step ---------------------------------------------------------------
    def complete(self, now: float) -> StepResult:
        step = self.in_flight
        if step is None:
            raise RuntimeError("no step is running")
        self.in_flight = None
        if self.thermal is not None:
            tokens = step.num_prefill_tokens + step.num_decode
            share = step.num_prefill_tokens / tokens if tokens else 0.0
            self.thermal.advance(now - step.start, 1.0, step.kind, share)
            self._busy_until = now
        result = StepResult(step)
        bs = self.cfg.block_size
        k = len(step.decode_ends)
        s = self.num_steps
        usage_rows = [0] * k  # blocks the run's later steps take, per step
        for j in range(1, k):
            need = self._phase_count[(-(s + j)) % bs]
            self.pool.take(need)
            usage_rows[j] = need
        self.num_steps += k
        self.step_end_times.extend(step.decode_ends)
        self._log_rows(step, usage_rows)  # the engine as the step leaves it, before the frees
        # prefill chunks: the ones that reached their end sample a token
        for seq, _, _, done in self._pending:
            req = seq.req
            if req.state == "aborted" or seq.mode != "prefill" or not done:
                continue
            self._prefilling.remove(seq)
            seq.generated += 1
            req.segments.append([now, self.num_steps, None])
            if req.first_token_time is None:
                req.first_token_time = now
            result.first_tokens.append(req)
            if seq.generated >= req.output_len:
                self._close_segment(req)
                self._finish(seq, now, result)
            else:
                self._enter_decode(seq)
        self._pending = []
        # decodes that sampled their last token
        last = self.num_steps - 1
        heap = self._finish_heap
        while heap and heap[0][0] <= last:
            _, _, join, seq = heapq.heappop(heap)
            if seq.mode != "decode" or seq.req.join_step != join:
                continue  # stale: preempted or aborted since
            self._materialize(seq)
            self._close_segment(seq.req)
            self._finish(seq, now, result)
        result.retracted = self._pending_preempted
        self._pending_preempted = []
        return result

    def _finish(self, seq: _Seq, now: float, result: StepResult) -> None:
        req = seq.req
        self.running.pop(req.rid, None)
        self._free(seq)
        seq.mode = "done"
        req.state = "finished"
        req.finish_time = now
        result.finished.append(req)

    def _log_rows(self, step: Step, later_blocks: list[int]) -> None:
        hit = (self.num_prefill_cached_tokens / self.num_prefill_input_tokens
               if self.num_prefill_input_tokens else 0.0)
        th = self.thermal
        thermal = (th.sm_mhz if th else None, th.temp_c if th else None,
                   th.power_w if th else None, th.slowdown if th else False)
        usable = self.pool.num_usable
        used = usable - self.pool.num_free()
        k = len(step.decode_ends)
        batch = step.num_decode + len(step.batch)
        prev = step.start
        for j, t in enumerate(step.decode_ends):
            # blocks the later steps of a run took were not yet in use at step j
            still = sum(later_blocks[j + 1:]) if j + 1 < k else 0
            kind = step.kind if j == 0 else "decode"
            self.log.append((t, kind, batch if j == 0 else step.num_decode,
                             step.num_prefill_tokens if j == 0 else 0, step.num_decode,
                             len(self.running), step.num_waiting, (used - still) / usable,
                             hit, *thermal, t - prev))
            prev = t

    # --- results -------------------------------------------------------------------------
    def token_times(self, req: EngineRequest) -> list[float]:
        out: list[float] = []
        ends = self.step_end_times
        for first, start, end in req.segments:
            out.append(first)
            stop = self.num_steps if end is None else end
            out.extend(ends[start:stop])
        return out

    def held_blocks(self) -> Iterable[tuple[str, int]]:
        """(rid, blocks held) of every running request: for invariant checks."""
        in_step = 1 if self.in_flight is not None and self.in_flight.num_decode else 0
        for rid, seq in self.running.items():
            if seq.mode == "decode":
                computed = (seq.req.prompt_len + seq.req.gen_base
                            + self.num_steps - seq.req.join_step - 1 + in_step)
                yield rid, cdiv(computed, self.cfg.block_size)
            else:
                yield rid, seq.num_blocks
