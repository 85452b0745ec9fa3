"""A client that goes away frees its KV at once; /abort_request ends a stream with "abort"."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import requests

from chatfleet.simserver.server import RunningServer, serve_in_thread
from tests.waiting import wait_for

from .conftest import (
    HTTP_TIMEOUT,
    MODEL,
    config,
    engine_is_idle,
    metrics,
    post,
    raw_stream_request,
    sse_events,
)

pytestmark = pytest.mark.timeout(60)

LONG = {"max_tokens": 20_000, "ignore_eos": True}  # minutes of decoding at time scale 20


@pytest.fixture
def fresh() -> Iterator[RunningServer]:
    with serve_in_thread(config()) as srv:
        yield srv


def read_data_chunks(sock: socket.socket, n: int) -> bytes:
    """Read from the socket until `n` SSE data events have arrived."""
    buf = b""
    while buf.count(b"data: ") < n:
        part = sock.recv(65536)
        assert part, f"connection closed early: {buf[-500:]!r}"
        buf += part
    return buf


def assert_released(srv: RunningServer) -> None:
    url = srv.urls[0]
    sched = srv.replicas[0].sched
    assert wait_for(lambda: engine_is_idle(srv), 5), (
        len(sched.running), len(sched.waiting), sched.pool.num_request_tokens,
        sched.tree.protected_size())
    assert wait_for(lambda: metrics(url)["sglang:num_running_reqs"] == 0, 5)
    m = metrics(url)
    assert m["sglang:num_used_tokens"] == 0
    assert m["sglang:num_queue_reqs"] == 0
    assert m["sglang:num_aborted_requests_total"] >= 1
    assert m["sglang:num_requests_total"] == 0  # the aborted request never finished
    # and the engine works on: a new request is served in full
    r = post(url, "/v1/completions", {"prompt": "again", "max_tokens": 5, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 5


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_disconnect_mid_stream_frees_the_request(fresh: RunningServer, path: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "stream": True, **LONG}
    if path == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "Talk for a long time."}]
    else:
        body["prompt"] = "Talk for a long time."
    sock = raw_stream_request(fresh.urls[0], path, body)
    head = read_data_chunks(sock, 3)
    assert head.startswith(b"HTTP/1.1 200")
    assert len(fresh.replicas[0].sched.running) == 1
    assert metrics(fresh.urls[0])["sglang:num_used_tokens"] > 0
    sock.close()
    assert_released(fresh)


def test_disconnect_of_a_non_streamed_request(fresh: RunningServer) -> None:
    body = {"model": MODEL, "prompt": "Talk for a long time.", **LONG}
    sock = raw_stream_request(fresh.urls[0], "/v1/completions", body)
    sched = fresh.replicas[0].sched
    assert wait_for(lambda: len(sched.running) == 1, 10)
    assert wait_for(lambda: sched.num_steps > 3, 10)
    sock.close()
    assert_released(fresh)


def test_disconnect_during_a_chunked_prefill(fresh: RunningServer) -> None:
    """A 30,000-token prompt takes many 2,048-token prefill chunks; leaving before the first
    token frees the partly prefilled request too."""
    body = {"model": MODEL, "prompt": list(range(1000, 31000)), "stream": True,
            "max_tokens": 9000, "ignore_eos": True}
    sock = raw_stream_request(fresh.urls[0], "/v1/completions", body)
    sched = fresh.replicas[0].sched
    assert wait_for(lambda: sched.chunked is not None, 10)
    sock.close()
    assert_released(fresh)


def test_openai_stream_close_aborts(fresh: RunningServer) -> None:
    client = openai.OpenAI(base_url=fresh.urls[0] + "/v1", api_key="unused", max_retries=0,
                           timeout=HTTP_TIMEOUT)
    try:
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Go on and on."}], stream=True,
            max_tokens=20_000, extra_body={"ignore_eos": True})
        it = iter(stream)
        for _ in range(3):
            next(it)
        assert len(fresh.replicas[0].sched.running) == 1
        stream.close()
        assert_released(fresh)
    finally:
        client.close()


def test_abort_request_by_rid_ends_the_stream_with_abort(fresh: RunningServer) -> None:
    url = fresh.urls[0]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Long answer please."}],
            "stream": True, "rid": "client-rid-42",
            "stream_options": {"include_usage": True}, **LONG}
    events: list[Any] = []
    with requests.post(url + "/v1/chat/completions", json=body, stream=True,
                       timeout=HTTP_TIMEOUT) as resp:
        assert resp.status_code == 200
        gen = sse_events(resp)
        for _ in range(3):
            events.append(next(gen))
        assert all(e["id"] == "client-rid-42" for e in events)
        r = post(url, "/abort_request", {"rid": "client-rid-42"})
        assert r.status_code == 200
        assert r.json() == {"rid": "client-rid-42", "aborted": True}
        events.extend(gen)  # the stream must end by itself now
    assert events[-1] == "[DONE]"
    reasons = [e["choices"][0]["finish_reason"] for e in events[:-1] if e["choices"]]
    assert reasons[-1] == "abort"
    assert all(x is None for x in reasons[:-1])
    usage = events[-2]["usage"]
    assert events[-2]["choices"] == []
    tokens = len(reasons) - 1
    assert 3 <= tokens < 20_000
    assert usage["completion_tokens"] == tokens
    assert_released(fresh)
    # a second abort of the same id finds nothing
    assert post(url, "/abort_request", {"rid": "client-rid-42"}).json()["aborted"] is False


def test_abort_request_of_a_non_streamed_request(fresh: RunningServer) -> None:
    url = fresh.urls[0]
    out: dict[str, Any] = {}

    def run() -> None:
        out["r"] = post(url, "/v1/completions", {"model": MODEL, "prompt": "x", "rid": "ns-1",
                                                 **LONG})

    t = threading.Thread(target=run, daemon=True)
    t.start()
    sched = fresh.replicas[0].sched
    assert wait_for(lambda: len(sched.running) == 1 and sched.num_steps > 3, 10)
    assert post(url, "/abort_request", {"rid": "ns-1"}).json()["aborted"] is True
    t.join(HTTP_TIMEOUT)
    assert not t.is_alive()
    r = out["r"]
    assert r.status_code == 200
    doc = r.json()
    assert doc["choices"][0]["finish_reason"] == "abort"
    n = doc["usage"]["completion_tokens"]
    assert 0 < n < 20_000
    assert len(doc["choices"][0]["text"].split()) == n
    assert_released(fresh)


def test_abort_of_a_waiting_request() -> None:
    """Abort works for a request still in the queue (a 4,096-token pool holds one at a time)."""
    with serve_in_thread(config(pool_tokens=4096)) as srv:
        url = srv.urls[0]
        sched = srv.replicas[0].sched
        first = raw_stream_request(url, "/v1/completions", {
            "prompt": "a", "stream": True, "max_tokens": 3000, "ignore_eos": True, "rid": "run"})
        read_data_chunks(first, 1)
        second = raw_stream_request(url, "/v1/completions", {
            "prompt": "b", "stream": True, "max_tokens": 3000, "ignore_eos": True, "rid": "wait"})
        assert wait_for(lambda: len(sched.waiting) == 1, 10)
        assert post(url, "/abort_request", {"rid": "wait"}).json()["aborted"] is True
        assert not sched.waiting
        data = b""
        while not data.endswith(b"data: [DONE]\n\n"):
            part = second.recv(65536)
            if not part:
                break
            data += part
        second.close()
        events = [json.loads(line[6:]) for line in data.split(b"\n")
                  if line.startswith(b"data: {")]
        assert [e["choices"][0]["finish_reason"] for e in events] == ["abort"]
        first.close()
        assert_released(srv)
