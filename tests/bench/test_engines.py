"""Engine adapters and the /metrics scraper: flush semantics against the simserver and a fake
vLLM, flush verification, metric names, startup-log facts, request shaping, launch commands."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import orjson
import pytest
from aiohttp import web

from chatfleet.bench.client import Clock
from chatfleet.bench.scrape import EngineScraper, engine_block_from, parse_prometheus
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.engines import (
    EngineAdapter,
    FlushResult,
    SGLangAdapter,
    VLLMAdapter,
    adapter_names,
    cached_tokens,
    flush_and_verify,
    get_adapter,
    verify_flush_counters,
    verify_flush_from_cached,
)
from chatfleet.simserver.server import RunningServer, ServerConfig, serve_in_thread
from tests.waiting import wait_for_async

pytestmark = pytest.mark.timeout(60)
MODEL = "qwen3-8b"


@pytest.fixture(scope="module")
def sim() -> Iterator[RunningServer]:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"),
                      thermal=True)
    with serve_in_thread(ServerConfig(spec=spec, time_scale=20)) as srv:
        yield srv


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def wait_flush(adapter: EngineAdapter, sess: aiohttp.ClientSession, url: str,
                     timeout_s: float = 10.0) -> FlushResult:
    """Flush once the engine has let go of every request (bounded)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while True:
        res = await adapter.flush(sess, url)
        if res.ok or loop.time() > end:
            return res
        await asyncio.sleep(0.05)


@asynccontextmanager
async def long_stream(sess: aiohttp.ClientSession, url: str,
                      tokens: int = 4000) -> AsyncIterator[aiohttp.ClientResponse]:
    """A streaming request that keeps the engine busy; yields once its first token arrived."""
    body = {"model": MODEL, "prompt": "Tell me a very long story.", "max_tokens": tokens,
            "min_tokens": tokens, "ignore_eos": True, "stream": True}
    async with sess.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data:"):
                break
        yield resp


# --- registry --------------------------------------------------------------------------------

def test_registry() -> None:
    assert adapter_names() == ["sglang", "vllm", "simserver", "openai"]
    assert get_adapter("SGLang").name == "sglang"
    assert get_adapter("transformers").name == "openai"
    with pytest.raises(ValueError, match=r"unknown engine 'tgi'.*sglang, vllm"):
        get_adapter("tgi")


# --- flush against the simserver -------------------------------------------------------------

@pytest.mark.parametrize("name", ["sglang", "simserver"])
def test_sglang_style_flush_and_its_400_while_busy(sim: RunningServer, name: str) -> None:
    url = sim.urls[0]
    adapter = get_adapter(name)

    async def main() -> tuple[FlushResult, FlushResult, FlushResult]:
        async with aiohttp.ClientSession() as sess:
            idle = await wait_flush(adapter, sess, url)
            async with long_stream(sess, url):
                busy = await adapter.flush(sess, url)
            after = await wait_flush(adapter, sess, url)
        return idle, busy, after

    idle, busy, after = run(main())
    assert idle.ok and idle.status == 200 and not idle.needs_verification
    assert "Cache flushed" in idle.detail
    assert not busy.ok and busy.status == 400
    assert "running or waiting" in busy.detail
    assert after.ok  # the aborted stream freed the engine


def test_vllm_flush_on_an_engine_without_the_dev_endpoint(sim: RunningServer) -> None:
    async def main() -> FlushResult:
        async with aiohttp.ClientSession() as sess:
            return await get_adapter("vllm").flush(sess, sim.urls[0])

    res = run(main())
    assert not res.ok and res.status == 404 and "VLLM_SERVER_DEV_MODE=1" in res.detail


def test_openai_cannot_flush() -> None:
    async def main() -> FlushResult:
        async with aiohttp.ClientSession() as sess:
            return await get_adapter("openai").flush(sess, "http://127.0.0.1:9")

    res = run(main())
    assert not res.ok and res.status is None
    assert "no cache-flush endpoint" in res.detail


def test_flush_on_an_unreachable_engine() -> None:
    async def main() -> FlushResult:
        async with aiohttp.ClientSession() as sess:
            return await get_adapter("sglang").flush(sess, "http://127.0.0.1:9")

    res = run(main())
    assert not res.ok and res.status is None and "ClientConnectorError" in res.detail


class NoopFlush(SGLangAdapter):
    """An engine whose flush answers 200 and does nothing (what vLLM's 200 may hide)."""

    name: ClassVar[str] = "noop"
    flush_path: ClassVar[str | None] = "/health"
    flush_method: ClassVar[str] = "GET"


