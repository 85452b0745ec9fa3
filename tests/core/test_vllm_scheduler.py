"""vLLM V1 scheduler model, driven step by step on tiny setups whose numbers are worked out by
hand in each test (block size 16 unless said).

Timing: the toy model of test_scheduler.py makes every weight, GEMM and attention term
negligible, so a step with any prefill tokens lasts PREFILL = 0.05 s and a decode-only step
DECODE = 0.01 s (no per-sequence cost unless a test sets one).
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections.abc import Callable, Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.core.test_scheduler import CONSTANTS, DECODE, PREFILL, TOL, TOY

from chatfleet.core.calibration import L4_CALIBRATION
from chatfleet.core.engine.kv_cache_manager import cdiv
from chatfleet.core.engine.mixed_step import MixedStepModel
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.step import Step, StepResult
from chatfleet.core.engine.vllm_config import VLLMConfig
from chatfleet.core.engine.vllm_scheduler import VLLMScheduler
from chatfleet.core.specs import builtin_model, get_gpu, precision

OUT_BASE = 1_000_000


def make(blocks: int = 64, budget: int = 64, max_seqs: int = 8, per_seq_s: float = 0.0,
         **kw: object) -> VLLMScheduler:
    """A tiny engine. Synchronous scheduling unless a test asks for vLLM's async default: the
    hand-worked step sequences below read a request into the first step after it arrives."""
    kw.setdefault("async_scheduling", False)
    cfg = VLLMConfig(num_gpu_blocks=blocks, max_num_batched_tokens=budget,
                     max_num_seqs=max_seqs, **kw)  # type: ignore[arg-type]
    model = MixedStepModel(TOY, get_gpu("l4"), precision("bf16", "bf16"), CONSTANTS, per_seq_s,
                           budget, 1 << 20)
    return VLLMScheduler(cfg, model)


def ids(base: int, n: int) -> list[int]:
    return list(range(base, base + n))


def req(rid: str, prompt: list[int], out: int, max_new: int | None = None) -> EngineRequest:
    base = OUT_BASE * (1 + zlib.crc32(rid.encode()) % 100_000)
    return EngineRequest(rid, prompt, ids(base, out), max_new or out)


def held_blocks(s: VLLMScheduler) -> Iterable[tuple[str, int]]:
    """(rid, blocks held) of every running request, worked out from its token count."""
    in_step = 1 if s.in_flight is not None and s.in_flight.num_decode else 0
    for rid, seq in s.running.items():
        if seq.mode == "decode":
            computed = (seq.req.prompt_len + seq.req.gen_base
                        + s.num_steps - seq.req.join_step - 1 + in_step)
            yield rid, cdiv(computed, s.cfg.block_size)
        else:
            yield rid, seq.num_blocks


def check_invariants(s: VLLMScheduler) -> None:
    pool = s.pool
    assert 0 <= pool.num_free() <= pool.num_usable
    assert 0.0 <= s.token_usage() <= 1.0
    held = dict(held_blocks(s))
    unique: dict[int, object] = {}
    private = 0
    for rid, seq in s.running.items():
        for b in seq.blocks:
            unique[id(b)] = b
        private += held[rid] - len(seq.blocks)
        assert private >= 0
    assert len(unique) + private == pool.num_usable - pool.num_free()
    # a cached block's ref count is its holders; free ones (ref 0) wait in the free queue
    holders: dict[int, int] = {}
    for seq in s.running.values():
        for b in seq.blocks:
            holders[id(b)] = holders.get(id(b), 0) + 1
    for b in pool.cached_blocks():
        assert b.ref_cnt == holders.get(id(b), 0)
        assert (b in pool.cached_free) == (b.ref_cnt == 0)
    # between steps, at most one chunked prefill runs, and it is the last in `running`
    modes = [seq.mode for seq in s.running.values()]
    if s.in_flight is None and "prefill" in modes:
        assert modes.count("prefill") == 1 and modes[-1] == "prefill"
    assert len(s.running) <= s.cfg.max_num_seqs


def drive(s: VLLMScheduler, arrivals: list[tuple[float, EngineRequest]],
          on_step: Callable[[VLLMScheduler, Step, StepResult], None] | None = None,
          horizon: float | None = None, max_steps: int = 100_000) -> list[StepResult]:
    pending = sorted(arrivals, key=lambda a: a[0])
    results: list[StepResult] = []
    now, i = 0.0, 0
    for _ in range(max_steps):
        while i < len(pending) and pending[i][0] <= now:
            s.add_request(pending[i][1], pending[i][0])
            i += 1
        step = s.schedule(now, horizon)
        check_invariants(s)
        if step is None:
            wake = s.next_ready_time()
            if wake is not None and wake > now:  # the API server still holds a request
                now = min(wake, pending[i][0]) if i < len(pending) else wake
                continue
            assert not s.has_work(), "work is waiting but nothing can be scheduled"
            if i == len(pending):
                return results
            now = pending[i][0]
            continue
        if horizon is not None and i < len(pending) and pending[i][0] < step.end:
            new_end = s.truncate_decode_run(pending[i][0])
            if new_end is not None:
                assert step.end == new_end
        res = s.complete(step.end)
        check_invariants(s)
        results.append(res)
        if on_step is not None:
            on_step(s, step, res)
        now = step.end
    raise AssertionError("the scheduler did not finish")


def chunks(results: list[StepResult]) -> list[list[tuple[str, int]]]:
    return [[(r.rid, n) for r, n in res.step.batch] for res in results]


# ------------------------------------------------------------------------------------------
# timing and the token budget


def test_one_request_prefills_then_decodes_one_token_per_step() -> None:
    s = make()
    a = req("a", ids(0, 20), 5)
    results = drive(s, [(0.0, a)])
    assert [r.step.kind for r in results] == ["prefill"] + ["decode"] * 4
    assert s.token_times(a) == pytest.approx([0.05, 0.06, 0.07, 0.08, 0.09], abs=TOL)
    assert a.state == "finished"


def test_the_budget_goes_to_decodes_first_and_the_rest_to_a_prefill_chunk() -> None:
    # a and b decode; c's 100-token prompt arrives: each step gives a and b one token and c
    # the 32 - 2 = 30 left, so c's prompt takes chunks of 30, 30, 30 and 10, and a and b never
    # stall: a token every step, mixed ones included
    s = make(budget=32)
    a, b = req("a", ids(0, 10), 8), req("b", ids(100, 10), 8)
    c = req("c", ids(1000, 100), 2)
    results = drive(s, [(0.0, a), (0.0, b), (0.06, c)])
    assert chunks(results)[:2] == [[("a", 10), ("b", 10)], []]
    c_chunks = [n for step in chunks(results) for rid, n in step if rid == "c"]
    assert c_chunks == [30, 30, 30, 10]
    mixed = [r.step for r in results if r.step.kind == "mixed"]
    assert [m.num_decode for m in mixed] == [2, 2, 2, 2]
    # a's tokens: the prefill's, then one at the end of every following step (0.05 s when a
    # chunk rides along, 0.01 s when not)
    times = s.token_times(a)
    gaps = [round(t1 - t0, 6) for t0, t1 in itertools.pairwise(times)]
    assert gaps == [0.01, 0.05, 0.05, 0.05, 0.05, 0.01, 0.01]
    assert c.first_token_time == pytest.approx(0.06 + 4 * PREFILL, abs=TOL)


def real_l4(async_scheduling: bool) -> VLLMScheduler:
    """Qwen3-8B on the L4 (the built-in constants): a decode step is 1.5 ms of host work and
    about 70 ms of weights streamed, the GPU's part far the longer."""
    gpu, prec = get_gpu("l4"), precision("bf16", "bf16")
    c = L4_CALIBRATION.constants(gpu, "bf16")
    model = MixedStepModel(builtin_model("qwen3-8b"), gpu, prec, c, 0.0, 2048, 1 << 20)
    return VLLMScheduler(VLLMConfig(num_gpu_blocks=4096, max_num_batched_tokens=2048,
                                    async_scheduling=async_scheduling), model)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_with_async_scheduling_an_arrival_after_the_host_is_done_waits_a_step(
        async_scheduling: bool) -> None:
    # a decodes; c reaches the engine in the middle of a decode step, after the host's 1.5 ms
    # of it. Synchronous: the next step takes c. Async: the next step was scheduled when the
    # host was done with this one, so c joins the one after: its first token a step later
    s = real_l4(async_scheduling)
    a, c = req("a", ids(0, 10), 12), req("c", ids(1000, 20), 2)
    first = drive(real_l4(False), [(0.0, req("a", ids(0, 10), 12))])
    step_ends = [r.step.end for r in first]
    arrive = (step_ends[2] + step_ends[3]) / 2  # mid-way through the fourth step
    results = drive(s, [(0.0, a), (arrive, c)])
    starts = [r.step.start for r in results if any(q.rid == "c" for q, _ in r.step.batch)]
    assert starts[0] == pytest.approx(step_ends[3] if not async_scheduling else step_ends[4])
    # an engine idle when a request arrives takes it at once, async or not
    idle = real_l4(async_scheduling)
    d = req("d", ids(2000, 10), 1)
    drive(idle, [(0.5, d)])
    assert d.first_token_time == pytest.approx(
        0.5 + idle.step_model.step_s(0, 0, 10, 55.0, 0, 1, 1), rel=1e-9)


