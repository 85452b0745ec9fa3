"""The tree after requests finish: exactly the unique tokens with KV, whatever path inserted
them (a fully cached prompt, chunks, a retraction)."""

from __future__ import annotations

from array import array

from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.scheduler import Scheduler, SchedulerConfig
from chatfleet.core.engine.step_time import StepConstants, StepTimeModel
from chatfleet.core.specs import builtin_model, get_gpu, precision

CONST = StepConstants(bandwidth_eff=0.7, gemm_eff=0.5, attn_eff=0.5, decode_fixed_s=0.001,
                      prefill_fixed_s=0.01, eager_s=0.004, cuda_graph_max_bs=24,
                      chunked_prefill_size=64)


def sched(pool: int = 10_000, chunk: int = 64) -> Scheduler:
    model = builtin_model("qwen3-8b")
    step = StepTimeModel(model, get_gpu("l4"), precision("bf16", "bf16"), CONST)
    return Scheduler(SchedulerConfig(pool_tokens=pool, chunked_prefill_size=chunk), step)


def drain(s: Scheduler, now: float = 0.0) -> float:
    while s.has_work():
        step = s.schedule(now)
        assert step is not None
        now = step.end
        s.complete(now)
    return now


def req(rid: str, prompt: list[int], out: list[int]) -> EngineRequest:
    return EngineRequest(rid, array("q", prompt), array("q", out), len(out))


def test_a_fully_cached_prompt_recomputes_its_last_token_and_adds_only_its_answer() -> None:
    s = sched()
    prompt = list(range(1, 101))
    s.add_request(req("a", prompt, [1001, 1002, 1003]), 0.0)
    now = drain(s)
    # prompt + answer but its last token: 100 + 2
    assert s.tree.total_size() == 102
    b = req("b", prompt, [2001, 2002])
    s.add_request(b, now)
    drain(s, now)
    assert b.num_cached_tokens == 99  # capped at prompt_len - 1
    assert s.tree.total_size() == 102 + 1  # b's answer but its last token
    assert s.pool.num_request_tokens == 0
    assert s.tree.protected_size() == 0


def test_chunked_prompts_land_in_the_tree_once() -> None:
    s = sched(chunk=64)
    prompt = list(range(1, 301))  # five chunks of at most 64
    a = req("a", prompt, [9001, 9002])
    s.add_request(a, 0.0)
    kinds = []
    now = 0.0
    while s.has_work():
        step = s.schedule(now)
        assert step is not None
        kinds.append(step.kind)
        now = step.end
        s.complete(now)
    assert kinds[:5] == ["prefill"] * 5
    assert s.tree.total_size() == 300 + 1
    assert s.pool.num_request_tokens == 0
    assert a.first_token_time is not None
