"""The host tier (HiCache) by SGLang's rules: when a node is written to host under each write
policy, what the host keeps and drops, when a prefix is loaded back and what the load-back and
a write-back cost the step, and how the host pool is sized from --hicache-ratio/--hicache-size.
"""

from __future__ import annotations

import json
from array import array

import pytest
from typer.testing import CliRunner

from chatfleet.cli.app import app
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.engine.host_tier import HiRadixCache, HostTierConfig
from chatfleet.core.engine.request import EngineRequest
from chatfleet.core.engine.scheduler import Scheduler, SchedulerConfig
from chatfleet.core.engine.step import Step
from chatfleet.core.engine.step_time import StepConstants, StepTimeModel
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.memory import hicache_host_tokens
from chatfleet.core.specs import SpecError, builtin_model, get_gpu, precision

QWEN = builtin_model("qwen3-8b")
CONST = StepConstants(bandwidth_eff=0.7, gemm_eff=0.5, attn_eff=0.5, decode_fixed_s=0.001,
                      prefill_fixed_s=0.01, eager_s=0.004, cuda_graph_max_bs=24,
                      chunked_prefill_size=512, host_io_eff=0.8)
STEP = StepTimeModel(QWEN, get_gpu("l4"), precision("bf16", "bf16"), CONST)


def tree(write: str, host: int = 40, policy: str = "lru") -> HiRadixCache:
    return HiRadixCache(policy, HostTierConfig(host, write))


def prompt(i: int, n: int = 10) -> list[int]:
    return [1000 * i + j for j in range(n)]


def matchable(cache: HiRadixCache, n: int, now: float) -> list[int]:
    """The prompts of `n` whose whole 10 tokens are still found, on device or host."""
    out = []
    for i in range(n):
        m = cache.match_prefix(prompt(i), now)
        if m.device_len + m.host_len == 10:
            out.append(i)
    return out


# ----- when a node is written, and what the host holds -----


def run_through(cache: HiRadixCache, n: int, device: int) -> None:
    """`n` distinct 10-token prompts one after another on a device of `device` tokens: each
    evicts what the device cannot keep."""
    for i in range(n):
        cache.insert(prompt(i), now=float(i))
        short = cache.total_size() - device
        if short > 0:
            cache.evict(short, now=float(i))


def test_write_through_copies_at_insert_and_the_host_holds_the_device_too() -> None:
    cache = tree("write_through", host=40)
    cache.insert(prompt(0), now=0.0)
    assert cache.host_size() == 10  # written at its first (complete) insert
    run_through(cache, 6, device=20)
    # the host's 40 tokens hold the 2 prompts on the device as well: 4 prompts in all
    assert matchable(cache, 6, now=10.0) == [2, 3, 4, 5]
    assert cache.take_write_back_tokens() == 0  # nothing for the scheduler to wait for


def test_write_back_copies_at_eviction_and_the_host_adds_to_the_device() -> None:
    cache = tree("write_back", host=40)
    cache.insert(prompt(0), now=0.0)
    assert cache.host_size() == 0  # nothing written at insert
    run_through(cache, 6, device=20)
    # device 2 prompts + host 4 evicted ones: every prompt is still there
    assert matchable(cache, 6, now=10.0) == [0, 1, 2, 3, 4, 5]
    assert cache.num_written_back_tokens == 40
    assert cache.take_write_back_tokens() == 40  # the scheduler waits for these copies
    assert cache.take_write_back_tokens() == 0


def test_write_through_selective_writes_only_what_is_hit_twice() -> None:
    cache = tree("write_through_selective", host=100)
    cache.insert(prompt(0), now=0.0)
    cache.insert(prompt(1), now=1.0)
    assert cache.host_size() == 0
    cache.insert(prompt(0), now=2.0)  # its second hit
    assert cache.host_size() == 10
    cache.evict(20, now=3.0)
    assert matchable(cache, 2, now=4.0) == [0]  # prompt 1 had no copy: dropped


def test_a_chunk_is_no_hit_and_so_no_copy() -> None:
    cache = tree("write_through", host=100)
    cache.insert(prompt(0), now=0.0, chunked=True)
    assert cache.host_size() == 0
    cache.insert(prompt(0), now=1.0)  # the request's complete insert
    assert cache.host_size() == 10


def test_write_back_counts_no_hits_so_lfu_orders_by_access_alone() -> None:
    back, through = tree("write_back", policy="lfu"), tree("write_through", policy="lfu")
    for cache in (back, through):
        for t in range(3):
            cache.insert(prompt(0), now=float(t))  # hit three times, used last at 2.0
        cache.insert(prompt(1), now=5.0)  # hit once, used last
    first = prompt(0)[0]  # the node of prompt 0, read without touching it
    assert [back.root.children[first].hit_count, through.root.children[first].hit_count] == [0, 3]
    back.evict(1, now=7.0)
    through.evict(1, now=7.0)
    # write-back: all counts 0, the least recently used goes (prompt 0); write-through: the
    # least hit (prompt 1)
    assert back.match_prefix(prompt(0), 8.0).device_len == 0
    assert through.match_prefix(prompt(1), 8.0).device_len == 0