def test_with_async_scheduling_an_arrival_while_the_host_works_is_not_delayed() -> None:
    # the toy engine's steps are host work only: the next step is scheduled at the end of
    # this one, and async scheduling changes nothing
    sync, asy = make(async_scheduling=False), make(async_scheduling=True)
    runs = []
    for s in (sync, asy):
        a, c = req("a", ids(0, 10), 12), req("c", ids(1000, 20), 2)
        drive(s, [(0.0, a), (0.065, c)])
        runs.append((list(s.token_times(a)), list(s.token_times(c))))
    assert runs[0] == runs[1]


def test_a_chunked_prefill_continues_before_any_new_request_and_then_shares_the_step() -> None:
    # budget 48: c (70 tokens) takes 48 then 22; d arrives during c's first chunk and gets the
    # 26 left in c's last step, beside it
    s = make(budget=48)
    c, d = req("c", ids(0, 70), 3), req("d", ids(500, 40), 3)
    results = drive(s, [(0.0, c), (0.01, d)])
    assert chunks(results)[:3] == [[("c", 48)], [("c", 22), ("d", 26)], [("d", 14)]]
    assert results[2].step.kind == "mixed" and results[2].step.num_decode == 1


def test_long_prefill_token_threshold_caps_each_chunk() -> None:
    s = make(budget=64, long_prefill_token_threshold=20)
    a = req("a", ids(0, 50), 2)
    results = drive(s, [(0.0, a)])
    assert [n for step in chunks(results) for _, n in step] == [20, 20, 10]


