"""Client connections are bounded (issue 14): idle and slow-header connections are closed after
their timeouts, a connection limit keeps idle sockets from taking every descriptor, and
/health answers under a low descriptor limit."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import requests

from tests.gateway.conftest import Fake, gateway, gateway_config, raw_post
from tests.processes import stop
from tests.simserver.test_cli_simserver import read_urls
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.setblocking(False)
    return s


def is_open(s: socket.socket) -> bool:
    """Nothing to read and not closed by the other side."""
    try:
        return s.recv(1 << 16) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def health(url: str) -> int | None:
    try:
        return requests.get(url + "/health", timeout=5).status_code
    except requests.RequestException:
        return None


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for s in opened:
        s.close()


def test_idle_and_slow_header_connections_are_closed_after_their_timeouts(
        fakes2: list[Fake], sockets: list[socket.socket]) -> None:
    cfg = gateway_config([f.url for f in fakes2],
                         timeouts={"client_idle_s": 1.5, "client_header_s": 0.5})
    with gateway(cfg) as g:
        idle = [connect(g.url) for _ in range(30)]
        slow = [connect(g.url) for _ in range(10)]
        sockets.extend(idle + slow)
        for s in slow:
            s.send(HEAD)
        # a stream longer than both timeouts, on a connection of its own: never cut
        answer: list[requests.Response] = []
        streamer = threading.Thread(target=lambda: answer.append(requests.post(
            g.url + "/v1/chat/completions", timeout=30, json={
                "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "fake": {"chunks": 25, "gap_s": 0.1}})))
        streamer.start()
        t0 = time.monotonic()
        header_closed_at: float | None = None
        while time.monotonic() - t0 < 4.0:
            for s in slow:  # slowloris: a byte of the head every 50 ms, never its end
                if is_open(s):
                    s.send(b"X")
            if time.monotonic() - t0 < 0.3:
                assert all(is_open(s) for s in idle + slow)  # nothing closed early
            if header_closed_at is None and not any(is_open(s) for s in slow):
                header_closed_at = time.monotonic() - t0
            time.sleep(0.05)
        assert header_closed_at is not None and header_closed_at < 1.5, header_closed_at
        assert not any(is_open(s) for s in idle)
        streamer.join(30)
        assert answer[0].status_code == 200 and answer[0].text.endswith("data: [DONE]\n\n")
        closed = g.gateway.metrics.connections_closed
        assert closed["header"] == 10 and closed["idle"] >= 30, closed
        # a kept-alive connection that served a request is idle again afterwards
        kept = connect(g.url)
        sockets.append(kept)
        kept.sendall(raw_post({"messages": [{"role": "user", "content": "hi"}],
                               "max_tokens": 2}))
        assert wait_for(lambda: not is_open(kept), 5)  # its answer read, then closed
        metrics = requests.get(g.url + "/metrics", timeout=5).text
        assert 'chatfleet_gateway_connections_closed_total{reason="header"} 10.0' in metrics


def refused_answer(url: str) -> bytes:
    """A new connection's whole answer, read until the gateway closes it."""
    with connect(url) as extra:
        extra.setblocking(True)
        extra.settimeout(10)
        got = b""
        while part := extra.recv(4096):
            got += part
    return got


def assert_refused(got: bytes) -> None:
    assert got.startswith(b"HTTP/1.1 503"), got
    head, body = got.split(b"\r\n\r\n", 1)
    assert b"\r\nRetry-After: 1\r\n" in head and b"\r\nretry-after-ms: 1000\r\n" in head
    assert b"\r\nServer: chatfleet\r\n" in head
    assert orjson.loads(body)["error"]["code"] == "connection_limit"


