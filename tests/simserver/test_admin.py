"""SGLang's admin surface: /v1/models, /health, /health_generate, /get_server_info, /metrics,
/telemetry, /openapi.json."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from chatfleet.simserver.server import RunningServer, serve_in_thread
from tests.waiting import wait_for

from .conftest import HTTP_TIMEOUT, MODEL, TIME_SCALE, chat, config, metrics, post

pytestmark = pytest.mark.timeout(60)

SGLANG_NAMES = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                "sglang:cache_hit_rate", "sglang:prompt_tokens", "sglang:generation_tokens")


def get(url: str, path: str) -> requests.Response:
    return requests.get(url + path, timeout=HTTP_TIMEOUT)


def test_models(url: str) -> None:
    r = get(url, "/v1/models")
    assert r.status_code == 200
    doc = r.json()
    assert doc["object"] == "list"
    assert [m["id"] for m in doc["data"]] == [MODEL]
    assert doc["data"][0]["max_model_len"] == 40960


def test_health_and_health_generate(url: str) -> None:
    assert get(url, "/health").status_code == 200
    before = metrics(url)["sglang:generation_tokens_total"]
    assert get(url, "/health_generate").status_code == 200
    # /health_generate really runs a one-token generation through the engine
    assert metrics(url)["sglang:generation_tokens_total"] == before + 1


def test_server_info(url: str) -> None:
    r = get(url, "/get_server_info")
    assert r.status_code == 200
    info = r.json()
    assert info["max_total_num_tokens"] == 142372  # L4, FP8 weights, FP8 KV
    assert info["time_scale"] == TIME_SCALE
    assert info["context_length"] == 40960
    assert info["kv_cache_dtype"] == "fp8_e4m3"


def test_server_info_reports_an_overridden_pool() -> None:
    with serve_in_thread(config(pool_tokens=4096)) as srv:
        assert get(srv.urls[0], "/get_server_info").json()["max_total_num_tokens"] == 4096
        assert metrics(srv.urls[0])["sglang:max_total_num_tokens"] == 4096


def test_metrics_names_and_counters(url: str) -> None:
    r = get(url, "/metrics")
    assert r.status_code == 200
    assert r.headers["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(r.text)}
    for name in SGLANG_NAMES:
        assert name in families, name
    samples = {s.name for f in families.values() for s in f.samples}
    assert {"sglang:prompt_tokens_total", "sglang:generation_tokens_total"} <= samples
    for f in families.values():
        for s in f.samples:
            assert s.labels.get("model_name") == MODEL, s

    before = metrics(url)
    body = chat(url, [{"role": "user", "content": "count me"}], max_tokens=7, ignore_eos=True)
    after = metrics(url)
    u = body["usage"]
    assert after["sglang:prompt_tokens_total"] - before["sglang:prompt_tokens_total"] == \
        u["prompt_tokens"]
    assert after["sglang:generation_tokens_total"] - before[
        "sglang:generation_tokens_total"] == u["completion_tokens"] == 7
    assert after["sglang:num_requests_total"] == before["sglang:num_requests_total"] + 1
    assert after["sglang:num_running_reqs"] == 0 and after["sglang:num_queue_reqs"] == 0
    assert 0 <= after["sglang:token_usage"] <= 1
    assert 0 <= after["sglang:cache_hit_rate"] <= 1


def test_metrics_gauges_while_a_request_runs() -> None:
    with serve_in_thread(config()) as srv:
        url = srv.urls[0]
        done = threading.Event()

        def run() -> None:
            try:
                chat(url, [{"role": "user", "content": "long one"}], max_tokens=800,
                     ignore_eos=True)
            finally:
                done.set()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        assert wait_for(lambda: metrics(url)["sglang:num_running_reqs"] == 1, 10)
        m = metrics(url)
        assert m["sglang:token_usage"] > 0 and m["sglang:num_used_tokens"] > 0
        assert done.wait(30)
        t.join(5)
        m = metrics(url)
        assert m["sglang:num_running_reqs"] == 0
        assert m["sglang:num_used_tokens"] == 0
        # (token_usage is the last decode step's reading, as SGLang's decode log reports it,
        # so it is not asserted to drop to zero here)


def test_cache_hit_rate_gauge_follows_the_prefix_cache() -> None:
    with serve_in_thread(config()) as srv:
        url = srv.urls[0]
        msgs = [{"role": "system", "content": "Shared prefix. " * 200},
                {"role": "user", "content": "q"}]
        chat(url, msgs, max_tokens=2)
        assert metrics(url)["sglang:cache_hit_rate"] == 0
        chat(url, msgs, max_tokens=2)
        assert metrics(url)["sglang:cache_hit_rate"] > 0.4
        assert post(url, "/flush_cache").status_code == 200
        assert metrics(url)["sglang:cache_hit_rate"] == 0


def test_cache_hit_rate_restarts_at_the_flush() -> None:
    with serve_in_thread(config()) as srv:
        url = srv.urls[0]
        msgs = [{"role": "system", "content": "Shared prefix. " * 200},
                {"role": "user", "content": "q"}]
        chat(url, msgs, max_tokens=2)
        chat(url, msgs, max_tokens=2)
        assert post(url, "/flush_cache").status_code == 200
        # after the flush nothing can hit: a fresh, unrelated prompt is all misses
        u = chat(url, [{"role": "user", "content": "brand new question " * 50}],
                 max_tokens=2)["usage"]
        assert u["prompt_tokens_details"]["cached_tokens"] == 0
        assert metrics(url)["sglang:cache_hit_rate"] == 0


def test_telemetry_without_thermal_model(url: str) -> None:
    r = get(url, "/telemetry")
    assert r.status_code == 200
    t = r.json()
    for key in ("sm_clock_mhz", "temp_c", "power_w", "thermal_slowdown"):
        assert key in t, key
    assert t["sm_clock_mhz"] > 0
    assert t["temp_c"] is None
    assert t["thermal_slowdown"] is False
    assert t["gpu"] == "l4"


@pytest.fixture(scope="module")
def thermal_server() -> Iterator[RunningServer]:
    with serve_in_thread(config(thermal=True)) as srv:
        yield srv


def test_telemetry_with_thermal_model(thermal_server: RunningServer) -> None:
    url = thermal_server.urls[0]
    chat(url, [{"role": "user", "content": "warm up"}], max_tokens=20, ignore_eos=True)
    t = get(url, "/telemetry").json()
    assert isinstance(t["temp_c"], int | float) and not isinstance(t["temp_c"], bool)
    assert 0 < t["temp_c"] < 120
    assert isinstance(t["power_w"], int | float) and t["power_w"] > 0
    assert isinstance(t["sm_clock_mhz"], int | float) and t["sm_clock_mhz"] > 0
    assert isinstance(t["thermal_slowdown"], bool)
    assert get(url, "/get_server_info").json()["thermal_model"] is True


def test_openapi_describes_every_route(url: str) -> None:
    doc = get(url, "/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
            "/health_generate", "/get_server_info", "/flush_cache", "/abort_request",
            "/metrics", "/telemetry"} <= set(doc["paths"])


def test_unknown_route_is_404(url: str) -> None:
    assert get(url, "/v1/nothing-here").status_code == 404
