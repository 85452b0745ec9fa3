"""vLLM V1's scheduler (0.26.0), modelled step by step, with its block pool and prefix cache.

Read from vLLM 0.26.0: vllm/v1/core/sched/scheduler.py (Scheduler.schedule, _preempt_request,
reset_prefix_cache); the KV cache manager and block pool are kv_cache_manager.py and
block_pool.py here. Its engine arguments and their defaults: vllm_config.py.

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

How a request reaches the engine core (the API server, async scheduling's one-step
lookahead) is handover.py. Left out: speculative decoding, priorities, LoRA, multimodal and
KV connectors, the watermark (0 by default) and partial-block hits (hash block size = block
size).

Cost: decodes are O(1) per step. Each decoding request remembers the step at which it began
decoding; its token count, its KV blocks and the batch's context follow from running sums, and
the blocks a step needs come from a count of decoding requests per position within a block
(a decode needs a new block when its computed tokens are a multiple of 16). Requests are
walked one by one only when blocks run short (preemption), at admission, finish and abort.
With a `horizon` (the twin), decode-only steps run as one event up to the first finish, the
last step that ends by the horizon, or the last step whose blocks fit: nothing inside the
engine can change in between (a waiting request that could not be admitted stays blocked while
only decodes run: they only take blocks). The thermal model, when on, steps along the run
(decode_run.py).
"""

from __future__ import annotations

from collections import deque

from chatfleet.core.engine.base_scheduler import BaseScheduler
from chatfleet.core.engine.decode_run import run_ends
from chatfleet.core.engine.handover import HandOver
from chatfleet.core.engine.kv_cache_manager import KVCacheManager, VLLMRequest, cdiv
from chatfleet.core.engine.mixed_step import MixedStepModel
from chatfleet.core.engine.request import EngineRequest, as_tokens
from chatfleet.core.engine.step import Step, StepKind, StepResult
from chatfleet.core.engine.step_time import attention_pairs
from chatfleet.core.engine.steplog import ThermalFigures
from chatfleet.core.engine.thermal import ThermalState
from chatfleet.core.engine.vllm_config import VLLMConfig