def test_counter_verified_flush_on_the_simserver(sim: RunningServer) -> None:
    url = sim.urls[0]

    async def main() -> tuple[Any, Any]:
        async with aiohttp.ClientSession() as sess:
            await wait_flush(get_adapter("simserver"), sess, url)
            honest = await flush_and_verify(get_adapter("simserver"), sess, url)
            noop = await flush_and_verify(NoopFlush(), sess, url, MODEL)
        return honest, noop

    (res, verdict), (res2, verdict2) = run(main())
    assert res.ok and verdict.verified is True, verdict
    assert verdict.figures["hits_delta"] == 0 and verdict.figures["queries_delta"] > 100
    assert res2.ok and verdict2.verified is False, verdict2
    assert verdict2.figures["hits_delta"] > 100
    assert "did not take" in verdict2.detail


# --- the scraper against the simserver -------------------------------------------------------

def test_scraper_reads_the_simservers_engine_state(sim: RunningServer, tmp_path: Path) -> None:
    url = sim.urls[0]
    path = tmp_path / "engine.jsonl"

    async def one(sess: aiohttp.ClientSession, i: int) -> None:
        body = {"model": MODEL, "prompt": f"request {i}: " + "lorem ipsum " * 200,
                "max_tokens": 300, "min_tokens": 300, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
        async with sess.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()

    async def main() -> EngineScraper:
        clock = Clock(scale=20)
        async with aiohttp.ClientSession() as sess:
            await wait_flush(get_adapter("simserver"), sess, url)
            async with EngineScraper("simserver", sess, url, interval_s=0.05, clock=clock,
                                     path=path) as sc:
                await asyncio.gather(*(one(sess, i) for i in range(8)))
                await sc.scrape_once()  # the engine as the load left it
        return sc

    sc = run(main())
    recs = sc.records
    assert len(recs) >= 5 and sc.failures == 0
    assert {"t", "url", "running", "queue", "token_usage", "cache_hit_rate"} <= set(recs[0])
    assert max(r["running"] for r in recs) >= 2
    assert max(r["token_usage"] for r in recs) > 0
    assert all(r["queue"] is not None for r in recs)
    assert recs[-1]["pool_tokens"] == 142372
    assert recs[-1]["generation_tokens"] >= 8 * 300
    block = engine_block_from(recs)
    assert block.max_running >= 2 and block.peak_token_usage > 0
    assert block.scrapes == len(recs)
    assert engine_block_from(recs, 1e9, None).max_running is None
    rows = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    assert len(rows) == len(recs)


HISTOGRAM = "".join(
    f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="{b}"}} 7.0\n'
    for b in (0.001, 0.01, 0.1, 1.0, 10.0, "+Inf"))


def test_the_scraper_parses_only_what_the_adapter_reads(sim: RunningServer) -> None:
    """An engine's page is mostly histograms the harness never reads: only the adapter's own
    series are parsed, and they read the same as from the whole page."""

    async def page(url: str) -> str:
        async with aiohttp.ClientSession() as sess, sess.get(url + "/metrics") as resp:
            return await resp.text()

    async def vllm_page() -> str:
        async with serve_fake(FakeVLLM()) as url:
            return await page(url)

    pages = {"simserver": run(page(sim.urls[0])), "vllm": run(vllm_page()) + HISTOGRAM}
    pages["sglang"] = pages["simserver"]
    for name, text in pages.items():
        adapter = get_adapter(name)
        names = adapter.scraped_metric_names()
        whole, picked = parse_prometheus(text), parse_prometheus(text, names)
        assert adapter.read_metrics(picked) == adapter.read_metrics(whole), name
        assert set(picked.names()) <= names, name
        assert len(picked.names()) < len(whole.names())
    assert "vllm:cache_config_info" in VLLMAdapter().scraped_metric_names()


def test_vllms_own_page_reads_the_same_from_the_adapters_series() -> None:
    """/metrics as vLLM 0.26.0 served it on the H200 (idle, random-weight Qwen3-8B): 559 lines,
    nearly all histograms; the adapter reads 9 of them."""
    text = (Path(__file__).parent / "data" / "vllm-0.26.0-metrics.txt").read_text()
    adapter = VLLMAdapter()
    whole = parse_prometheus(text)
    picked = parse_prometheus(text, adapter.scraped_metric_names())
    assert adapter.read_metrics(picked) == adapter.read_metrics(whole)
    assert adapter.read_metrics(picked)["pool_tokens"] == 51099 * 16
    assert len(list(picked)) == 9 and len(list(whole)) > 300