def test_host_eviction_follows_the_eviction_policy() -> None:
    """SGLang's evict_host heaps host-only leaves by the same strategy as the device: under
    fifo the oldest copy goes even if it was just used."""
    cache = tree("write_through", host=20, policy="fifo")
    cache.insert(prompt(0), now=0.0)
    cache.insert(prompt(1), now=1.0)
    cache.evict(20, now=2.0)  # both host-only
    cache.match_prefix(prompt(0), now=3.0)  # used again: fifo does not care
    cache.insert(prompt(2), now=4.0)  # needs 10 of host
    assert matchable(cache, 3, now=5.0) == [1, 2]


# ----- the scheduler: load-back at admission, and what copies cost a step -----


def sched(write: str = "write_through", pool: int = 1000, host: int = 4000) -> Scheduler:
    cfg = SchedulerConfig(pool_tokens=pool, chunked_prefill_size=512, host_pool_tokens=host,
                          hicache_write_policy=write)
    return Scheduler(cfg, STEP)


def req(rid: str, tokens: list[int], out: int = 2) -> EngineRequest:
    return EngineRequest(rid, array("q", tokens), array("q", range(10**9, 10**9 + out)), out)


def run(s: Scheduler, r: EngineRequest, now: float) -> tuple[float, list[Step]]:
    """Serve `r` alone to its end; the time and the steps it took."""
    s.add_request(r, now)
    steps = []
    while s.has_work():
        step = s.schedule(now)
        assert step is not None
        steps.append(step)
        now = step.end
        s.complete(now)
    return now, steps


def evicted_host_prefix(shared: int) -> tuple[Scheduler, float]:
    """A scheduler whose first request's prompt now lives on host only, after a second
    request needed the whole device pool."""
    s = sched(pool=1000)
    now, _ = run(s, req("a", prompt(1, 600)), 0.0)
    now, _ = run(s, req("b", prompt(2, 900)), now)  # evicts a's 601 tokens (kept on host)
    m = s.tree.match_prefix(prompt(1, shared), now)
    assert (m.device_len, m.host_len) == (0, shared)
    return s, now


def test_a_host_prefix_of_ten_tokens_is_loaded_back_at_admission_and_of_nine_recomputed() -> None:
    s, now = evicted_host_prefix(10)
    c = req("c", [*prompt(1, 10), *prompt(3, 50)])
    run(s, c, now)
    assert (c.num_loaded_back_tokens, c.num_cached_tokens) == (10, 10)
    s, now = evicted_host_prefix(9)
    d = req("d", [*prompt(1, 9), *prompt(3, 50)])
    run(s, d, now)
    assert (d.num_loaded_back_tokens, d.num_cached_tokens) == (0, 0)


def test_the_load_back_costs_its_copy_beside_the_prefill() -> None:
    s, now = evicted_host_prefix(600)
    c = req("c", [*prompt(1, 600), *prompt(3, 50)])
    _, steps = run(s, c, now)
    assert c.num_loaded_back_tokens == 600
    loaded = steps[0]
    assert loaded.kind == "prefill"
    # the step is the prefill of c's 50 new tokens after 600 cached ones, with the copy of
    # the 600 beside it: StepTimeModel.prefill_s with load_back_tokens=600
    plain = STEP.prefill_s(50, 50 * 600 + 50 * 51 / 2, 600, 1)
    assert loaded.duration == pytest.approx(
        STEP.prefill_s(50, 50 * 600 + 50 * 51 / 2, 600, 1, load_back_tokens=600))
    assert plain < loaded.duration < plain + STEP.host_transfer_s(600)


def test_write_back_makes_the_step_that_evicts_wait_for_the_copy() -> None:
    durations = {}
    for write in ("write_through", "write_back"):
        s = sched(write, pool=1000)
        now, _ = run(s, req("a", prompt(1, 600)), 0.0)
        _, steps = run(s, req("b", prompt(2, 900)), now)  # its admission evicts a's 601
        durations[write] = steps[0].duration
        assert s.tree.num_evicted_tokens == 601
    assert durations["write_back"] - durations["write_through"] == pytest.approx(
        STEP.host_transfer_s(601), rel=1e-9)


# ----- the host pool: SGLang's sizing and its rule -----