class VLLMScheduler(BaseScheduler):
    """vLLM's rules on the shared lifecycle (base_scheduler.py): a token budget over running
    requests then waiting ones, preemption of the newest, the block prefix cache."""

    engine_name = "vllm"
    context_name = "maximum model length"

    def __init__(self, cfg: VLLMConfig, step_model: MixedStepModel,
                 thermal: ThermalState | None = None) -> None:
        super().__init__(thermal)
        self.cfg = cfg
        self.step_model = step_model
        self.kv = KVCacheManager(cfg.num_gpu_blocks, cfg.block_size, cfg.enable_prefix_caching)
        self.pool = self.kv.pool
        self.waiting: deque[VLLMRequest] = deque()
        self.running: dict[str, VLLMRequest] = {}  # insertion order: vLLM's `running` list
        # decoding requests: counts by phase, running sums
        bs = cfg.block_size
        self._phase_count = [0] * bs
        self._num_decoding = 0
        self._sum_ctx_base = 0  # sum over decodes of (computed tokens - global step)
        self._prefilling: list[VLLMRequest] = []  # running requests still prefilling, in order
        self._pending: list[tuple[VLLMRequest, int, int, bool]] = []  # in-flight chunks
        self.handover = HandOver(cfg.frontend_s, cfg.frontend_delay_s, cfg.async_scheduling)
        # num_retractions counts preemptions (vllm:num_preemptions)
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
    def _pool_refusal(self, prompt_len: int, max_new_tokens: int) -> str | None:
        usable = self.pool.num_usable * self.cfg.block_size
        if prompt_len + max_new_tokens > usable:
            return (f"prompt ({prompt_len}) plus max_new_tokens ({max_new_tokens}) does not fit "
                    f"the KV cache ({usable} tokens)")
        return None

    def max_new_tokens_room(self, prompt_len: int) -> int:
        """vLLM's default max_tokens: what the model length leaves (and the pool holds)."""
        return min(self.cfg.max_model_len, self.pool.num_usable * self.cfg.block_size) - prompt_len

    def is_running(self, rid: str) -> bool:
        return rid in self.running

    def _enqueue(self, req: EngineRequest, now: float) -> None:
        buf = (as_tokens(req.prompt) + as_tokens(req.output_ids)).tobytes()
        self.waiting.append(VLLMRequest(req, buf, ready=self.handover.ready_time(now)))

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
        self.kv.free(seq)
        seq.req.state = "aborted"
        seq.mode = "done"
        seq.req.close_segment(self.num_steps)
        return seq.req

    def flush(self) -> bool:
        """POST /reset_prefix_cache: refused (False) while any request holds blocks."""
        if self.in_flight is not None or self.running:
            return False
        return self.pool.reset()

    # --- decoding requests (lazy) --------------------------------------------------------
    def _enter_decode(self, seq: VLLMRequest) -> None:
        req = seq.req
        req.gen_base = seq.generated
        self._start_decoding(req)
        seq.mode = "decode"
        bs = self.cfg.block_size
        base = seq.num_computed - self.num_steps  # computed = base + steps since
        seq.phase = base % bs
        self._phase_count[seq.phase] += 1
        self._num_decoding += 1
        self._sum_ctx_base += base

    def _materialize(self, seq: VLLMRequest, in_step: int = 0) -> None:
        """A decoding request's counts as explicit fields, and it leaves the decode sums.
        `in_step`: 1 when a step it decodes in is in flight (its slot is already taken)."""
        if seq.mode != "decode":
            return
        req = seq.req
        steps = self.num_steps - req.join_step
        seq.generated = req.gen_base + steps
        seq.num_computed = seq.num_tokens - 1 + in_step
        seq.num_blocks = cdiv(seq.num_computed, self.cfg.block_size)
        self._phase_count[seq.phase] -= 1
        self._num_decoding -= 1
        self._sum_ctx_base -= seq.num_computed - in_step - self.num_steps
        seq.mode = "prefill"  # explicit from here on; the caller sets what it becomes

    def _preempt(self, seq: VLLMRequest, in_step: int = 0) -> None:
        """_preempt_request: free its blocks, back to the front of the queue, recompute."""
        del self.running[seq.req.rid]
        self._materialize(seq, in_step)
        seq.num_computed -= in_step  # a slot taken in this step is freed, never computed
        if seq in self._prefilling:
            self._prefilling.remove(seq)
        self.kv.free(seq)
        self._requeue(seq.req, seq.generated)
        seq.num_computed = 0
        seq.mode = "waiting"
        self.waiting.appendleft(seq)

    # --- scheduling ----------------------------------------------------------------------
    def _next_step(self, now: float, horizon: float | None) -> Step | None:
        """One engine step (see the module docstring); a step that preempted everything it
        had is retried at once."""
        step: Step | None = None
        for _ in range(3):
            step = self._schedule_once(now, horizon)
            if step is not None or not self.waiting or self.running:
                break
        return step

    def _schedule_once(self, now: float, horizon: float | None) -> Step | None:
        cfg = self.cfg
        bs = cfg.block_size
        pool = self.pool
        budget = cfg.max_num_batched_tokens
        s = self.num_steps
        preempted_before = len(self._retracted)
        # 1a. decodes: one token each, a block for those whose last block is full
        need = self._phase_count[(-s) % bs]
        if need > pool.num_free():
            self._allocate_decodes_one_by_one(s)
        else:
            pool.take(need)
        budget -= self._num_decoding
        # 1b. the running chunked prefill (the last in `running`)
        # (seq, prefix, new tokens, completes)
        chunks: list[tuple[VLLMRequest, int, int, bool]] = []
        for seq in list(self._prefilling):
            if budget <= 0 or seq.mode != "prefill":
                break
            n = self._chunk(seq.num_tokens - seq.num_computed, budget)
            decoding = self._num_decoding
            if not self._allocate_running_chunk(seq, n):
                break
            budget += decoding - self._num_decoding  # decodes it preempted (see below)
            chunks.append((seq, seq.num_computed - n, n,
                           seq.num_computed >= seq.num_tokens))
            budget -= n
        num_decode = self._num_decoding
        preempted = len(self._retracted) > preempted_before
        # 2. the waiting queue, when nothing was preempted in this step
        new_cached = 0
        deferred = False  # a request handed over too late for this step: the next takes it
        if not preempted:
            # an engine with nothing else to run schedules again at once (as an idle one does)
            cutoff = self.handover.cutoff(now)
            new_cached, budget = self._admit_waiting(cutoff, budget, chunks)
            if not chunks and not num_decode and cutoff < now:
                new_cached, budget = self._admit_waiting(now, budget, chunks)
            deferred = bool(self.waiting) and cutoff < self.waiting[0].ready <= now
        if not chunks and not num_decode:
            return None
        return self._make_step(now, horizon, num_decode, chunks, new_cached,
                               preempted or deferred)

    def _admit_waiting(self, cutoff: float, budget: int,
                       chunks: list[tuple[VLLMRequest, int, int, bool]]) -> tuple[int, int]:
        """Admit waiting requests handed over by `cutoff`, in queue order, while the budget
        lasts and fewer than max_num_seqs run; their chunks join `chunks`. Returns the cached
        tokens they found and the budget left."""
        new_cached = 0
        while (self.waiting and budget > 0
               and len(self.running) < self.cfg.max_num_seqs):
            if self.waiting[0].ready > cutoff:
                break  # not handed over (in time) by the API server
            admitted = self._admit(self.waiting[0], budget)
            if admitted is None:
                break
            seq, hit, n = admitted
            chunks.append((seq, hit, n, seq.num_computed >= seq.num_tokens))
            new_cached += hit if seq.req.num_retractions == 0 else 0
            budget -= n
        return new_cached, budget

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

    def _allocate_running_chunk(self, seq: VLLMRequest, n: int) -> bool:
        """allocate_slots for a running chunked prefill; when it does not fit, the last running
        request is preempted until it does. With the threshold off this one is the last, and
        goes itself. With it on, several chunked prefills can run and a decode admitted after
        one of them can be the last: it already has this step's block (decodes are allocated
        before chunks here; vLLM keeps `running` order, which differs only in who is preempted
        and in which step's budget runs out first)."""
        while self.kv.blocks_needed(seq, n) > self.pool.num_free():
            victim = next(reversed(self.running.values()))
            self._preempt(victim, 1 if victim.mode == "decode" else 0)
            if victim is seq:
                return False
        self.kv.allocate_slots(seq, n)
        return True

    def _admit(self, seq: VLLMRequest, budget: int) -> tuple[VLLMRequest, int, int] | None:
        """get_computed_blocks + allocate_slots for the head of the queue, or None when it
        does not fit (the pass ends)."""
        req = seq.req
        num_tokens = seq.num_tokens
        # the last token is always computed
        hits = self.kv.computed_blocks(seq, (num_tokens - 1) // self.cfg.block_size)
        hit = len(hits) * self.cfg.block_size
        if req.num_retractions == 0:
            self.num_prefix_queries += num_tokens
            self.num_prefix_hits += hit
        n = self._chunk(num_tokens - hit, budget)
        if not self.kv.allocate_new(seq, hits, n, self.cfg.scheduler_reserve_full_isl):
            return None
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
                   chunks: list[tuple[VLLMRequest, int, int, bool]], new_cached: int,
                   single: bool) -> Step:
        """The step (a decode-only run of several when nothing can change in between;
        `single`: one step, something may join the next)."""
        s = self.num_steps
        kv = self._sum_ctx_base + num_decode * s + num_decode  # contexts + this step's token
        p_tokens = sum(n for _, _, n, _ in chunks)
        if horizon is not None and not chunks and not single and self._has_finish_ahead():
            # a decode-only run: up to the first finish, the horizon, the next request the
            # API server hands over (the step at whose end it is ready comes last), and the
            # blocks that fit
            pending = self.next_ready_time()
            steps = 1 + self._decode_steps_that_fit(s, self._next_finish_step())
            ends = run_ends(self.step_model.decode_s, num_decode, kv, now, steps, horizon,
                            self.thermal, pending if pending is not None and pending > now
                            else float("inf"))
        else:
            sm, mem = self._clock_factors()
            pairs = sum(attention_pairs(p, n) for _, p, n, _ in chunks)
            cached_read = sum(p for _, p, _, _ in chunks)
            logits = sum(1 for *_, done in chunks if done)
            ends = [now + self.step_model.step_s(num_decode, kv, p_tokens, pairs, cached_read,
                                                 len(chunks), logits, sm, mem)]
        kind: StepKind = ("mixed" if chunks and num_decode
                          else "prefill" if chunks else "decode")
        self._pending = chunks
        return Step(kind, now, ends[-1] - now,
                    batch=[(seq.req, n) for seq, _, n, _ in chunks], num_decode=num_decode,
                    num_prefill_tokens=p_tokens, num_cached_tokens=new_cached,
                    num_waiting=self._num_waiting_at(now), decode_ends=ends)

    def _num_waiting_at(self, now: float) -> int:
        """The waiting requests the engine core holds at `now` (vllm:num_requests_waiting):
        those still in the API server (ready later, at the queue's end) are not counted."""
        n = len(self.waiting)
        for seq in reversed(self.waiting):
            if seq.ready <= now:
                break
            n -= 1
        return n

    def _decode_steps_that_fit(self, s: int, last: int) -> int:
        """How many decode steps after step `s`, up to step `last`, the free blocks give (a
        step needs a block for each decode whose last block is full)."""
        free = self.pool.num_free()
        bs = self.cfg.block_size
        if free >= self._num_decoding * cdiv(last - s, bs):
            return last - s  # every bs consecutive steps take one block per decode
        phase_count = self._phase_count
        taken = 0
        j = s + 1
        while j <= last:
            need = phase_count[(-j) % bs]
            if taken + need > free:
                break
            taken += need
            j += 1
        return j - s - 1

    def next_ready_time(self) -> float | None:
        """When the next waiting request reaches the engine core (None: nothing waits). The
        queue is in hand-over order, so its head is the first (a preempted request at the
        front is ready already)."""
        return self.waiting[0].ready if self.waiting else None

    # --- completing a step ---------------------------------------------------------------
    def _step_ended(self, step: Step, now: float) -> None:
        """The API server's hand-over learns when the host was done with the step's last."""
        k = len(step.decode_ends)
        last_start = step.decode_ends[-2] if k > 1 else step.start
        self.handover.step_done(last_start + self.step_model.host_s(
            step.num_decode, step.num_prefill_tokens, len(step.batch)), now)

    def _prefill_share(self, step: Step) -> float | None:
        tokens = step.num_prefill_tokens + step.num_decode
        return step.num_prefill_tokens / tokens if tokens else 0.0

    def _apply(self, step: Step, now: float, result: StepResult,
               thermal: list[ThermalFigures]) -> None:
        k = len(step.decode_ends)
        bs = self.cfg.block_size
        s = self.num_steps
        phase_count = self._phase_count
        later = [0] + [phase_count[(-(s + j)) % bs] for j in range(1, k)]  # blocks per step
        self.pool.take(sum(later))  # the run's later steps: taken in step order, as one
        self._count_steps(step)
        self._log_rows(step, later, thermal)  # the engine as the step leaves it, before frees
        # prefill chunks: the ones that reached their end sample a token
        for seq, _, _, done in self._pending:
            req = seq.req
            if req.state == "aborted" or seq.mode != "prefill" or not done:
                continue
            self._prefilling.remove(seq)
            seq.generated += 1
            self._first_token(req, now, result)
            if seq.generated >= req.output_len:
                req.close_segment(self.num_steps)
                self._finish(seq, now, result)
            else:
                self._enter_decode(seq)
        self._pending = []
        # decodes that sampled their last token
        last = self._pop_finished()
        while last is not None:
            seq = self.running[last.rid]
            self._materialize(seq)
            last.close_segment(self.num_steps)
            self._finish(seq, now, result)
            last = self._pop_finished()

    def _finish(self, seq: VLLMRequest, now: float, result: StepResult) -> None:
        req = seq.req
        self.running.pop(req.rid, None)
        self.kv.free(seq)
        seq.mode = "done"
        self._finished(req, now, result)

    def _log_rows(self, step: Step, later_blocks: list[int],
                  thermal: list[ThermalFigures]) -> None:
        hit = self._hit_rate()
        usable = self.pool.num_usable
        used = usable - self.pool.num_free()
        still = sum(later_blocks)  # blocks the run's later steps took: not in use at step 0
        usage = [(used - still) / usable]
        for need in later_blocks[1:]:
            still -= need
            usage.append((used - still) / usable)
        self.log.add_run(step.start, step.decode_ends, step.kind,
                         step.num_decode + len(step.batch), step.num_prefill_tokens,
                         step.num_decode, len(self.running), step.num_waiting, usage, hit,
                         thermal)