def test_the_api_server_hands_requests_over_one_after_another() -> None:
    # a front end of 10 ms per request: a, b, c all arrive at 0 and reach the engine at 0.01,
    # 0.02 and 0.03. a's prefill starts alone at 0.01; b and c join the next step, beside a's
    # first decode, so the burst is spread over two steps
    s = make(budget=64, frontend_s=0.01)
    a, b, c = (req(x, ids(100 * i, 10), 3) for i, x in enumerate("abc"))
    results = drive(s, [(0.0, a), (0.0, b), (0.0, c)])
    assert chunks(results)[:2] == [[("a", 10)], [("b", 10), ("c", 10)]]
    assert results[0].step.start == pytest.approx(0.01)
    assert a.first_token_time == pytest.approx(0.01 + PREFILL, abs=TOL)
    assert b.first_token_time == pytest.approx(0.01 + 2 * PREFILL, abs=TOL)
    assert results[1].step.kind == "mixed"


def test_mixed_step_pays_the_per_sequence_cost_beyond_the_first() -> None:
    s = make(budget=64, per_seq_s=0.002)
    reqs = [req(f"r{i}", ids(100 * i, 10), 3) for i in range(3)]
    results = drive(s, [(0.0, r) for r in reqs])
    assert results[0].step.duration == pytest.approx(PREFILL + 2 * 0.002, abs=TOL)
    assert results[1].step.duration == pytest.approx(DECODE + 2 * 0.002, abs=TOL)


