"""The client connection limit comes from the descriptor limit (issue 23): `chatfleet gateway`
raises its soft limit to the hard one, keeps one descriptor per slot it serves (not two per
slot of every replica, floored at 16), says the limit in its start-up line, refuses to start
when the room left cannot fill its slots, and answers every connection past the limit with a
503 and Retry-After. Before, a gateway at the stock soft limit of 1,024 over 8 replicas of
cap 96 took 16 of 200 concurrent streams and closed the other 184 without a byte."""

from __future__ import annotations

import contextlib
import json
import re
import resource
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.conftest import Fake, fake_replicas, raw_post
from tests.processes import CHATFLEET, stop
from tests.simserver.test_cli_simserver import read_urls

pytestmark = pytest.mark.timeout(120)

# the start-up line (wrapped where the console is narrow)
LIMIT_LINE = re.compile(r"client\s+connections\s+at\s+most\s+(\d+)\s+"
                        r"\(descriptor\s+limit\s+(\d+)\)")


@pytest.fixture
def fakes() -> Iterator[list[Fake]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2048 <= hard:  # this process holds the fakes' side of every stream
        resource.setrlimit(resource.RLIMIT_NOFILE, (2048, hard))
    with fake_replicas(2) as f:
        yield f


def gateway_under(cfg: dict[str, object], soft: int, hard: int, tmp_path: Path,
                  ) -> tuple[subprocess.Popen[bytes], Path]:
    """`chatfleet gateway --config` started with RLIMIT_NOFILE (soft, hard); its stderr log."""
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps(cfg))
    log = tmp_path / "gateway.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [str(CHATFLEET), "gateway", "--config", str(path), "--port", "0"],
            stdout=subprocess.PIPE, stderr=err,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)))
    return proc, log


def limit_line(log: Path, timeout_s: float = 10.0) -> tuple[int, int]:
    """(connection limit, descriptor limit) from the gateway's start-up line."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        m = LIMIT_LINE.search(log.read_text())
        if m:
            return int(m.group(1)), int(m.group(2))
        time.sleep(0.05)
    raise AssertionError(log.read_text())


def answer(s: socket.socket) -> bytes:
    """What the gateway sends on `s` until a chunked answer ends or it closes."""
    got = b""
    while not got.endswith(b"0\r\n\r\n"):
        try:
            part = s.recv(65536)
        except ConnectionResetError:
            return got + b"<reset>"
        if not part:
            break
        got += part
    return got


def test_concurrent_streams_past_the_limit_each_get_a_503_with_retry_after(
        fakes: list[Fake], tmp_path: Path) -> None:
    """Under ulimit -n 500 with 2 replicas of cap 60: the gateway keeps 64 + 128 (refusals)
    + 4 (probes) + 120 (one per slot) = 316 descriptors and takes 184 client connections.
    250 concurrent streams: 184 are served, 66 get a 503 with Retry-After, none a reset."""
    cfg = {"replicas": [f.url for f in fakes], "cap": 60, "queue_depth": 200,
           "ttft_budget_s": 60}
    proc, log = gateway_under(cfg, 500, 500, tmp_path)
    socks: list[socket.socket] = []
    try:
        [url] = read_urls(proc, 1, 30)
        assert limit_line(log) == (500 - 316, 500)
        host, port = url.removeprefix("http://").split(":")
        body = raw_post({"messages": [{"role": "user", "content": "hi"}], "stream": True,
                         "fake": {"chunks": 30, "gap_s": 0.1}})
        for _ in range(250):
            s = socket.create_connection((host, int(port)), timeout=60)
            socks.append(s)
            # refused and closed before the request was sent: its 503 is read below
            with contextlib.suppress(OSError):
                s.sendall(body)
        answers = [answer(s) for s in socks]
        statuses = Counter(a.split(b" ", 2)[1] if a.startswith(b"HTTP/1.1 ") else a[:40]
                           for a in answers)
        assert statuses == {b"200": 184, b"503": 66}, statuses
        for a in answers:
            if a.startswith(b"HTTP/1.1 503"):
                assert b"\r\nRetry-After: 1\r\n" in a and b'"connection_limit"' in a
            else:
                assert a.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    finally:
        for s in socks:
            s.close()
        stop(proc)
    assert "Traceback" not in log.read_text()


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one(fakes: list[Fake],
                                                             tmp_path: Path) -> None:
    proc, log = gateway_under({"replicas": [f.url for f in fakes]}, 256, 4096, tmp_path)
    try:
        read_urls(proc, 1, 30)
        limit, fds = limit_line(log)
        assert fds == 4096 and limit == 4096 - (64 + 128 + 4 + 16)
        limits = Path(f"/proc/{proc.pid}/limits").read_text()
        assert re.search(r"Max open files\s+4096\s+4096", limits), limits
    finally:
        stop(proc)


def test_a_limit_that_cannot_fill_the_slots_refuses_to_start(tmp_path: Path) -> None:
    """316 descriptors for itself under a limit of 400 leaves 84 client connections for 120
    slots: one line, exit 2, before it binds or probes anything."""
    cfg = {"replicas": ["http://127.0.0.1:9", "http://127.0.0.1:10"], "cap": 60}
    proc, log = gateway_under(cfg, 400, 400, tmp_path)
    try:
        assert proc.wait(30) == 2
    finally:
        stop(proc)  # a gateway that started after all (the defect) is stopped, not left
    lines = log.read_text().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: the descriptor limit (400, ulimit -n) leaves room for "
                               "84 client connections"), lines
    assert "fewer than the 120 slots it serves" in lines[0] and "at least 436" in lines[0]