def test_select_samples_matches_whole_names_only() -> None:
    from chatfleet.engines.prom import select_samples

    text = ("# HELP vllm:prompt_tokens Prefill tokens.\n# TYPE vllm:prompt_tokens counter\n"
            'vllm:prompt_tokens_total{model_name="a b",engine="0"} 12.0\n'
            'vllm:prompt_tokens_total_created{engine="0"} 1.7e9\n'
            "vllm:prompt_tokens_totalx 5\n  vllm:num_requests_running 3\n" + HISTOGRAM)
    picked = select_samples(text, ["vllm:prompt_tokens_total", "vllm:num_requests_running",
                                   "vllm:time_to_first_token_seconds"])
    assert picked.splitlines() == ['vllm:prompt_tokens_total{model_name="a b",engine="0"} 12.0',
                                   "  vllm:num_requests_running 3"]
    m = parse_prometheus(text, ["vllm:prompt_tokens_total"])
    assert m.value("vllm:prompt_tokens_total") == 12.0
    assert m.samples("vllm:prompt_tokens_total")[0].labels == {"model_name": "a b",
                                                                "engine": "0"}
    assert select_samples(text, []) == "" and parse_prometheus(text, []).names() == []


def test_scraper_counts_failures() -> None:
    async def main() -> EngineScraper:
        async with EngineScraper("sglang", None, ["http://127.0.0.1:9"], interval_s=0.05,
                                 timeout_s=0.5) as sc:
            assert await wait_for_async(lambda: sc.failures >= 2)
        return sc

    sc = run(main())
    assert not sc.records and sc.failures >= 2 and sc.summary().failures == sc.failures


def test_simserver_server_info(sim: RunningServer) -> None:
    async def main() -> dict[str, Any]:
        async with aiohttp.ClientSession() as sess:
            return await get_adapter("simserver").server_info(sess, sim.urls[0])

    info = run(main())
    assert info["engine"] == "chatfleet-simserver"
    assert info["max_total_num_tokens"] == 142372
    assert info["time_scale"] == 20
    assert info["flags"]["kv_cache_dtype"] == "fp8_e4m3"
    assert info["flags"]["mem_fraction_static"] == pytest.approx(0.837)
    assert info["reports_cached_tokens"] is True


# --- a fake vLLM -----------------------------------------------------------------------------

class FakeVLLM:
    """vLLM's surface as far as the adapter goes: a block prefix cache (16-token blocks, words as
    tokens), its counters in /metrics, and /reset_prefix_cache that is absent (no dev mode),
    honest, or answers 200 without resetting."""

    BLOCK = 16

    def __init__(self, mode: str = "honest", old_names: bool = False) -> None:
        self.mode = mode
        self.old_names = old_names
        self.cached: set[tuple[str, ...]] = set()
        self.queries = 0
        self.hits = 0
        self.running = 0
        self.resets = 0
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/version", self.version)
        if mode != "no_dev":
            app.router.add_post("/reset_prefix_cache", self.reset)
            app.router.add_get("/server_info", self.server_info)
        self.app = app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 16384}]})

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.11.0"})

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response({"vllm_config": {
            "model_config": {"model": "Qwen/Qwen3-8B", "max_model_len": 16384,
                             "dtype": "torch.bfloat16", "quantization": None},
            "cache_config": {"gpu_memory_utilization": 0.92, "cache_dtype": "fp8",
                             "block_size": 16, "num_gpu_blocks": 2739,
                             "enable_prefix_caching": True},
            "scheduler_config": {"max_num_seqs": 64, "max_num_batched_tokens": 2048}}})

    async def completions(self, request: web.Request) -> web.Response:
        body = await request.json()
        words = str(body["prompt"]).split()
        hit = 0
        for end in range(self.BLOCK, len(words) + 1, self.BLOCK):
            if tuple(words[:end]) not in self.cached:
                break
            hit = end
        self.queries += len(words)
        self.hits += hit
        self.running += 1
        await asyncio.sleep(0.01)
        self.running -= 1
        for end in range(self.BLOCK, len(words) + 1, self.BLOCK):
            self.cached.add(tuple(words[:end]))
        usage: dict[str, Any] = {"prompt_tokens": len(words), "completion_tokens": 1,
                                 "total_tokens": len(words) + 1,
                                 "prompt_tokens_details": {"cached_tokens": hit}}
        return web.json_response({"id": "cmpl-1", "object": "text_completion", "model": MODEL,
                                  "choices": [{"index": 0, "text": " x",
                                               "finish_reason": "length"}], "usage": usage})

    async def reset(self, request: web.Request) -> web.Response:
        self.resets += 1
        if self.mode == "honest":
            self.cached.clear()
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        lbl = 'engine="0",model_name="qwen3-8b"'
        usage = "vllm:gpu_cache_usage_perc" if self.old_names else "vllm:kv_cache_usage_perc"
        pq = "vllm:gpu_prefix_cache_queries" if self.old_names else "vllm:prefix_cache_queries"
        ph = "vllm:gpu_prefix_cache_hits" if self.old_names else "vllm:prefix_cache_hits"
        text = (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{lbl}}} {float(self.running)}\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{lbl}}} 3.0\n"
            f"# HELP {usage} KV-cache usage. 1 means 100 percent usage.\n"
            f"# TYPE {usage} gauge\n"
            f"{usage}{{{lbl}}} 0.4125\n"
            f"# HELP {pq} Prefix cache queries, in terms of number of queried tokens.\n"
            f"# TYPE {pq} counter\n"
            f"{pq}_total{{{lbl}}} {float(self.queries)}\n"
            f"# HELP {ph} Prefix cache hits, in terms of number of cached tokens.\n"
            f"# TYPE {ph} counter\n"
            f"{ph}_total{{{lbl}}} {float(self.hits)}\n"
            "# HELP vllm:num_preemptions Cumulative number of preemption from the engine.\n"
            "# TYPE vllm:num_preemptions counter\n"
            f"vllm:num_preemptions_total{{{lbl}}} 2.0\n"
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            'vllm:cache_config_info{block_size="16",cache_dtype="fp8",'
            'enable_prefix_caching="True",gpu_memory_utilization="0.92",'
            'num_gpu_blocks="2739",engine="0"} 1.0\n'
        )
        return web.Response(text=text, content_type="text/plain")