# ------------------------------------------------------------------------------------------
# prefix cache: full blocks only, the last token computed


def test_a_cached_prefix_counts_only_full_blocks_and_leaves_the_last_token_to_compute() -> None:
    s = make(budget=256)
    a = req("a", ids(0, 40), 1)  # 2 full blocks + 8 tokens: 32 cached after it
    drive(s, [(0.0, a)])
    b = req("b", ids(0, 40) + ids(900, 5), 1)  # shares a's 40 tokens: 2 full blocks hit
    c = req("c", ids(0, 32), 1)  # exactly a's 2 blocks: the last token must be computed, so
    # only 1 block (16) can be a hit, and 16 tokens are computed
    d = req("d", ids(0, 20) + ids(700, 30), 1)  # shares 20 tokens: one full block
    e = req("e", ids(1, 40), 1)  # shifted by one: nothing
    results = drive(s, [(1.0, r) for r in (b, c, d, e)])
    assert [r.num_cached_tokens for r in (b, c, d, e)] == [32, 16, 16, 0]
    assert dict(chunks(results)[0]) == {"b": 13, "c": 16, "d": 34, "e": 40}
    assert results[0].step.num_cached_tokens == 64


def test_a_finished_requests_output_is_cached_but_its_last_token() -> None:
    s = make()
    a = req("a", ids(0, 20), 13)  # 20 + 12 computed tokens = 2 full blocks
    drive(s, [(0.0, a)])
    history = ids(0, 20) + list(a.output_ids)
    b = req("b", history + ids(5000, 10), 1)  # its prompt carries a's whole answer
    c = req("c", history[:31] + ids(6000, 10), 1)  # differs inside the second block
    drive(s, [(1.0, b), (1.0, c)])
    assert b.num_cached_tokens == 32
    assert c.num_cached_tokens == 16


def test_flush_is_refused_while_a_request_runs_and_empties_the_cache_after() -> None:
    s = make()
    a = req("a", ids(0, 40), 3)
    s.add_request(a, 0.0)
    step = s.schedule(0.0)
    assert step is not None
    s.complete(step.end)
    assert not s.flush()  # a holds blocks
    drive(s, [])
    assert s.flush()
    b = req("b", ids(0, 40), 1)
    drive(s, [(1.0, b)])
    assert b.num_cached_tokens == 0


# ------------------------------------------------------------------------------------------
# the free queue: who is evicted first