def test_the_host_pool_is_the_ratio_times_the_device_pool_or_the_size_in_gb() -> None:
    kv = QWEN.kv_bytes_per_token("bf16")  # 147,456 bytes
    assert hicache_host_tokens(24_093, kv) == 48_186  # --hicache-ratio 2, SGLang's default
    assert hicache_host_tokens(24_093, kv, hicache_ratio=3.5) == 84_325
    assert hicache_host_tokens(24_093, kv, hicache_size_gb=10) == 10 * 10**9 // kv == 67_816
    # the size wins over the ratio, as in SGLang
    assert hicache_host_tokens(24_093, kv, hicache_ratio=3.5, hicache_size_gb=10) == 67_816
    with pytest.raises(SpecError, match="larger than the device memory"):
        hicache_host_tokens(24_093, kv, hicache_ratio=1.0)
    with pytest.raises(SpecError, match="larger than the device memory"):
        hicache_host_tokens(24_093, kv, hicache_size_gb=3)  # 20,345 tokens


def test_an_engine_refuses_a_host_tier_sglang_would_refuse() -> None:
    spec = EngineSpec(get_gpu("l4"), QWEN, precision("bf16", "bf16"))
    pool = spec.kv_pool_tokens()
    with pytest.raises(ChatfleetError, match="must be larger than the KV pool"):
        EngineSpec(spec.gpu, QWEN, spec.precision, host_pool_tokens=pool)
    with pytest.raises(ChatfleetError, match="write policy"):
        EngineSpec(spec.gpu, QWEN, spec.precision, host_pool_tokens=pool + 1,
                   hicache_write_policy="write_around")
    with pytest.raises(ChatfleetError, match="no host tier"):
        EngineSpec(spec.gpu, QWEN, spec.precision, engine_model="vllm",
                   hicache_write_policy="write_back")
    with pytest.raises(ChatfleetError, match="must be larger than the KV pool"):
        SchedulerConfig(pool_tokens=1000, host_pool_tokens=1000)
    on = EngineSpec(spec.gpu, QWEN, spec.precision, host_pool_tokens=pool + 1,
                    hicache_write_policy="write_back").to_json()
    assert (on["host_pool_tokens"], on["hicache_write_policy"]) == (pool + 1, "write_back")
    assert "hicache_write_policy" not in spec.to_json()  # off: the document keeps its keys


def serve(s: Scheduler, r: EngineRequest, now: float, horizon: float | None) -> list[float]:
    """`r` alone to its end, decode runs allowed when a horizon is given; its token times."""
    s.add_request(r, now)
    while s.has_work():
        step = s.schedule(now, horizon)
        assert step is not None
        now = step.end
        s.complete(now)
    return list(s.token_times(r))


def test_under_write_back_a_decode_run_stops_where_an_eviction_would_make_it_wait() -> None:
    """A request decodes past the free pool into a finished request's cached tokens: each step
    that evicts waits for its copy to host. A decode run (the twin's) must give the times
    single steps give, so it takes no step that evicts."""
    times = []
    for horizon in (None, float("inf")):
        s = sched("write_back", pool=300, host=1200)
        now, _ = run(s, req("a", prompt(1, 150)), 0.0)  # leaves 151 cached tokens
        times.append(serve(s, req("b", prompt(2, 50), out=200), now, horizon))
        assert s.tree.num_written_back_tokens > 0
    assert times[1] == pytest.approx(times[0], abs=1e-9)


# ----- the flags -----


def test_twin_sweep_sizes_the_host_tier_from_sglangs_flags() -> None:
    runner = CliRunner()
    base = ["twin", "sweep", "--concurrency", "2", "--duration", "5", "--warmup", "1"]
    res = runner.invoke(app, [*base, "--hicache-ratio", "2", "--hicache-write-policy",
                              "write_back", "--print-json"])
    assert res.exit_code == 0, res.output
    target = json.loads(res.stdout)["target"]
    assert (target["host_pool_tokens"], target["hicache_write_policy"]) == (48_186, "write_back")
    res = runner.invoke(app, [*base, "--hicache-size", "10", "--print-json"])
    assert json.loads(res.stdout)["target"]["host_pool_tokens"] == 67_816
    for flags, message in ((["--hicache-ratio", "1"], "not larger than the KV pool"),
                           (["--host-pool-tokens", "24093"], "must be larger than the KV pool"),
                           (["--host-pool-tokens", "50000", "--hicache-ratio", "3"],
                            "give the host tier's size once"),
                           (["--hicache-write-policy", "write_around"], "unknown HiCache"),
                           (["--engine-model", "vllm", "--hicache-ratio", "2"], "no host tier")):
        res = runner.invoke(app, [*base, *flags])
        assert res.exit_code == 2 and message in res.output, (flags, res.output)