@asynccontextmanager
async def serve_fake(fake: FakeVLLM) -> AsyncIterator[str]:
    runner = web.AppRunner(fake.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(("mode", "verified"), [("honest", True), ("lying", False)])
def test_vllm_flush_needs_and_gets_verification(mode: str, verified: bool) -> None:
    fake = FakeVLLM(mode)

    async def main() -> tuple[FlushResult, Any]:
        async with serve_fake(fake) as url, aiohttp.ClientSession() as sess:
            plain = await get_adapter("vllm").flush(sess, url)
            return plain, await flush_and_verify(get_adapter("vllm"), sess, url)

    plain, (res, verdict) = run(main())
    assert plain.ok and plain.status == 200 and plain.needs_verification
    assert "does not prove" in plain.detail
    assert res.ok and res.needs_verification
    assert verdict.verified is verified, verdict
    assert verdict.method == "prefix_counters"
    assert verdict.figures["queries_delta"] == verdict.figures["probe_tokens"]
    assert (verdict.figures["hits_delta"] == 0) is verified
    assert fake.resets == 2


def test_vllm_without_dev_mode() -> None:
    async def main() -> tuple[Any, dict[str, Any]]:
        async with serve_fake(FakeVLLM("no_dev")) as url, aiohttp.ClientSession() as sess:
            return (await flush_and_verify(get_adapter("vllm"), sess, url),
                    await get_adapter("vllm").server_info(sess, url))

    (res, verdict), info = run(main())
    assert not res.ok and res.status == 404 and "VLLM_SERVER_DEV_MODE=1" in res.detail
    assert verdict.verified is False
    assert info["dev_mode"] is False and info["version"] == "0.11.0"


def test_vllm_server_info_in_dev_mode() -> None:
    async def main() -> dict[str, Any]:
        async with serve_fake(FakeVLLM()) as url, aiohttp.ClientSession() as sess:
            return await get_adapter("vllm").server_info(sess, url)

    info = run(main())
    assert info["engine"] == "vllm" and info["version"] == "0.11.0" and info["dev_mode"]
    assert info["model"] == MODEL and info["max_model_len"] == 16384
    assert info["mem_fraction"] == 0.92
    assert info["flags"]["cache_dtype"] == "fp8" and info["flags"]["max_num_seqs"] == 64


@pytest.mark.parametrize("old_names", [False, True])
def test_vllm_metrics_and_scraped_hit_rate(old_names: bool) -> None:
    fake = FakeVLLM(old_names=old_names)
    shared = " ".join(f"w{i}" for i in range(64))

    async def main() -> EngineScraper:
        async with serve_fake(fake) as url, aiohttp.ClientSession() as sess, \
                EngineScraper("vllm", sess, url, interval_s=10.0) as sc:
            assert await wait_for_async(lambda: len(sc.records) == 1)  # the first scrape
            for i in range(4):  # 64 shared words + 16 own: the 3 later ones hit 64 of 80
                body = {"model": MODEL, "prompt": f"{shared} " + f"u{i} " * 16}
                async with sess.post(url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200
            await sc.scrape_once()
        return sc

    sc = run(main())
    first, last = sc.records[0], sc.records[-1]
    assert last["running"] == 0 and last["queue"] == 3 and last["token_usage"] == 0.4125
    assert last["pool_tokens"] == 2739 * 16 and last["preemptions"] == 2
    assert first["cache_hit_rate"] is None  # nothing to compare with yet
    assert last["prefix_cache_queries"] == 4 * 80 and last["prefix_cache_hits"] == 3 * 64
    assert last["cache_hit_rate"] == pytest.approx(3 * 64 / (4 * 80))


def test_verify_flush_counters_edge_cases() -> None:
    names = VLLMAdapter.metric_names
    empty = parse_prometheus("")

    def m(q: float, h: float) -> Any:
        return parse_prometheus(f"vllm:prefix_cache_queries_total {q}\n"
                                f"vllm:prefix_cache_hits_total {h}\n")

    assert verify_flush_counters(names, empty, empty).verified is None
    assert verify_flush_counters(names, m(100, 50), m(100, 50)).verified is None  # no move
    assert verify_flush_counters(names, m(100, 50), m(10, 5)).verified is None  # restart
    assert verify_flush_counters(names, m(100, 50), m(260, 50)).verified is True
    bad = verify_flush_counters(names, m(100, 50), m(260, 194))
    assert bad.verified is False and bad.as_dict()["hits_delta"] == 144


# --- cached tokens ---------------------------------------------------------------------------

def test_cached_tokens_path() -> None:
    assert cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": 2048}}}) == 2048
    assert cached_tokens({"usage": {"prompt_tokens_details": {"cached_tokens": 0}}}) == 0
    assert cached_tokens({"usage": {"prompt_tokens": 5}}) is None  # not reported is not 0
    assert cached_tokens({"usage": {"prompt_tokens_details": None}}) is None
    assert cached_tokens({}) is None


def test_verify_flush_from_first_requests() -> None:
    ok = verify_flush_from_cached([0, 2048, 2048, 2061])
    assert ok.verified is True and ok.figures["min_cached_tokens"] == 0
    bad = verify_flush_from_cached([2048, 2048, 2061])
    assert bad.verified is False and "not flushed" in bad.detail
    unknown = verify_flush_from_cached([None, None])
    assert unknown.verified is None and "--enable-cache-report" in unknown.detail
    assert verify_flush_from_cached([None, 0]).verified is True
    assert SGLangAdapter.cache_report_flag == "--enable-cache-report"
    assert VLLMAdapter.cache_report_flag == "--enable-prompt-tokens-details"


# --- startup logs ----------------------------------------------------------------------------

SGLANG_FP8_LOG = """\
[2025-11-30 10:02:11] server_args=ServerArgs(model_path='Qwen/Qwen3-8B-FP8', \
tokenizer_path='Qwen/Qwen3-8B-FP8', tokenizer_mode='auto', skip_tokenizer_init=False, \
load_format='auto', trust_remote_code=False, context_length=None, is_embedding=False, \
host='127.0.0.1', port=30000, dtype='auto', quantization=None, quantization_param_path=None, \
kv_cache_dtype='fp8_e4m3', mem_fraction_static=0.837, max_running_requests=None, \
max_total_tokens=None, chunked_prefill_size=2048, max_prefill_tokens=16384, \
schedule_policy='fcfs', schedule_conservativeness=1.0, page_size=1, \
radix_eviction_policy='lru', enable_cache_report=True, enable_metrics=True, \
decode_log_interval=40)
[2025-11-30 10:02:14 TP0] Attention backend not set. Use flashinfer backend by default.
[2025-11-30 10:02:14 TP0] Init torch distributed begin.
[2025-11-30 10:02:15 TP0] Init torch distributed ends. mem usage=0.00 GB
[2025-11-30 10:02:15 TP0] Load weight begin. avail mem=21.93 GB
[2025-11-30 10:02:16 TP0] Detected fp8 checkpoint.
Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:07<00:00,  3.61s/it]
[2025-11-30 10:02:24 TP0] Using FP8 KV cache but no scaling factors provided. Defaulting to \
scaling factors of 1.0. This may lead to less accurate results!
[2025-11-30 10:02:24 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, \
avail mem=12.98 GB, mem usage=8.95 GB.
[2025-11-30 10:02:24 TP0] KV Cache is allocated. #tokens: 142369, K size: 4.89 GB, V size: \
4.89 GB
[2025-11-30 10:02:24 TP0] Memory pool end. avail mem=2.88 GB
[2025-11-30 10:02:25 TP0] Capture cuda graph begin. This can take up to several minutes. \
avail mem=2.80 GB
[2025-11-30 10:02:25 TP0] Capture cuda graph bs [1, 2, 4, 8, 12, 16, 24]
[2025-11-30 10:02:41 TP0] Capture cuda graph end. Time elapsed: 15.87 s. mem usage=0.31 GB. \
avail mem=2.49 GB.
[2025-11-30 10:02:42 TP0] max_total_num_tokens=142369, chunked_prefill_size=2048, \
max_prefill_tokens=16384, max_running_requests=4096, context_len=40960, \
available_gpu_mem=2.49 GB
[2025-11-30 10:02:43] INFO:     Started server process [4711]
[2025-11-30 10:02:43] INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)
[2025-11-30 10:02:44 TP0] Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, \
token usage: 0.00, #running-req: 0, #queue-req: 0,
[2025-11-30 10:02:46] The server is fired up and ready to roll!
[2025-11-30 10:03:10 TP0] Decode batch. #running-req: 16, #token: 41022, token usage: 0.29, \
cuda graph: True, gen throughput (token/s): 301.55, #queue-req: 0,
"""

SGLANG_BF16_LOG = """\
[2025-11-30 09:40:02] server_args=ServerArgs(model_path='Qwen/Qwen3-8B', \
tokenizer_path='Qwen/Qwen3-8B', dtype='auto', quantization=None, kv_cache_dtype='auto', \
mem_fraction_static=0.837, max_running_requests=24, chunked_prefill_size=2048, \
enable_cache_report=True, enable_metrics=True)
[2025-11-30 09:40:06 TP0] Load weight begin. avail mem=21.93 GB
[2025-11-30 09:40:19 TP0] Load weight end. type=Qwen3ForCausalLM, dtype=torch.bfloat16, \
avail mem=6.61 GB, mem usage=15.32 GB.
[2025-11-30 09:40:19 TP0] KV Cache is allocated. #tokens: 24094, K size: 1.65 GB, V size: \
1.65 GB
[2025-11-30 09:40:36 TP0] max_total_num_tokens=24094, chunked_prefill_size=2048, \
max_prefill_tokens=16384, max_running_requests=24, context_len=40960, \
available_gpu_mem=2.71 GB
[2025-11-30 09:40:39] The server is fired up and ready to roll!
"""

VLLM_FP8_LOG = """\
INFO 11-30 10:20:01 [__init__.py:216] Automatically detected platform cuda.
(APIServer pid=812) INFO 11-30 10:20:04 [api_server.py:1839] vLLM API server version 0.11.0
(APIServer pid=812) INFO 11-30 10:20:04 [utils.py:233] non-default args: {'model_tag': \
'Qwen/Qwen3-8B', 'host': '127.0.0.1', 'model': 'Qwen/Qwen3-8B', 'max_model_len': 16384, \
'gpu_memory_utilization': 0.92, 'kv_cache_dtype': 'fp8', 'enable_prefix_caching': True, \
'max_num_seqs': 64, 'enable_prompt_tokens_details': True}
(APIServer pid=812) INFO 11-30 10:20:12 [model.py:547] Resolved architecture: Qwen3ForCausalLM
(APIServer pid=812) INFO 11-30 10:20:12 [cache.py:180] Using fp8 data type to store kv cache. \
It reduces the GPU memory footprint and boosts the performance. Meanwhile, it may cause \
accuracy drop without a proper scaling factor.
(EngineCore_DP0 pid=901) INFO 11-30 10:20:18 [core.py:77] Initializing a V1 LLM engine \
(v0.11.0) with config: model='Qwen/Qwen3-8B', speculative_config=None, \
tokenizer='Qwen/Qwen3-8B', dtype=torch.bfloat16, max_seq_len=16384, \
tensor_parallel_size=1, quantization=None, enforce_eager=False, kv_cache_dtype=fp8, \
served_model_name=Qwen/Qwen3-8B, enable_prefix_caching=True, chunked_prefill_enabled=True
(EngineCore_DP0 pid=901) INFO 11-30 10:20:41 [default_loader.py:267] Loading weights took \
21.30 seconds
(EngineCore_DP0 pid=901) WARNING 11-30 10:20:41 [kv_cache.py:86] Checkpoint does not provide \
a q scaling factor. Setting it to k_scale. This only matters for FP8 Attention backends \
(flash-attn or flashinfer).
(EngineCore_DP0 pid=901) WARNING 11-30 10:20:41 [kv_cache.py:100] Using KV cache scaling \
factor 1.0 for fp8_e4m3. If this is unintended, verify that k/v_scale scaling factors are \
properly set in the checkpoint.
(EngineCore_DP0 pid=901) INFO 11-30 10:20:42 [gpu_model_runner.py:2653] Model loading took \
15.2683 GiB and 22.716458 seconds
(EngineCore_DP0 pid=901) INFO 11-30 10:20:55 [gpu_worker.py:298] Available KV cache memory: \
3.01 GiB
(EngineCore_DP0 pid=901) INFO 11-30 10:20:55 [kv_cache_utils.py:1087] GPU KV cache size: \
43,824 tokens
(EngineCore_DP0 pid=901) INFO 11-30 10:20:55 [kv_cache_utils.py:1091] Maximum concurrency \
for 16,384 tokens per request: 2.67x
(APIServer pid=812) INFO 11-30 10:21:20 [api_server.py:1634] Starting vLLM API server 0 on \
http://127.0.0.1:8000
"""

VLLM_DEFAULTS_LOG = """\
(APIServer pid=77) INFO 11-30 11:00:02 [api_server.py:1839] vLLM API server version 0.10.2
(APIServer pid=77) INFO 11-30 11:00:02 [utils.py:233] non-default args: {'model_tag': \
'Qwen/Qwen3-8B', 'model': 'Qwen/Qwen3-8B'}
(EngineCore_DP0 pid=90) INFO 11-30 11:00:40 [kv_cache_utils.py:1087] GPU KV cache size: \
9,856 tokens
"""


def write_log(tmp_path: Path, name: str, text: str) -> Path:
    # the samples above wrap long lines with a backslash: the log has them whole
    p = tmp_path / name
    p.write_text(re.sub(r"\\\n", "", text))
    return p


def test_sglang_log_facts(tmp_path: Path) -> None:
    fp8 = get_adapter("sglang").parse_log(write_log(tmp_path, "fp8.log", SGLANG_FP8_LOG))
    assert fp8["pool_tokens"] == 142369 and fp8["mem_fraction"] == 0.837
    assert fp8["mem_fraction_flag"] == "--mem-fraction-static"
    assert fp8["kv_cache_dtype"] == "fp8_e4m3" and fp8["quantization"] is None
    assert fp8["model_path"] == "Qwen/Qwen3-8B-FP8" and fp8["context_len"] == 40960
    assert fp8["max_running_requests"] == 4096 and fp8["chunked_prefill_size"] == 2048
    assert fp8["weights_mem_gb"] == 8.95 and fp8["ready"] is True
    assert fp8["kv_scale_fallback"] is True
    assert fp8["kv_scale_lines"] == [
        "Using FP8 KV cache but no scaling factors provided. Defaulting to scaling factors of "
        "1.0. This may lead to less accurate results!"]
    bf16 = get_adapter("sglang").parse_log(write_log(tmp_path, "bf16.log", SGLANG_BF16_LOG))
    assert bf16["pool_tokens"] == 24094 and bf16["kv_cache_dtype"] == "auto"
    assert bf16["kv_scale_fallback"] is False and bf16["kv_scale_lines"] == []
    assert bf16["max_running_requests"] == 24


def test_vllm_log_facts(tmp_path: Path) -> None:
    facts = get_adapter("vllm").parse_log(write_log(tmp_path, "vllm.log", VLLM_FP8_LOG))
    assert facts["pool_tokens"] == 43824
    assert facts["mem_fraction"] == 0.92 and facts["mem_fraction_source"] == "log"
    assert facts["mem_fraction_flag"] == "--gpu-memory-utilization"
    assert facts["version"] == "0.11.0" and facts["kv_cache_dtype"] == "fp8"
    assert facts["max_concurrency"] == 2.67 and facts["kv_cache_memory_gib"] == 3.01
    assert facts["weights_gib"] == 15.2683 and facts["max_num_seqs"] == 64
    assert facts["max_model_len"] == 16384 and facts["prefix_caching"] is True
    assert facts["kv_scale_fallback"] is True
    assert facts["kv_scale_lines"][0].startswith("Using KV cache scaling factor 1.0 for fp8_e4m3")
    assert facts["q_scale_fallback"] is True
    assert "Checkpoint does not provide a q scaling factor" in facts["q_scale_lines"][0]
    plain = get_adapter("vllm").parse_log(write_log(tmp_path, "d.log", VLLM_DEFAULTS_LOG))
    assert plain["pool_tokens"] == 9856 and plain["version"] == "0.10.2"
    assert plain["mem_fraction"] == 0.9 and plain["mem_fraction_source"] == "default"
    assert plain["kv_scale_fallback"] is False
    with pytest.raises(FileNotFoundError):
        get_adapter("vllm").parse_log(tmp_path / "missing.log")


# --- request shaping -------------------------------------------------------------------------

PAYLOAD = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 64,
           "ignore_eos": True, "min_tokens": 64, "stream": True, "temperature": 0.0,
           "chat_template_kwargs": {"enable_thinking": False},
           "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def test_openai_shape_payload_strips_engine_fields() -> None:
    oa = get_adapter("openai")
    shaped = oa.shape_payload(PAYLOAD)
    assert "ignore_eos" not in shaped and "min_tokens" not in shaped
    assert "chat_template_kwargs" not in shaped
    assert shaped["stream_options"] == {"include_usage": True}
    assert shaped["max_tokens"] == 64 and shaped["messages"] == PAYLOAD["messages"]
    assert PAYLOAD["ignore_eos"] is True  # the input is untouched
    assert sorted(oa.stripped_fields(PAYLOAD)) == [
        "chat_template_kwargs", "ignore_eos", "min_tokens",
        "stream_options.continuous_usage_stats"]
    assert not oa.accepts_ignore_eos and not oa.accepts_continuous_usage
    only = oa.shape_payload({"model": "m", "prompt": "x",
                             "stream_options": {"continuous_usage_stats": True}})
    assert "stream_options" not in only
    for name in ("sglang", "vllm", "simserver"):
        a = get_adapter(name)
        assert a.shape_payload(PAYLOAD) == PAYLOAD and a.stripped_fields(PAYLOAD) == []
        assert a.accepts_ignore_eos and a.accepts_continuous_usage


# --- launch commands -------------------------------------------------------------------------

def test_launch_commands() -> None:
    sg = get_adapter("sglang").launch_command("Qwen/Qwen3-8B-FP8", "fp8/fp8", 0.837, 16,
                                              port=30001)
    argv = sg.argv
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--model-path") + 1] == "Qwen/Qwen3-8B-FP8"
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.837"
    assert argv[argv.index("--max-running-requests") + 1] == "16"
    assert argv[argv.index("--port") + 1] == "30001"
    assert "--enable-cache-report" in argv and "--enable-metrics" in argv
    assert "--quantization" not in argv  # an FP8 checkpoint carries its own
    assert sg.env == {}

    vl = get_adapter("vllm").launch_command("Qwen/Qwen3-8B", precision("fp8", "fp8"), 0.9, 24,
                                            context_length=16384)
    v = vl.argv
    assert v[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    assert v[v.index("--quantization") + 1] == "fp8"
    assert v[v.index("--kv-cache-dtype") + 1] == "fp8"
    assert v[v.index("--gpu-memory-utilization") + 1] == "0.9"
    assert v[v.index("--max-num-seqs") + 1] == "24"
    assert v[v.index("--max-model-len") + 1] == "16384"
    assert "--enable-prompt-tokens-details" in v and "--enable-prefix-caching" in v
    assert vl.env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert vl.shell().startswith("VLLM_SERVER_DEV_MODE=1 vllm serve Qwen/Qwen3-8B")

    bf = get_adapter("sglang").launch_command("Qwen/Qwen3-8B", "bf16", None, None)
    assert "--kv-cache-dtype" not in bf.argv and "--mem-fraction-static" not in bf.argv
    sim = get_adapter("simserver").launch_command("qwen3-8b", ("fp8", "bf16"), None, 8)
    assert sim.argv[:2] == ["chatfleet", "simserver"]
    assert sim.argv[sim.argv.index("--weights") + 1] == "fp8"
    assert sim.argv[sim.argv.index("--kv-cache") + 1] == "bf16"
    tf = get_adapter("openai").launch_command("/models/qwen3-8b", "bf16/bf16")
    assert tf.argv[:3] == ["transformers", "serve", "/models/qwen3-8b"]
    assert "--continuous-batching" in tf.argv
    with pytest.raises(ValueError, match="between 0 and 1"):
        get_adapter("vllm").launch_command("m", "bf16", 1.5, None)
    with pytest.raises(ValueError, match="at least 1"):
        get_adapter("sglang").launch_command("m", "bf16", 0.8, 0)
    with pytest.raises(ValueError, match="bf16/bf16 only"):
        get_adapter("openai").launch_command("m", "fp8/fp8")
    with pytest.raises(ValueError):
        get_adapter("sglang").launch_command("m", "int4/fp8")
