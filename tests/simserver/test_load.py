"""Wall-clock pacing, concurrency, KV pressure (retraction) and several replicas."""

from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from chatfleet.simserver.server import serve_in_thread
from tests.waiting import wait_for

from .conftest import HTTP_TIMEOUT, MODEL, TIME_SCALE, config, engine_is_idle, metrics, post
from .conftest import sse_events as events_of

pytestmark = pytest.mark.timeout(60)

# the L4 FP8 calibration point at concurrency 1 (512 in, 128 out): 24.53 tok/s, TTFT 140.72 ms
FP8_TPOT_S = 1 / 24.53
FP8_TTFT_S = 0.14072


def stream_completion(url: str, body: dict[str, Any]) -> tuple[list[float], list[Any]]:
    """Arrival times (s, wall, from the send) of every token chunk, and all events."""
    t0 = time.monotonic()
    times: list[float] = []
    events: list[Any] = []
    with requests.post(url + "/v1/completions", json={"model": MODEL, "stream": True, **body},
                       stream=True, timeout=HTTP_TIMEOUT) as resp:
        assert resp.status_code == 200, resp.text
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        for ev in events_of(resp):
            events.append(ev)
            if isinstance(ev, dict) and ev["choices"] and ev["choices"][0]["finish_reason"] is None:
                times.append(time.monotonic() - t0)
    return times, events


def test_tokens_are_paced_in_scaled_wall_clock_time(url: str) -> None:
    before = metrics(url)
    times, _ = stream_completion(url, {"prompt": list(range(2000, 2512)), "max_tokens": 128,
                                       "ignore_eos": True})
    assert len(times) == 128
    tpot_model = (times[-1] - times[0]) / 127 * TIME_SCALE
    # tokens never come before their modelled time; a busy test machine may make them late
    assert 0.9 * FP8_TPOT_S <= tpot_model <= 1.6 * FP8_TPOT_S, tpot_model
    after = metrics(url)

    def delta(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert delta("sglang:time_per_output_token_seconds_count") == 1
    tpot_metric = delta("sglang:time_per_output_token_seconds_sum")
    assert tpot_metric == pytest.approx(FP8_TPOT_S, rel=0.1)  # model seconds, not wall
    ttft_metric = delta("sglang:time_to_first_token_seconds_sum")
    assert ttft_metric == pytest.approx(FP8_TTFT_S, rel=0.25)


def test_concurrent_streams_all_complete(url: str) -> None:
    before = metrics(url)["sglang:generation_tokens_total"]

    def one(i: int) -> int:
        times, events = stream_completion(url, {"prompt": f"user {i} asks", "max_tokens": 40,
                                                "ignore_eos": True})
        assert events[-1] == "[DONE]"
        return len(times)

    with ThreadPoolExecutor(24) as ex:
        counts = list(ex.map(one, range(24)))
    assert counts == [40] * 24
    assert metrics(url)["sglang:generation_tokens_total"] - before == 24 * 40


def test_kv_pressure_retracts_and_still_delivers_every_token() -> None:
    """A 3,000-token pool and eight 1,000-token answers: the scheduler must retract requests
    (and prefill them again); every stream still gets exactly its max_tokens tokens."""
    with serve_in_thread(config(pool_tokens=3000, time_scale=50)) as srv:
        url = srv.urls[0]

        def one(i: int) -> tuple[int, int]:
            times, events = stream_completion(url, {
                "prompt": f"request {i}", "max_tokens": 1000, "ignore_eos": True,
                "stream_options": {"include_usage": True}})
            return len(times), events[-2]["usage"]["completion_tokens"]

        with ThreadPoolExecutor(8) as ex:
            res = list(ex.map(one, range(8)))
        assert res == [(1000, 1000)] * 8
        m = metrics(url)
        assert m["sglang:num_retracted_requests_total"] > 0
        assert m["sglang:num_requests_total"] == 8
        assert engine_is_idle(srv)


def test_replicas_are_independent() -> None:
    with serve_in_thread(config(replicas=2)) as srv:
        assert len(srv.urls) == len(srv.replicas) == 2
        assert srv.urls[0] != srv.urls[1]
        msgs = {"prompt": "A shared prefix that is long enough to matter. " * 30,
                "max_tokens": 2}
        a = post(srv.urls[0], "/v1/completions", msgs).json()
        b = post(srv.urls[0], "/v1/completions", msgs).json()
        c = post(srv.urls[1], "/v1/completions", msgs).json()
        assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert b["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        # the other replica has its own cache
        assert c["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert metrics(srv.urls[1])["sglang:num_requests_total"] == 1
        assert metrics(srv.urls[0])["sglang:num_requests_total"] == 2


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_4_mib_prompt_does_not_stall_the_other_streams(url: str, path: str) -> None:
    """Tokenizing 4 MiB of text takes seconds (3.5 s here). On the event loop it froze every
    other stream for as long (gateways ejected the replica); off it, a concurrent stream's
    gaps stay small."""
    import threading

    got: dict[str, Any] = {}

    def stream() -> None:
        got["times"], _ = stream_completion(url, {"prompt": list(range(2000, 2100)),
                                                  "max_tokens": 1500, "ignore_eos": True})

    t = threading.Thread(target=stream)
    t.start()
    assert wait_for(lambda: metrics(url)["sglang:num_running_reqs"] >= 1)  # the stream runs
    big = "hello world " * (4 * 1024 * 1024 // 12)
    body: dict[str, Any] = ({"prompt": big} if path == "/v1/completions" else
                            {"messages": [{"role": "user", "content": big}]})
    t0 = time.monotonic()
    r = post(url, path, {"model": MODEL, "max_tokens": 4, **body}, timeout=60)
    took = time.monotonic() - t0
    t.join(60)
    assert r.status_code == 400 and "exceeds the context length" in r.text  # tokenized: 699k
    times = got["times"]
    assert len(times) == 1500  # the stream was not cut
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert took > 1.0, took  # the tokenizing did take long, while the stream ran
    assert max(gaps) < 0.5, (max(gaps), took)