def prompt_hits(s: VLLMScheduler, prompt: list[int]) -> int:
    """How many tokens of `prompt` the cache holds now (the lookup admission makes)."""
    from chatfleet.core.engine.block_pool import chain_keys, token_bytes

    keys = chain_keys(token_bytes(prompt), [], (len(prompt) - 1) // 16)
    return len(s.pool.longest_hit(keys, len(keys))) * 16


def test_freed_blocks_are_evicted_last_block_first_and_oldest_request_first() -> None:
    # 15 usable blocks. a (49 tokens: 3 full blocks cached) and then b (33 tokens: 2 cached)
    # finish; their partial last blocks hold nothing and go to the head of the free queue,
    # their cached blocks to the tail: a's in reverse (a2 a1 a0), then b's (b1 b0); 10 empty
    # blocks stand before them.
    s = make(blocks=16, budget=256)
    pa, pb = ids(0, 49), ids(1000, 33)
    drive(s, [(0.0, req("a", pa, 1))])
    drive(s, [(1.0, req("b", pb, 1))])
    assert s.pool.num_free() == 15 and len(s.pool.cached_free) == 5
    assert s.pool.num_empty_free == 10
    # c (170 tokens) takes 11 blocks: the 10 empty ones, then evicts a2 (a's last block)
    drive(s, [(2.0, req("c", ids(5000, 170), 1))])
    assert prompt_hits(s, pa) == 32 and prompt_hits(s, pb) == 32
    assert s.pool.num_evicted_blocks == 1
    # d (40 tokens) takes 3: c's empty partial block, then a1 and a0; b is still whole
    drive(s, [(3.0, req("d", ids(9000, 40), 1))])
    assert prompt_hits(s, pa) == 0 and prompt_hits(s, pb) == 32


def test_a_hit_moves_the_blocks_to_the_tail_again() -> None:
    s = make(blocks=16, budget=256)
    pa, pb = ids(0, 49), ids(1000, 33)
    drive(s, [(0.0, req("a", pa, 1))])
    drive(s, [(1.0, req("b", pb, 1))])
    again = req("again", pa, 1)  # hits a's 3 blocks (48 tokens), computes 1, frees them again
    drive(s, [(2.0, again)])
    assert again.num_cached_tokens == 48
    # the free queue: 10 empty, then b1 b0, then a2 a1 a0 (now the most recently used)
    # e (180 tokens) takes 12: the 10 empty ones, then b's two
    drive(s, [(3.0, req("e", ids(9000, 180), 1))])
    assert prompt_hits(s, pb) == 0 and prompt_hits(s, pa) == 48


# ------------------------------------------------------------------------------------------
# preemption by recompute


def test_the_newest_running_request_is_preempted_to_the_queue_front_and_recomputes() -> None:
    # 3 usable blocks. a (prompt 16) holds 1 block, b (prompt 24) holds 2: none free. At the
    # first decode step a's 16 computed tokens fill its block and it needs a second: the last
    # running request (b, the newest) is preempted, frees its 2 blocks (b0 cached, its partial
    # block empty) and goes back to the queue; a takes the empty one.
    s = make(blocks=4, budget=64)
    a, b = req("a", ids(0, 16), 5), req("b", ids(100, 24), 5)
    c = req("c", ids(200, 10), 1)  # arrives during step 1, behind b
    preempted: list[tuple[int, str, list[str]]] = []

    def on_step(sch: VLLMScheduler, step: Step, res: StepResult) -> None:
        if res.retracted:
            preempted.append((sch.num_steps - 1, step.kind, [r.rid for r in res.retracted]))

    results = drive(s, [(0.0, a), (0.0, b), (0.055, c)], on_step=on_step)
    assert preempted == [(1, "decode", ["b"])]
    assert b.num_retractions == 1 and s.num_retractions == 1
    # b waits at the front: c (one block) would fit, but the queue is FCFS and b, whose whole
    # sequence (25 tokens: 2 blocks) does not fit, blocks it until a finishes (step 4)
    steps = chunks(results)
    assert steps[1:5] == [[], [], [], []]
    # then b recomputes only what its cached block does not hold: 25 - 16 = 9 tokens, and c
    # follows it in the same step
    assert steps[5] == [("b", 9), ("c", 10)]
    for r in (a, b, c):
        assert r.state == "finished"
        times = s.token_times(r)
        assert len(times) == r.output_len and list(times) == sorted(times)
    # b's stream: its first token, a pause while it waited, then the rest
    tb = s.token_times(b)
    assert tb[0] == pytest.approx(PREFILL, abs=TOL)
    assert tb[1] == pytest.approx(PREFILL + 4 * DECODE + PREFILL, abs=TOL)


def test_max_num_seqs_keeps_the_third_request_waiting() -> None:
    s = make(max_seqs=2, budget=64)
    a, b, c = (req(x, ids(100 * i, 10), 4 + i) for i, x in enumerate("abc"))
    results = drive(s, [(0.0, a), (0.0, b), (0.0, c)])
    assert chunks(results)[0] == [("a", 10), ("b", 10)]
    c_step = next(i for i, step in enumerate(chunks(results)) if ("c", 10) in step)
    assert c_step == 4  # a finished at the end of step 3 (prefill + 3 decodes)
    assert max(row.batch for row in s.log) == 2


@pytest.mark.parametrize("reserve_full", [True, False])
def test_the_whole_sequence_must_fit_before_a_request_is_admitted(reserve_full: bool) -> None:
    # 9 usable blocks, budget 17; a (prompt 40) prefills in chunks 17, 17, 6 and holds 3
    # blocks, then decodes. b (prompt 100) needs 7 blocks: its first chunk (11 tokens in a's
    # last chunk step) would fit, its whole prompt does not while a runs. With
    # scheduler_reserve_full_isl (vLLM 0.26's default) b waits for a to finish; without it b
    # starts beside a's last chunk.
    s = make(blocks=10, budget=17, scheduler_reserve_full_isl=reserve_full)
    a = req("a", ids(0, 40), 20)
    b = req("b", ids(500, 100), 1)
    results = drive(s, [(0.0, a), (0.02, b)])
    first_b = next(i for i, step in enumerate(chunks(results)) if any(r == "b" for r, _ in step))
    if reserve_full:
        assert results[first_b - 1].finished == [a]
    else:
        assert first_b == 2 and chunks(results)[2] == [("a", 6), ("b", 11)]


# ------------------------------------------------------------------------------------------
# decode runs give what single steps give; random workloads keep the pool consistent


def _random_arrivals(seed: int, n: int, shared: int) -> list[tuple[float, EngineRequest]]:
    rng = random.Random(seed)
    system = ids(0, shared)
    out = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(20.0)
        body = ids(10_000 * (i + 1), rng.randint(1, 60))
        prompt = (system if rng.random() < 0.7 else []) + body
        out.append((t, req(f"r{i}", prompt or [1], rng.randint(1, 40))))
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(9, 40), budget=st.integers(8, 80),
       max_seqs=st.integers(1, 8), shared=st.sampled_from([0, 16, 40]))