def test_at_the_connection_limit_the_idlest_makes_room(fakes2: list[Fake],
                                                       sockets: list[socket.socket]) -> None:
    """A connection beyond the limit takes the place of the one idle the longest, once that
    one has been idle for the header timeout; before that (a new connection has that long to
    send its request) it is refused with a 503 and Retry-After, never evicted (issue 23:
    evicting them reset clients that had not sent their request yet)."""
    cfg = gateway_config([f.url for f in fakes2], max_connections=16,
                         timeouts={"client_header_s": 0.5})
    with gateway(cfg) as g:
        for _ in range(16):
            sockets.append(connect(g.url))
            time.sleep(0.005)  # in order: the oldest are the idlest
        assert wait_for(lambda: g.gateway.metrics.client_connections == 16)
        assert_refused(refused_answer(g.url))  # all 16 younger than the header timeout
        assert all(is_open(s) for s in sockets)
        time.sleep(0.6)
        for _ in range(8):  # each takes the place of the idlest: the oldest go first
            sockets.append(connect(g.url))
            time.sleep(0.005)
        assert wait_for(lambda: not any(is_open(s) for s in sockets[:8]))
        assert all(is_open(s) for s in sockets[8:])
        assert health(g.url) == 200  # /health too gets in
        assert g.gateway.metrics.client_connections <= 16
        assert g.gateway.metrics.connections_closed["evicted"] == 9
        for s in sockets:
            s.close()
        sockets.clear()
        # every connection busy (16 streams in progress): a new one gets a 503 and is closed
        for _ in range(16):
            s = connect(g.url)
            s.setblocking(True)
            s.sendall(raw_post({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                "fake": {"chunks": 40, "gap_s": 0.1}}))
            s.setblocking(False)
            sockets.append(s)
        assert wait_for(lambda: g.gateway.metrics.client_connections == 16)
        assert wait_for(lambda: sum(f.in_flight for f in fakes2) == 16)
        assert_refused(refused_answer(g.url))
        assert all(is_open(s) for s in sockets)  # the streams were not touched
        assert g.gateway.metrics.connections_closed["refused"] == 2


def _limit_fds(n: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))


def test_health_answers_while_idle_sockets_would_take_every_descriptor(
        fakes2: list[Fake], tmp_path: Path, sockets: list[socket.socket]) -> None:
    """The issue-14 probe: a gateway under `ulimit -n 400` and 300 idle sockets plus 20
    slowloris ones. Before issue 14, 183 of them took every descriptor under `ulimit -n 200`,
    /health got resets and they stayed open; now the connection limit (184 here) keeps room:
    the sockets past it get their 503, /health is never reset (a 503 with Retry-After while
    every connection is younger than the header timeout, 200 after), and all of them are
    closed after their timeouts."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1024:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    cfg = tmp_path / "gateway.json"
    cfg.write_text(json.dumps({"replicas": [f.url for f in fakes2],
                               "timeouts": {"client_idle_s": 3, "client_header_s": 1}}))
    log = tmp_path / "gateway.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("chatfleet")), "gateway", "--config", str(cfg),
             "--port", "0"], stdout=subprocess.PIPE, stderr=err,
            preexec_fn=lambda: _limit_fds(400))
    try:
        [url] = read_urls(proc, 1, 30)
        for _ in range(300):
            sockets.append(connect(url))
        slow = [connect(url) for _ in range(20)]
        sockets.extend(slow)
        for s in slow:
            s.send(HEAD)
        fds = len(os.listdir(f"/proc/{proc.pid}/fd"))
        answers = [health(url) for _ in range(10)]
        assert set(answers) <= {200, 503}, answers  # never a reset
        time.sleep(1.1)  # the oldest idle ones can now make room
        assert health(url) == 200
        assert fds < 400, fds
        assert wait_for(lambda: not any(is_open(s) for s in sockets), 10)
        assert health(url) == 200
    finally:
        stop(proc)
    text = log.read_text()
    assert "Traceback" not in text and "Too many open files" not in text, text[-2000:]


def test_a_reload_applies_the_idle_timeout_to_open_connections(
        fakes2: list[Fake], sockets: list[socket.socket]) -> None:
    urls = [f.url for f in fakes2]
    with gateway(gateway_config(urls, timeouts={"client_idle_s": 600})) as g:
        sockets.extend(connect(g.url) for _ in range(5))
        time.sleep(1.5)
        assert all(is_open(s) for s in sockets)
        shorter = gateway_config(urls, timeouts={"client_idle_s": 1})
        g.gateway.loop.call_soon_threadsafe(g.gateway.apply, shorter)
        assert wait_for(lambda: not any(is_open(s) for s in sockets), 5)
