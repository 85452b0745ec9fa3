"""The simserver with the vLLM engine model (`--engine-model vllm`): vLLM 0.26's endpoints and
metric names, and the harness's own vLLM adapter flushing, verifying and scraping it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
import requests
from typer.testing import CliRunner

from chatfleet.bench.scrape import EngineScraper
from chatfleet.cli import app
from chatfleet.core.engine.vllm_scheduler import VLLMScheduler
from chatfleet.engines import flush_and_verify, get_adapter
from chatfleet.simserver.server import RunningServer, ServerConfig, serve_in_thread
from tests.waiting import wait_for

from .conftest import HTTP_TIMEOUT, MODEL, TIME_SCALE, l4_spec, metrics, post

pytestmark = pytest.mark.timeout(90)

VLLM_NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting",
              "vllm:kv_cache_usage_perc", "vllm:prefix_cache_queries_total",
              "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
              "vllm:generation_tokens_total", "vllm:prompt_tokens_total")


@pytest.fixture(scope="module")
def vsrv() -> Iterator[RunningServer]:
    cfg = ServerConfig(spec=l4_spec(engine_model="vllm"), time_scale=TIME_SCALE)
    with serve_in_thread(cfg) as srv:
        yield srv


@pytest.fixture(scope="module")
def vurl(vsrv: RunningServer) -> str:
    return vsrv.urls[0]


def get(url: str, path: str) -> requests.Response:
    return requests.get(url + path, timeout=HTTP_TIMEOUT)


def idle(srv: RunningServer) -> bool:
    sched = srv.replicas[0].sched
    assert isinstance(sched, VLLMScheduler)
    return not sched.has_work() and sched.in_flight is None and not srv.replicas[0].handles


def completion(url: str, prompt: list[int], max_tokens: int = 4) -> dict[str, Any]:
    r = post(url, "/v1/completions", {"model": MODEL, "prompt": prompt,
                                      "max_tokens": max_tokens, "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()


def test_it_serves_vllms_routes_and_not_sglangs(vurl: str) -> None:
    models = get(vurl, "/v1/models").json()["data"][0]
    assert models["id"] == MODEL and models["owned_by"] == "vllm"
    assert models["max_model_len"] == 40960
    assert get(vurl, "/version").json() == {"version": "0.26.0"}
    cfg = get(vurl, "/server_info?config_format=json").json()["vllm_config"]
    assert cfg["scheduler_config"]["max_num_batched_tokens"] == 2048  # vLLM's L4 default
    assert cfg["scheduler_config"]["max_num_seqs"] == 256
    assert cfg["cache_config"]["block_size"] == 16
    assert cfg["cache_config"]["gpu_memory_utilization"] == 0.9
    for path in ("/flush_cache", "/get_server_info", "/health_generate"):
        assert get(vurl, path).status_code in (404, 405), path
    names = set(metrics(vurl))
    assert set(VLLM_NAMES) <= names
    assert not any(n.startswith("sglang:") for n in names)
    paths = get(vurl, "/openapi.json").json()["paths"]
    assert "/reset_prefix_cache" in paths and "/flush_cache" not in paths


def test_cached_tokens_are_whole_blocks_and_counted_in_the_prefix_counters(
        vsrv: RunningServer, vurl: str) -> None:
    assert wait_for(lambda: idle(vsrv))
    prompt = [1000 + i for i in range(100)]  # 6 full blocks and 4 tokens
    before = metrics(vurl)
    first = completion(vurl, prompt)
    again = completion(vurl, prompt)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
    after = metrics(vurl)
    assert after["vllm:prefix_cache_queries_total"] - before[
        "vllm:prefix_cache_queries_total"] == 200
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == 96


def test_the_harness_flushes_and_verifies_it_with_its_vllm_adapter(
        vsrv: RunningServer, vurl: str) -> None:
    assert wait_for(lambda: idle(vsrv))
    prompt = [5000 + i for i in range(64)]
    completion(vurl, prompt)

    async def main() -> Any:
        async with aiohttp.ClientSession() as sess:
            return await flush_and_verify(get_adapter("vllm"), sess, vurl, MODEL)

    res, verdict = asyncio.run(main())
    assert res.ok and res.needs_verification
    assert verdict.verified is True, verdict
    assert verdict.figures["hits_delta"] == 0
    assert completion(vurl, prompt)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_the_reset_is_refused_while_a_request_holds_blocks(vsrv: RunningServer,
                                                           vurl: str) -> None:
    async def main() -> tuple[Any, Any]:
        async with aiohttp.ClientSession() as sess:
            body = {"model": MODEL, "prompt": "Tell me a very long story.", "max_tokens": 3000,
                    "min_tokens": 3000, "ignore_eos": True, "stream": True}
            async with sess.post(vurl + "/v1/completions", json=body) as resp:
                async for line in resp.content:
                    if line.startswith(b"data:"):
                        break
                raw = await (await sess.post(vurl + "/reset_prefix_cache")).json()
                busy = await get_adapter("vllm").flush(sess, vurl)
            return raw, busy

    raw, busy = asyncio.run(main())
    assert raw == {"success": False}
    assert not busy.ok and "refused" in busy.detail


def test_the_adapter_reads_its_server_info_and_the_scraper_its_metrics(
        vsrv: RunningServer, vurl: str) -> None:
    assert wait_for(lambda: idle(vsrv))

    async def one(sess: aiohttp.ClientSession, i: int) -> None:
        body = {"model": MODEL, "prompt": f"request {i}: " + "lorem ipsum " * 200,
                "max_tokens": 200, "min_tokens": 200, "ignore_eos": True, "stream": True}
        async with sess.post(vurl + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()

    async def main() -> tuple[dict[str, Any], EngineScraper]:
        async with aiohttp.ClientSession() as sess:
            info = await get_adapter("vllm").server_info(sess, vurl)
            async with EngineScraper("vllm", sess, vurl, interval_s=0.05) as sc:
                await asyncio.gather(*(one(sess, i) for i in range(6)))
                await sc.scrape_once()  # the engine as the load left it
        return info, sc

    info, sc = asyncio.run(main())
    assert info["engine"] == "vllm" and info["version"] == "0.26.0" and info["dev_mode"]
    assert info["mem_fraction"] == 0.9 and info["time_scale"] == TIME_SCALE
    assert info["flags"]["max_num_batched_tokens"] == 2048
    plan = l4_spec(engine_model="vllm").vllm_pool_plan()
    assert info["flags"]["num_gpu_blocks"] == plan.num_gpu_blocks
    recs = sc.records
    assert recs and sc.failures == 0
    assert max(r["running"] for r in recs) >= 2
    assert max(r["token_usage"] for r in recs) > 0
    assert recs[-1]["pool_tokens"] == plan.kv_pool_tokens
    assert recs[-1]["generation_tokens"] >= 6 * 200


@pytest.mark.parametrize(("args", "message"), [
    (["--engine-model", "tgi"], "--engine-model"),
    (["--max-num-batched-tokens", "512"], "--engine-model vllm"),
    (["--engine-model", "vllm", "--host-pool-tokens", "1000"], "host tier"),
    (["--engine-model", "vllm", "--max-num-batched-tokens", "0"], "at least 1"),
])
def test_bad_engine_model_flags_exit_2(args: list[str], message: str) -> None:
    res = CliRunner().invoke(app, ["simserver", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
