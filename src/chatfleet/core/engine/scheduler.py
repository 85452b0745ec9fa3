"""SGLang's scheduler (v0.5), modelled step by step, with the radix cache and the KV pool.

Rules (docs/facts.md#sglang-scheduling: SGLang's scheduler.py / schedule_policy.py):
- Prefill first: whenever a prefill batch can be formed it runs, and decode stalls meanwhile.
  No mixed batches. Prefill batches hold at most `chunked_prefill_size` new tokens; a longer
  prompt is chunked and its chunks continue first in the following prefill batches.
- Admission (PrefillAdder, prefill_adder.py): budget = free + evictable tokens minus, over
  running requests, min(max_new - generated, 4096) x new_token_ratio; a waiting request is
  admitted when its extend length + min(max_new, 4096) fits; the first that does not stops the
  round (FCFS).
  LPM orders the queue by longest cached prefix and falls back to FCFS above 128 waiting.
- new_token_ratio starts at 0.7 and falls by (0.7 - 0.098) / 600 per decode step to 0.098;
  it returns to 0.7 when nothing runs.
- A decode step needs one KV slot per running request. When free + evictable cannot give it,
  requests are retracted (shortest output so far first, then longest input) to the back of the
  queue until free + evictable >= 20 x running; the ratio is reset to
  min(1, (decoded + 20 x running) / sum of max_new); retracted requests are prefilled again with
  their outputs so far and lose nothing else.
- CUDA graphs cover decode batches up to cuda_graph_max_bs; the step-time model adds the eager
  cost above it.
- With a host tier (host_tier.py: HiCache), a host prefix of at least 10 tokens is loaded back
  at admission (its copy overlaps the prefill, step_time.py), and under write-back the copies
  an eviction makes are waited for by the step that needed the room.

Decode is kept O(1) per step: the scheduler never walks the running batch per token. Each
running request remembers the global decode step at which its current decode segment started
(`join_step`); its generated count, its KV slots and the batch's context length follow from
running sums. Token times are the global step end times from `join_step` on. With a horizon
(the twin), decode steps run as one event while nothing can change them (decode_run.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from chatfleet.core.engine.base_scheduler import BaseScheduler
from chatfleet.core.engine.decode_run import run_ends
from chatfleet.core.engine.host_tier import (
    DEFAULT_WRITE_POLICY,
    LOAD_BACK_THRESHOLD,
    check_host_tier,
    make_tree,
)
from chatfleet.core.engine.kv_pool import KVPool
from chatfleet.core.engine.prefill_adder import CLIP_MAX_NEW_TOKENS, PrefillAdder
from chatfleet.core.engine.request import EngineRequest, as_tokens
from chatfleet.core.engine.step import Step, StepResult
from chatfleet.core.engine.step_time import StepTimeModel
from chatfleet.core.engine.steplog import ThermalFigures
from chatfleet.core.engine.thermal import ThermalState
from chatfleet.core.errors import ChatfleetError

SCHEDULE_POLICIES = ("fcfs", "lpm")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    pool_tokens: int
    chunked_prefill_size: int = 2048
    max_running_requests: int | None = None  # None: SGLang's default, pool // 2
    schedule_policy: str = "fcfs"
    eviction_policy: str = "lru"
    host_pool_tokens: int = 0  # HiCache's host pool (0: off); larger than the pool
    hicache_write_policy: str = DEFAULT_WRITE_POLICY
    load_back_threshold: int = LOAD_BACK_THRESHOLD  # a shorter host prefix is recomputed
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.098
    new_token_ratio_decay_steps: int = 600
    retract_decode_steps: int = 20
    lpm_fallback_queue: int = 128
    context_length: int = 40960

    def __post_init__(self) -> None:
        if self.pool_tokens <= 0:
            raise ChatfleetError("pool_tokens must be positive")
        if self.chunked_prefill_size <= 0:
            raise ChatfleetError("chunked_prefill_size must be positive")
        if self.max_running_requests is not None and self.max_running_requests <= 0:
            raise ChatfleetError("max_running_requests must be positive")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ChatfleetError(f"unknown schedule policy {self.schedule_policy!r}")
        check_host_tier(self.pool_tokens, self.host_pool_tokens, self.hicache_write_policy)

    @property
    def max_running(self) -> int:
        return self.max_running_requests or max(1, self.pool_tokens // 2)


class Scheduler(BaseScheduler):
    """SGLang's rules on the shared lifecycle (base_scheduler.py): a prefill round or a decode
    step, retraction by output so far, the radix tree."""

    engine_name = "sglang"

    def __init__(self, cfg: SchedulerConfig, step_model: StepTimeModel,
                 thermal: ThermalState | None = None) -> None:
        super().__init__(thermal)
        self.cfg = cfg
        self.step_model = step_model
        self.pool = KVPool(cfg.pool_tokens)
        self.tree = make_tree(cfg.eviction_policy, cfg.host_pool_tokens, cfg.hicache_write_policy)
        self._evicting_waits = self.tree.has_host_tier and cfg.hicache_write_policy == \
            "write_back"
        self.waiting: list[EngineRequest] = []
        self.running: dict[str, EngineRequest] = {}
        self.chunked: EngineRequest | None = None
        self.new_token_ratio = cfg.init_new_token_ratio
        self.ratio_decay = (cfg.init_new_token_ratio - cfg.min_new_token_ratio) / max(
            1, cfg.new_token_ratio_decay_steps)
        # running sums over `running` (decode requests)
        self._sum_fill = 0
        self._sum_join = 0
        self._sum_gen_base = 0
        self._sum_max_new = 0

    # --- requests in and out -------------------------------------------------------------
    def _pool_refusal(self, prompt_len: int, max_new_tokens: int) -> str | None:
        if prompt_len + max_new_tokens >= self.pool.capacity_tokens:
            # admission needs prompt + max_new strictly below the budget, so an empty pool
            # of exactly this size could never take it
            return (f"prompt ({prompt_len}) plus max_new_tokens ({max_new_tokens}) does not fit "
                    f"the KV pool ({self.pool.capacity_tokens} tokens)")
        return None

    def _enqueue(self, req: EngineRequest, now: float) -> None:
        self.waiting.append(req)

    def is_running(self, rid: str) -> bool:
        return rid in self.running

    def abort(self, rid: str) -> EngineRequest | None:
        """Drop a request wherever it is and free its KV at once."""
        for i, req in enumerate(self.waiting):
            if req.rid == rid:
                del self.waiting[i]
                req.state = "aborted"
                return req
        if self.chunked is not None and self.chunked.rid == rid:
            req = self.chunked
            self.chunked = None
            self._drop_prefilling(req)
            return req
        req_or_none = self.running.pop(rid, None)
        if req_or_none is not None:
            req = req_or_none
            self._leave_running(req)
            self._release(req, own=self._own_decode_slots(req))
            req.state = "aborted"
            req.close_segment(self.num_steps)
            return req
        if self.in_flight is not None:
            for req, _ in self.in_flight.batch:
                if req.rid == rid and req.state == "prefilling":
                    req.state = "aborted"  # cleaned up when the step completes
                    return req
        return None

    def _drop_prefilling(self, req: EngineRequest) -> None:
        self._release(req, own=req.num_own_tokens)
        req.num_own_tokens = 0
        req.state = "aborted"

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.chunked)

    def num_queued(self) -> int:
        return len(self.waiting)

    def flush(self) -> bool:
        """SGLang's /flush_cache: refused while anything runs or waits."""
        if self.has_work() or self.in_flight is not None:
            return False
        self.tree.reset()
        return True

    # --- accounting helpers --------------------------------------------------------------
    def free_tokens(self) -> int:
        return self.pool.capacity_tokens - self.tree.total_size() - self.pool.num_request_tokens

    def token_usage(self) -> float:
        used = self.pool.capacity_tokens - self.free_tokens() - self.tree.evictable_size()
        return used / self.pool.capacity_tokens

    def _own_decode_slots(self, req: EngineRequest) -> int:
        # a decode step in flight holds one slot per request: a run's first step's
        steps_allocated = self.num_steps + (
            1 if self.in_flight is not None and self.in_flight.kind == "decode" else 0)
        return steps_allocated - req.join_step

    def _generated(self, req: EngineRequest) -> int:
        return req.gen_base + self.num_steps - req.join_step

    def _release(self, req: EngineRequest, own: int) -> None:
        if own:
            self.pool.free(own)
        if req.prefix_node is not None:
            self.tree.dec_lock_ref(req.prefix_node)
            req.prefix_node = None
            req.prefix_len = 0

    def fits(self, tokens: int) -> bool:
        """Whether `tokens` fit the free slots and what the tree could evict for them."""
        return self.pool.can_allocate(tokens, self.tree.total_size(), self.tree.evictable_size())

    def ensure_free(self, tokens: int, now: float) -> None:
        short = tokens - self.free_tokens()
        if short > 0:
            self.tree.evict(short, now)
            if not self.pool.can_allocate(tokens, self.tree.total_size()):
                raise RuntimeError("KV pool exhausted: admission let in more than fits")

    def _enter_running(self, req: EngineRequest) -> None:
        self._start_decoding(req)
        self.running[req.rid] = req
        self._sum_fill += len(req.fill)
        self._sum_join += req.join_step
        self._sum_gen_base += req.gen_base
        self._sum_max_new += min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)

    def _leave_running(self, req: EngineRequest) -> None:
        self._sum_fill -= len(req.fill)
        self._sum_join -= req.join_step
        self._sum_gen_base -= req.gen_base
        self._sum_max_new -= min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        if not self.running:
            self.new_token_ratio = self.cfg.init_new_token_ratio

    def reserved_for_running(self) -> float:
        """What the running requests may still decode, times new_token_ratio."""
        n = len(self.running)
        generated = self._sum_gen_base + n * self.num_steps - self._sum_join
        return max(0, self._sum_max_new - generated) * self.new_token_ratio

    # --- scheduling ----------------------------------------------------------------------
    def _next_step(self, now: float, horizon: float | None) -> Step | None:
        """Prefill first: a prefill round when one can be formed, else a decode step (a run
        of them with a horizon) when anything runs."""
        step = self._schedule_prefill(now)
        if step is None and self.running:
            step = self._schedule_decode(now, horizon)
        return step

    def _queue_order(self, now: float) -> list[EngineRequest]:
        if self.cfg.schedule_policy == "lpm" and len(self.waiting) <= self.cfg.lpm_fallback_queue:
            keyed = [(-self.tree.match_prefix(r.fill, now).device_len, i, r)
                     for i, r in enumerate(self.waiting)]
            keyed.sort(key=lambda k: (k[0], k[1]))
            return [r for _, _, r in keyed]
        return self.waiting

    def _schedule_prefill(self, now: float) -> Step | None:
        """A prefill round (prefill_adder.py): the chunked request's next chunk first, then
        waiting requests in queue order while they fit and fewer than max_running run."""
        if self.chunked is None and not self.waiting:
            return None
        cfg = self.cfg
        adder = PrefillAdder(self.tree, self.pool, cfg.chunked_prefill_size,
                             cfg.load_back_threshold, self.reserved_for_running(),
                             self.free_tokens, self.ensure_free, now)
        chunked = self.chunked
        candidates: Sequence[EngineRequest] = self._queue_order(now)
        if chunked is not None:
            candidates = [chunked, *candidates]
        max_running = cfg.max_running
        for req in candidates:
            if req is not chunked and len(self.running) + len(adder.batch) >= max_running:
                break
            if adder.rem_chunk <= 0:
                break
            if not (adder.add_chunked(req) if req is chunked else adder.add_one(req)):
                break
        if adder.chunked is not None:
            self.chunked = adder.chunked  # the rest of its prompt goes first next time
        self.num_prefill_input_tokens += adder.num_input_tokens
        self.num_prefill_cached_tokens += adder.num_cached_tokens
        for req in adder.admitted:
            self.waiting.remove(req)
        batch = adder.batch
        if not batch:
            return None
        new_tokens = sum(e for _, e in batch)
        sm, mem = self._clock_factors()
        duration = self.step_model.prefill_s(new_tokens, adder.pairs, adder.cached_read,
                                             adder.logits, adder.load_back, sm, mem)
        duration += self._write_back_wait()
        return Step("prefill", now, duration, batch=batch, num_prefill_tokens=new_tokens,
                    num_cached_tokens=adder.num_cached_tokens, num_waiting=len(self.waiting))

    def _schedule_decode(self, now: float, horizon: float | None = None) -> Step:
        retracted = self._retract_if_needed(now)
        n = len(self.running)
        if n == 0:
            # everything was retracted; the requeued work goes through prefill
            step = self._schedule_prefill(now)
            if step is None:
                raise RuntimeError("retraction left nothing schedulable")
            return step
        # each request attends over its prefill, its decoded tokens and the token of this step
        kv_tokens = self._sum_fill + n * (self.num_steps + 1) - self._sum_join
        max_steps = 1
        if horizon is not None and not self.waiting and self.chunked is None and not retracted:
            to_finish = self._next_finish_step() - self.num_steps + 1
            # write-back makes an eviction cost time: a run then takes no step that evicts
            evictable = 0 if self._evicting_waits else self.tree.evictable_size()
            max_steps = max(1, min(to_finish, (self.free_tokens() + evictable) // n))
        # this step's slots now, as a single step takes them; a run's later steps take theirs as
        # it completes (_complete_decode), so that a run cut short by an arrival has evicted
        # from the tree only what the steps it kept needed, as single steps would have
        self.ensure_free(n, now)
        self.pool.allocate(n)
        ends = run_ends(self.step_model.decode_s, n, kv_tokens, now + self._write_back_wait(),
                        max_steps, float("inf") if horizon is None else horizon, self.thermal)
        t = ends[-1]
        return Step("decode", now, t - now, num_decode=n, num_waiting=len(self.waiting),
                    decode_ends=ends)

    def _retract_if_needed(self, now: float) -> list[EngineRequest]:
        n = len(self.running)
        if self.fits(n):
            return []
        cfg = self.cfg
        order = sorted(
            self.running.values(),
            key=lambda r: (self._generated(r), -r.prompt_len),
            reverse=True,
        )
        retracted: list[EngineRequest] = []
        while order and len(order) > 1:
            if self.fits(cfg.retract_decode_steps * len(order)):
                break
            req = order.pop()
            generated = self._generated(req)
            del self.running[req.rid]
            self._leave_running(req)
            self._release(req, own=self._own_decode_slots(req))
            self._requeue(req, generated)
            retracted.append(req)
        self.waiting.extend(retracted)  # back of the queue (_extend_requests_to_queue)
        total_max_new = self._sum_max_new
        decoded = self._sum_gen_base + len(self.running) * self.num_steps - self._sum_join
        if total_max_new > 0:
            self.new_token_ratio = min(
                1.0, (decoded + cfg.retract_decode_steps * len(self.running)) / total_max_new)
        return retracted

    def _write_back_wait(self) -> float:
        """The wait for the host copies that this step's evictions made (write-back only:
        HiRadixCache.evict blocks until they are written)."""
        return self.step_model.host_transfer_s(self.tree.take_write_back_tokens())

    # --- completing a step ---------------------------------------------------------------
    def _apply(self, step: Step, now: float, result: StepResult,
               thermal: list[ThermalFigures]) -> None:
        if step.kind == "prefill":
            self._complete_prefill(step, now, result)
            self.log.add(now, "prefill", len(step.batch), step.num_prefill_tokens, 0,
                         len(self.running), step.num_waiting, self.token_usage(),
                         self._hit_rate(), thermal[0], step.duration)
        else:
            self._complete_decode(step, now, result, thermal)

    def _complete_prefill(self, step: Step, now: float, result: StepResult) -> None:
        for req, extend in step.batch:
            if req.state == "aborted":
                if self.chunked is req:
                    self.chunked = None
                self._release(req, own=req.num_own_tokens)
                req.num_own_tokens = 0
                continue
            start = req.num_computed
            req.num_computed += extend
            # cache_unfinished_req: the computed part joins the tree and stays locked. The
            # part before `start` is the locked prefix, so only the new chunk is walked.
            chunked = req.num_computed < len(req.fill)
            new = req.fill[start: req.num_computed]
            if req.prefix_node is not None and req.prefix_len == start:
                _, node = self.tree.insert_below(req.prefix_node, new, now, req.priority,
                                                 chunked=chunked)
            else:
                _, node = self.tree.insert_node(req.fill[: req.num_computed], now,
                                                req.priority, chunked=chunked)
            self.pool.free(req.num_own_tokens)
            req.num_own_tokens = 0
            old = req.prefix_node
            self.tree.inc_lock_ref(node)
            if old is not None:
                self.tree.dec_lock_ref(old)
            req.prefix_node = node
            req.prefix_len = req.num_computed
            if req.num_computed < len(req.fill):
                continue  # more chunks to come
            if self.chunked is req:
                self.chunked = None
            req.gen_base += 1
            self._first_token(req, now, result)
            if req.gen_base >= req.output_len:
                req.close_segment(self.num_steps)
                self._finish(req, now, result)
            else:
                self._enter_running(req)

    def _complete_decode(self, step: Step, now: float, result: StepResult,
                         thermal: list[ThermalFigures]) -> None:
        ends = step.decode_ends
        k = len(ends)
        n = step.num_decode
        if k > 1:
            # the slots of the run's later steps (the first step's were taken at schedule);
            # a request aborted during the run gave its own back and takes none
            later = len(self.running) * (k - 1)
            self.ensure_free(later, now)
            self.pool.allocate(later)
        cap = self.pool.capacity_tokens
        used = cap - self.free_tokens() - self.tree.evictable_size()
        # one log entry per decode step, as SGLang's; the later steps' slots were not yet used
        self.log.add_run(step.start, ends, "decode", n, 0, n, len(self.running),
                         step.num_waiting, [(used - n * (k - 1 - j)) / cap for j in range(k)],
                         self._hit_rate(), thermal)
        self._count_steps(step)
        if not self.running:
            self.new_token_ratio = self.cfg.init_new_token_ratio
        elif not self._retracted:  # the retraction step keeps its reset value
            self.new_token_ratio = max(self.cfg.min_new_token_ratio,
                                       self.new_token_ratio - k * self.ratio_decay)
        req = self._pop_finished()
        while req is not None:
            del self.running[req.rid]
            self._leave_running(req)
            req.close_segment(self.num_steps)
            self._finish(req, now, result, own=self.num_steps - req.join_step)
            req = self._pop_finished()

    def _finish(self, req: EngineRequest, now: float, result: StepResult, own: int = 0) -> None:
        # cache_finished_req: prompt + outputs but the last (which has no KV) join the tree;
        # the locked prefix node holds all of `fill`, so only the rest is walked
        done = len(req.fill)
        rest = as_tokens(req.output_ids)[done - req.prompt_len: req.output_len - 1]
        if req.prefix_node is not None and req.prefix_len == done:
            self.tree.insert_below(req.prefix_node, rest, now, req.priority)
        else:
            self.tree.insert(as_tokens(req.prompt) + as_tokens(req.output_ids)[
                : req.output_len - 1], now, req.priority)
        self._release(req, own=own)
        self._finished(req, now, result)

    # --- the engine-model interface (protocol.py) ----------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.pool.capacity_tokens

    @property
    def context_length(self) -> int:
        return self.cfg.context_length

    @property
    def num_evicted_tokens(self) -> int:
        return self.tree.num_evicted_tokens

    def num_running(self) -> int:
        return len(self.running)

    def max_new_tokens_room(self, prompt_len: int) -> int:
        # admission needs prompt + max_new strictly below the pool (SGLang's max_req_len - 1)
        return min(self.cfg.context_length - prompt_len,
                   self.pool.capacity_tokens - 1 - prompt_len)

    def num_used_tokens(self) -> int:
        return self.pool.capacity_tokens - self.free_tokens() - self.tree.evictable_size()

    def decoding_requests(self) -> list[EngineRequest]:
        return list(self.running.values())

    def prefix_cache_counters(self) -> tuple[int, int]:
        """(prompt tokens, of those cached), counted once per request at admission."""
        return self.num_prefill_input_tokens, self.num_prefill_cached_tokens

    def step_tokens(self, result: StepResult) -> list[EngineRequest]:
        """The requests that got a token in this (single) step."""
        if result.step.kind == "prefill":
            return list(result.first_tokens)
        return [*self.running.values(), *result.finished]
