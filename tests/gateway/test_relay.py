"""The gateway's relay: streams and whole answers through, upstream failures before and after
the first byte, disconnects, timeouts, and what never leaks from an upstream."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
import requests

from tests.gateway.conftest import (
    HTTP_TIMEOUT,
    Fake,
    gateway,
    gateway_config,
    raw_connection,
    raw_post,
)
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(120)


def chat(url: str, fake: dict[str, Any] | None = None, stream: bool = True,
         headers: dict[str, str] | None = None, **body: Any) -> requests.Response:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "max_tokens": 8, "stream": stream, **body}
    if fake is not None:
        payload["fake"] = fake
    return requests.post(url + "/v1/chat/completions", json=payload, headers=headers,
                         timeout=HTTP_TIMEOUT)


def in_background(url: str, fake: dict[str, Any], until: Callable[[], bool],
                  headers: dict[str, str] | None = None) -> threading.Thread:
    """Send a chat request from a thread and return once `until()` holds (its slot taken,
    say); join the thread to wait for its answer."""
    t = threading.Thread(target=chat, args=(url, fake), kwargs={"headers": headers})
    t.start()
    assert wait_for(until)
    return t


def events(resp: requests.Response) -> list[Any]:
    out = []
    for line in resp.text.split("\n"):
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(orjson.loads(line[6:]))
    return out


def test_a_stream_is_relayed_byte_for_byte_and_its_usage_learned(fakes2: list[Fake]) -> None:
    cfg = gateway_config([f.url for f in fakes2], debug_headers=True)
    with gateway(cfg) as g:
        r = chat(g.url, {"chunks": 5}, headers={"X-Session-ID": "s1"})
        assert r.status_code == 200
        assert r.headers["Content-Type"] == "text/event-stream"
        assert "X-Upstream-Secret" not in r.headers
        evs = events(r)
        assert [e["choices"][0]["delta"]["content"] for e in evs[:5]] == [
            f"t{i} " for i in range(5)]
        assert evs[-1]["usage"]["prompt_tokens"] == 100
        assert r.text.endswith("data: [DONE]\n\n")
        home = r.headers["x-chatfleet-replica"]
        # the gateway asked the replica for usage, and learned the session's prompt size
        fake = next(f for f in fakes2 if f.name == home)
        assert fake.bodies[-1]["stream_options"] == {"include_usage": True}
        router = g.gateway.fleet.router
        assert router is not None

        def learned() -> bool:  # the client may see the stream's end before the gateway
            entry = router.sessions.get("sid:s1", g.gateway.loop.time())
            return entry is not None and entry.replica == home and entry.prompt_tokens == 100

        assert wait_for(learned)
        # the second turn goes home, over a kept-alive upstream connection
        r2 = chat(g.url, {"chunks": 2}, headers={"X-Session-ID": "s1"})
        assert r2.headers["x-chatfleet-replica"] == home
        pool = g.gateway.fleet.replicas[home].pool
        assert pool.num_opened == 1


def test_a_whole_answer_is_relayed_with_its_length(fakes2: list[Fake]) -> None:
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        r = chat(g.url, {"chunks": 3}, stream=False)
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"] == "ok ok ok "
        assert int(r.headers["Content-Length"]) == len(r.content)


def test_many_requests_on_one_kept_alive_client_connection(fakes2: list[Fake]) -> None:
    with gateway(gateway_config([f.url for f in fakes2])) as g, requests.Session() as s:
        for i in range(20):
            r = s.post(g.url + "/v1/chat/completions", timeout=HTTP_TIMEOUT, json={
                "messages": [{"role": "user", "content": "q"}], "stream": i % 2 == 0,
                "fake": {"chunks": 2, "gap_s": 0}})
            assert r.status_code == 200, r.text
        assert sum(f.completed for f in fakes2) == 20


def test_an_upstream_error_status_is_replaced_never_relayed(fakes2: list[Fake]) -> None:
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        r = chat(g.url, {"status": 400})
        assert r.status_code == 400
        assert "SECRET" not in r.text and "X-Upstream-Secret" not in r.headers
        assert r.json()["error"]["code"] == "engine_rejected"
        # a 500 is retried once elsewhere; the other replica answers 500 too: a clean 502
        r = chat(g.url, {"status": 500})
        assert r.status_code == 502
        assert "SECRET" not in r.text
        assert g.gateway.metrics.retries == 1


def test_a_replica_down_before_the_first_byte_is_retried_on_another(
        fakes2: list[Fake]) -> None:
    # probes far apart: the requests' own failures find the dead replica
    cfg = gateway_config([fakes2[1].url, fakes2[0].url], names=["dead", "f0"],
                         debug_headers=True, health={"probe_interval_s": 1.0,
                                                     "eject_after_failures": 2,
                                                     "readmit_after_successes": 1})
    with gateway(cfg) as g:
        assert g.gateway.fleet.replicas["dead"].serving  # it passed its first probe
        fakes2[1].stop()  # then went down: nothing listens there, connections are refused
        for i in range(6):
            r = chat(g.url, {"chunks": 2}, headers={"X-Session-ID": f"s{i}"})
            assert r.status_code == 200
            assert r.headers["x-chatfleet-replica"] == "f0"
        m = g.gateway.metrics
        assert m.retries >= 1
        assert m.upstream_failures["dead"] >= 1
        # passive failures (and the probes) eject the dead replica: no more retries needed
        assert wait_for(lambda: g.gateway.fleet.replicas["dead"].health.ejected)
        before = m.retries
        chat(g.url, {"chunks": 1}, headers={"X-Session-ID": "s-after"})
        assert m.retries == before
        assert requests.get(g.url + "/ready", timeout=5).json()["ejected"] == ["dead"]


def test_a_replica_that_dies_mid_stream_ends_with_an_sse_error(fakes2: list[Fake]) -> None:
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        r = chat(g.url, {"chunks": 10, "die_after": 3})
        assert r.status_code == 200
        evs = events(r)
        assert [e["choices"][0]["delta"]["content"] for e in evs[:3]] == ["t0 ", "t1 ", "t2 "]
        assert evs[-1]["error"]["code"] == 502
        assert "data: [DONE]" not in r.text
        assert g.gateway.metrics.requests["error"] == 1
        # the slot was released
        assert wait_for(lambda: sum(g.gateway.fleet.ac.in_flight(n) for n in ("f0", "f1")) == 0)


def raw_stream(url: str, keep_chunks: int, body: dict[str, Any]) -> None:
    """Send a streaming request, read until `keep_chunks` SSE events arrived, then close."""
    with raw_connection(url, raw_post(body)) as s:
        got = b""
        while got.count(b"data: ") < keep_chunks:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk


def test_a_client_disconnect_aborts_the_upstream_request(fakes2: list[Fake]) -> None:
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        for _ in range(3):
            raw_stream(g.url, 2, {"messages": [{"role": "user", "content": "x"}],
                                  "stream": True, "fake": {"chunks": 500, "gap_s": 0.02}})
        assert wait_for(lambda: sum(f.aborted for f in fakes2) == 3, 5.0)
        assert sum(f.completed for f in fakes2) == 0
        assert wait_for(lambda: g.gateway.metrics.client_disconnects == 3)
        assert all(g.gateway.fleet.ac.in_flight(n) == 0 for n in ("f0", "f1"))


def test_a_client_that_does_not_read_is_cut_off_before_it_costs_memory(
        fakes2: list[Fake]) -> None:
    """40 chunks of 200 KB to a client that reads nothing: once more than 1 MiB of its
    answer waits in the gateway (after the kernel's buffers fill), it is cut off and the
    upstream request aborted."""
    with gateway(gateway_config([fakes2[0].url], names=["f0"])) as g:
        body = {"messages": [{"role": "user", "content": "x"}], "stream": True,
                "fake": {"chunks": 40, "gap_s": 0.001, "pad": 200_000}}
        with raw_connection(g.url, raw_post(body), timeout=None, rcvbuf=4096):
            assert wait_for(lambda: g.gateway.metrics.slow_clients == 1, 20)
        assert wait_for(lambda: fakes2[0].aborted == 1)
        assert fakes2[0].completed == 0


def test_a_client_that_leaves_while_queued_leaves_the_queue(fakes2: list[Fake]) -> None:
    cfg = gateway_config([fakes2[0].url], names=["f0"], cap=1, queue_depth=4,
                         ttft_budget_s=30)
    with gateway(cfg) as g:
        t = in_background(g.url, {"chunks": 30, "gap_s": 0.02},
                          lambda: g.gateway.fleet.ac.in_flight("f0") == 1)
        body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
        with raw_connection(g.url, raw_post(body), timeout=None):
            assert wait_for(lambda: g.gateway.fleet.ac.queue_depth() == 1)
        assert wait_for(lambda: g.gateway.fleet.ac.queue_depth() == 0)
        assert g.gateway.fleet.ac.num_cancelled == 1
        t.join(30)
        assert fakes2[0].started == 1


def test_a_stream_idle_past_its_timeout_is_cut(fakes2: list[Fake]) -> None:
    cfg = gateway_config([f.url for f in fakes2], timeouts={"idle_s": 1.0})  # the least
    with gateway(cfg) as g:
        t0 = time.monotonic()
        r = chat(g.url, {"chunks": 3, "gap_s": 4.0})
        assert time.monotonic() - t0 < 3.5
        assert events(r)[-1]["error"]["code"] == 502
        assert g.gateway.metrics.requests["timeout"] == 1


def test_a_stream_past_the_total_timeout_is_cut(fakes2: list[Fake]) -> None:
    cfg = gateway_config([f.url for f in fakes2], timeouts={"total_s": 0.6, "idle_s": 5})
    with gateway(cfg) as g:
        t0 = time.monotonic()
        r = chat(g.url, {"chunks": 40, "gap_s": 0.05})
        assert time.monotonic() - t0 < 1.9
        evs = events(r)
        assert evs[-1]["error"]["code"] == 502 and len(evs) < 40
        assert g.gateway.metrics.requests["timeout"] == 1
        assert wait_for(lambda: sum(f.aborted for f in fakes2) == 1)


def test_a_head_that_never_comes_is_a_504(fakes2: list[Fake]) -> None:
    cfg = gateway_config([fakes2[0].url], names=["f0"], timeouts={"first_byte_s": 0.3})
    with gateway(cfg) as g:
        r = chat(g.url, {"head_delay_s": 3})
        assert r.status_code == 504
        assert r.json()["error"]["code"] == "upstream_timeout"
        assert wait_for(lambda: fakes2[0].aborted == 1)


def test_models_health_ready(fakes2: list[Fake]) -> None:
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        assert requests.get(g.url + "/health", timeout=5).json() == {"status": "ok"}
        ready = requests.get(g.url + "/ready", timeout=5)
        assert ready.status_code == 200 and ready.json()["serving"] == ["f0", "f1"]
        models = requests.get(g.url + "/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["fake-model"]
        for f in fakes2:
            f.mode = "fail"
        assert wait_for(lambda: requests.get(g.url + "/ready", timeout=5).status_code == 503)
        for f in fakes2:
            f.mode = "ok"
        assert wait_for(lambda: requests.get(g.url + "/ready", timeout=5).status_code == 200)
        assert g.gateway.metrics.ejections["f0"] == 1


def test_bad_requests_get_clear_4xx(fakes2: list[Fake]) -> None:
    with gateway(gateway_config([f.url for f in fakes2], max_body_bytes=2000)) as g:
        u = g.url + "/v1/chat/completions"
        cases = [
            (requests.post(u, data=b"{", timeout=5), 400, "not valid JSON"),
            (requests.post(u, json=[1], timeout=5), 400, "JSON object"),
            (requests.post(u, json={"messages": []}, timeout=5), 400, "messages"),
            (requests.post(u, json={"messages": [{"role": "user"}], "stream": "yes"},
                           timeout=5), 400, "stream"),
            (requests.post(u, json={"messages": [{"role": "user"}], "max_tokens": -1},
                           timeout=5), 400, "max_tokens"),
            (requests.post(u, json={"messages": [{"role": "user", "content": "x" * 5000}]},
                           timeout=5), 413, "larger than 2000"),
            (requests.post(g.url + "/v1/completions", json={"prompt": 3}, timeout=5), 400,
             "prompt"),
            (requests.get(u, timeout=5), 405, ""),
            (requests.get(g.url + "/v2/nothing", timeout=5), 404, ""),
        ]
        for resp, status, text in cases:
            assert resp.status_code == status, (resp.status_code, resp.text)
            assert text in resp.json()["error"]["message"]
        # a chunked body (no Content-Length) over the limit is refused too
        def gen() -> Any:
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(100):
                yield b"x" * 100
            yield b'"}]}'
        r = requests.post(u, data=gen(), timeout=5)
        assert r.status_code == 413
        assert sum(len(f.bodies) for f in fakes2) == 0
