"""What bounds a request's life in the relay: a streamed answer to an HTTP/1.0 client (it
cannot be sent chunked) must not leave its upstream request running, and a long
non-streaming answer is bounded by the total timeout, not the first-byte one, and is never
the replica's failure."""

from __future__ import annotations

import concurrent.futures
import socket
import time

import orjson
import pytest

from tests.gateway.conftest import Fake, gateway, gateway_config
from tests.gateway.test_relay import chat
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(120)


def http10_stream(url: str, chunks: int) -> bytes:
    """A streamed chat request over HTTP/1.0 (no chunked transfer there); the whole answer."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                         "max_tokens": 8, "stream": True,
                         "fake": {"chunks": chunks, "gap_s": 0.02}})
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nContent-Type: "
                  b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while part := s.recv(65536):
            got += part
    return got


def test_http10_streaming_requests_do_not_escape_the_cap(fakes2: list[Fake]) -> None:
    """12 streamed HTTP/1.0 requests at a cap of 4 per replica: each gets a clear 4xx, and no
    replica ever runs more than its cap (before: a 500, the slot freed, and the upstream
    request still generating, 12 at once on a replica of cap 4)."""
    cfg = gateway_config([f.url for f in fakes2], cap=4, queue_depth=32, ttft_budget_s=5.0)
    with gateway(cfg) as g:
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda _: http10_stream(g.url, 200), range(12)))
        for a in answers:
            status = a.split(b"\r\n", 1)[0]
            assert b" 400 " in status, a[:300]
            assert b"HTTP/1.1" in a  # the error says what to do
        assert wait_for(lambda: all(f.in_flight == 0 for f in fakes2), 5)
        assert max(f.max_in_flight for f in fakes2) <= 4
        assert all(g.gateway.fleet.ac.in_flight(f.name) == 0 for f in fakes2)
        assert g.gateway.metrics.requests["rejected"] == 12
        # a streamed request over HTTP/1.1 still streams
        assert chat(g.url, {"chunks": 3}).text.endswith("data: [DONE]\n\n")


def test_a_long_whole_answer_is_bounded_by_the_total_timeout_not_the_first_byte(
        fakes2: list[Fake]) -> None:
    """A non-streaming answer's head comes only when the whole answer is done: 1 s of
    generation is no failure with first_byte_s 0.3 s (before: 504, and counted against the
    replica, which 2 of them ejected); past total_s it is a 504 for the request, and still
    not the replica's failure."""
    cfg = gateway_config([f.url for f in fakes2], cap=4,
                         timeouts={"first_byte_s": 0.3, "total_s": 2.0},
                         health={"probe_interval_s": 0.2, "eject_after_failures": 2,
                                 "readmit_after_successes": 1})
    with gateway(cfg) as g:
        for _ in range(3):
            r = chat(g.url, {"chunks": 10, "gap_s": 0.1}, stream=False)
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 10
        t0 = time.monotonic()
        late = [chat(g.url, {"chunks": 30, "gap_s": 0.1}, stream=False) for _ in range(2)]
        waited = (time.monotonic() - t0) / 2
        for r in late:
            assert r.status_code == 504 and r.json()["error"]["code"] == "upstream_timeout"
            assert "2 s" in r.json()["error"]["message"]
        assert 1.5 < waited < 3.0
        m = g.gateway.metrics
        assert sum(m.upstream_failures.values()) == 0 and sum(m.ejections.values()) == 0
        assert all(rep.serving for rep in g.gateway.fleet.replicas.values())
        assert m.requests["timeout"] == 2 and m.requests["ok"] == 3
        # the engine's request was dropped with it
        assert wait_for(lambda: all(f.in_flight == 0 for f in fakes2), 5)
        # a stream whose head does not come within first_byte_s is still a 504 at once
        t0 = time.monotonic()
        r = chat(g.url, {"chunks": 1, "head_delay_s": 2.0})
        assert r.status_code == 504 and time.monotonic() - t0 < 1.5