def test_random_workloads_keep_the_pool_consistent_and_finish_every_request(
        seed: int, blocks: int, budget: int, max_seqs: int, shared: int) -> None:
    budget = max(budget, max_seqs)
    s = make(blocks=blocks, budget=budget, max_seqs=max_seqs)
    arrivals = [(t, r) for t, r in _random_arrivals(seed, 12, shared)
                if s.check_request(r.prompt_len, r.max_new_tokens) is None]
    drive(s, arrivals)
    for _, r in arrivals:
        assert r.state == "finished"
        times = s.token_times(r)
        assert len(times) == r.output_len
        assert list(times) == sorted(times)
    assert s.pool.num_free() == s.pool.num_usable  # every block back in the free queue


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), blocks=st.integers(12, 40), budget=st.integers(8, 80),
       frontend=st.sampled_from([0.0, 0.004]))
def test_decode_runs_give_exactly_what_single_steps_give(seed: int, blocks: int,
                                                         budget: int, frontend: float) -> None:
    def run(horizon: float | None) -> list[list[float]]:
        s = make(blocks=blocks, budget=budget, max_seqs=4, frontend_s=frontend)
        arrivals = [(t, r) for t, r in _random_arrivals(seed, 10, 16)
                    if s.check_request(r.prompt_len, r.max_new_tokens) is None]
        drive(s, arrivals, horizon=horizon)
        return [list(s.token_times(r)) for _, r in arrivals]

    single = run(None)
    runs = run(1e9)
    assert len(single) == len(runs)
    for a, b in zip(single, runs, strict=True):
        assert a == pytest.approx(b, abs=1e-9)


def test_abort_frees_its_blocks_at_once() -> None:
    s = make()
    a = req("a", ids(0, 40), 10)
    s.add_request(a, 0.0)
    step = s.schedule(0.0)
    assert step is not None
    s.complete(step.end)
    assert s.pool.num_free() < s.pool.num_usable
    assert s.abort("a") is a
    assert s.pool.num_free() == s.pool.num_usable and not s.has_work()
    assert s.abort("a") is None
