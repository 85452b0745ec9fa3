"""A stream whose client reads nothing (issue 23): once part of its answer waits in the gateway
(the kernel's buffers full) and the client has read none of it for timeouts.client_read_s, it
is cut off, its slot freed and the engine's request aborted, counted in
chatfleet_gateway_stalled_clients_total. Before, eight such clients held all eight slots of a
fleet until 1 MiB of each answer had piled up in the gateway, after the kernel's send buffers
(up to 4 MiB each): at a chat stream's pace, minutes."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
import requests

from chatfleet.gateway.relay import StreamWatch
from chatfleet.gateway.upstream import Exchange
from tests.gateway.conftest import Fake, gateway, gateway_config, raw_post
from tests.gateway.test_relay import chat
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(120)


def stream_body(chunks: int, pad: int, gap_s: float) -> bytes:
    return raw_post({"messages": [{"role": "user", "content": "x"}], "stream": True,
                     "fake": {"chunks": chunks, "gap_s": gap_s, "pad": pad}})


@contextlib.contextmanager
def not_reading(url: str, n: int, body: bytes) -> Iterator[list[socket.socket]]:
    """n clients that send `body` and never read (a 4 KiB receive buffer)."""
    host, port = url.removeprefix("http://").split(":")
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect((host, int(port)))
            s.sendall(body)
            socks.append(s)
        yield socks
    finally:
        for s in socks:
            s.close()


def slow_reader(url: str, body: bytes, every_s: float) -> bytes:
    """Reads 2 KiB every `every_s` until the answer ends."""
    host, port = url.removeprefix("http://").split(":")
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(30)
        s.connect((host, int(port)))
        s.sendall(body)
        got = b""
        while not got.endswith(b"0\r\n\r\n"):
            part = s.recv(2048)
            if not part:
                break
            got += part
            time.sleep(every_s)
    return got


def test_clients_that_never_read_free_the_fleet_after_client_read_s(fakes2: list[Fake]) -> None:
    """The issue's probe: 8 clients that never read, on a fleet of 8 slots, 40 s streams of
    1 KB chunks (1 MiB would pile up only after some 20 s). With client_read_s 1 s they are
    cut off once their buffers are full, the engine's requests aborted; a client that reads
    slowly, but reads, keeps its stream."""
    cfg = gateway_config([f.url for f in fakes2], cap=4, timeouts={"client_read_s": 1})
    with gateway(cfg) as g, concurrent.futures.ThreadPoolExecutor(1) as pool:
        with not_reading(g.url, 8, stream_body(2000, 1000, 0.02)):
            assert wait_for(lambda: sum(f.in_flight for f in fakes2) == 8)
            t0 = time.monotonic()
            assert wait_for(lambda: sum(f.aborted for f in fakes2) == 8, 15)
            freed_s = time.monotonic() - t0
            m = g.gateway.metrics
            assert wait_for(lambda: m.stalled_clients == 8)
            assert m.slow_clients == 0 and m.requests["cancelled"] == 8
            assert all(g.gateway.fleet.ac.in_flight(n) == 0 for n in ("f0", "f1"))
            # the fleet serves again at once, a slow reader included
            slow = pool.submit(slow_reader, g.url, stream_body(30, 1000, 0.001), 0.1)
            assert chat(g.url, {"chunks": 3}).text.endswith("data: [DONE]\n\n")
            assert b"data: [DONE]" in slow.result(60)
        assert m.stalled_clients == 8
        metrics = requests.get(g.url + "/metrics", timeout=5).text
        assert "chatfleet_gateway_stalled_clients_total 8.0" in metrics
    assert freed_s < 10, freed_s


class StuckClient:
    """A client's transport whose buffer drains only when told (`take`)."""

    def __init__(self) -> None:
        self.unread = 0
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.unread += len(data)

    def take(self, n: int) -> None:
        self.unread -= n

    def get_write_buffer_size(self) -> int:
        return self.unread

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default  # no socket: only the gateway's buffer counts

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True


def test_a_finished_answer_its_client_does_not_take_is_still_watched() -> None:
    """The engine is done, but the end of the answer waits for a client that takes none of
    it: the watch goes on until the last byte has left, and cuts the client off after
    client_read_s (before, it stopped watching when the engine was done, and the stream held
    its connection, and its slot, for as long as the client did not read). A client that
    takes some of it at every look is never cut."""
    loop = asyncio.new_event_loop()
    try:
        watch = StreamWatch()
        clients = []
        for _ in range(2):
            ex = Exchange(loop)
            ex.got_head(200, None, True)
            ex.got_body(b"x" * 100_000, 10, 0.0)
            client = StuckClient()
            ex.start(cast(asyncio.Transport, client))
            ex.ended()
            watch.watch(ex, deadline=900.0)
            clients.append((ex, client))
        (stuck_ex, stuck), (slow_ex, slow) = clients
        for now in (0.0, 0.5, 1.0, 1.5, 2.0, 2.5):
            slow.take(1000)
            watch.sweep(now, idle_s=60.0, client_read_s=1.0)
            if now <= 1.0:
                assert not stuck.aborted
        assert stuck.aborted and stuck_ex.cut_off == "stalled"
        assert not slow.aborted and slow_ex.cut_off is None
    finally:
        loop.close()
