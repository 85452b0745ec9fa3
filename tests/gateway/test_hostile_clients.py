"""What a hostile or broken client can send the gateway (issue 14): every bad input gets a clear
4xx with the OpenAI error body and one log line at most, never a 500 or a traceback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
import requests

from chatfleet.core.fleet.session import entry_bytes
from chatfleet.gateway.config import hash_key
from chatfleet.gateway.state import MemoryState, RedisState, StateBackend
from tests.gateway.conftest import Fake, gateway, gateway_config, raw_connection
from tests.gateway.redis_server import redis_server
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(120)

MSG = b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4'
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def post(headers: bytes, body: bytes) -> bytes:
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + headers
            + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def exchange(url: str, data: bytes) -> tuple[int, bytes]:
    """Send `data`; the answer's status and body (read to Content-Length)."""
    with raw_connection(url, data) as s:
        got = b""
        while b"\r\n\r\n" not in got:
            part = s.recv(65536)
            assert part, got
            got += part
        head, body = got.split(b"\r\n\r\n", 1)
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:"))
        while len(body) < length:
            part = s.recv(65536)
            assert part
            body += part
    return int(head.split(b" ", 2)[1]), body


def openai_error(status: int, body: bytes, expected: int) -> str:
    assert status == expected, (status, body[:300])
    err = orjson.loads(body)["error"]
    assert {"message", "type", "param", "code"} <= set(err)
    assert isinstance(err["message"], str) and err["message"]
    return str(err["message"])


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    for rec in caplog.records:
        assert rec.exc_info is None, (rec.name, rec.getMessage())
        assert rec.levelno < logging.ERROR, (rec.name, rec.getMessage())


@pytest.mark.parametrize("depth", [254, 300, 1000])
def test_json_nested_deeper_than_the_gateway_can_forward_is_a_400(
        fakes2: list[Fake], depth: int, caplog: pytest.LogCaptureFixture) -> None:
    """orjson reads 1,024 levels but writes 255: the gateway must refuse what it cannot send
    on, before it tries."""
    body = MSG + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        message = openai_error(*exchange(g.url, post(b"", body)), 400)
        assert "nested" in message
        status, _ = exchange(g.url, post(b"", MSG + b"}"))
        assert status == 200
    assert sum(len(f.bodies) for f in fakes2) == 1
    no_traceback(caplog)


def test_an_invalid_gzip_body_is_a_400(fakes2: list[Fake],
                                       caplog: pytest.LogCaptureFixture) -> None:
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        message = openai_error(*exchange(
            g.url, post(b"Content-Encoding: gzip\r\n", b"this is not gzip")), 400)
        assert "Content-Encoding" in message
    assert sum(len(f.bodies) for f in fakes2) == 0
    no_traceback(caplog)


@pytest.fixture(params=["memory", "redis"])
def state(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StateBackend]:
    if request.param == "memory":
        yield MemoryState()
        return
    with redis_server(tmp_path) as (url, _):
        yield RedisState(url)


def test_a_session_id_that_is_not_utf8_is_a_400(fakes2: list[Fake], state: StateBackend,
                                                caplog: pytest.LogCaptureFixture) -> None:
    with gateway(gateway_config([f.url for f in fakes2], state={"gateways": 1}), state=state) as g:
        message = openai_error(*exchange(g.url, post(b"X-Session-ID: caf\xe9\xff\r\n",
                                                     MSG + b"}")), 400)
        assert "X-Session-ID" in message
        status, _ = exchange(g.url, post("X-Session-ID: café\r\n".encode(), MSG + b"}"))
        assert status == 200  # UTF-8 beyond ASCII is fine
    assert sum(len(f.bodies) for f in fakes2) == 1
    no_traceback(caplog)


def test_an_api_key_that_is_not_utf8_is_a_401(fakes2: list[Fake],
                                              caplog: pytest.LogCaptureFixture) -> None:
    cfg = gateway_config([f.url for f in fakes2],
                         keys=[{"name": "a", "sha256": hash_key("good-key")}])
    with gateway(cfg) as g:
        openai_error(*exchange(g.url, post(b"Authorization: Bearer k\xff\xfe\r\n",
                                           MSG + b"}")), 401)
        status, _ = exchange(g.url, post(b"Authorization: Bearer good-key\r\n", MSG + b"}"))
        assert status == 200
    no_traceback(caplog)


def test_client_chosen_session_keys_cost_bounded_memory(fakes2: list[Fake],
                                                        tmp_path: Path) -> None:
    """20 requests each with a 1 MB `user` and 20 with a 16 KB X-Session-ID: once about 1 MB
    per session in the gateway's table and in Redis (20 MB each); now a short hash each."""
    with redis_server(tmp_path) as (url, _):
        r = redis.Redis.from_url(url)
        before = int(r.info("memory")["used_memory"])
        cfg = gateway_config([f.url for f in fakes2], state={"gateways": 1})
        with gateway(cfg, state=RedisState(url)) as g:
            for i in range(20):
                sid = {"X-Session-ID": f"{i:02d}" + "s" * 16_000}
                for extra in ({"json": {**CHAT, "user": f"{i:02d}" + "u" * 1_000_000}},
                              {"json": CHAT, "headers": sid}):
                    resp = requests.post(g.url + "/v1/chat/completions", timeout=30, **extra)
                    assert resp.status_code == 200, resp.text
            assert wait_for(lambda: len(list(r.scan_iter("chatfleet:session:*"))) == 40)
            router = g.gateway.fleet.router
            assert router is not None and len(router.sessions) == 40
            page = requests.get(g.url + "/metrics", timeout=10).text
        grown = int(r.info("memory")["used_memory"]) - before
        keys = [k.decode() for k in r.scan_iter("chatfleet:session:*")]
    assert grown < 1_000_000, f"Redis grew by {grown / 2**20:.1f} MiB"
    assert max(len(k) for k in keys) <= len("chatfleet:session:") + 37
    assert router.sessions.num_bytes <= 40 * entry_bytes("user#" + "0" * 32)
    assert f"chatfleet_gateway_session_bytes {float(router.sessions.num_bytes)}" in page


def test_redis_with_a_memory_cap_evicts_sessions_and_never_shares(tmp_path: Path) -> None:
    """docs/gateway.md's recipe for the Redis session map: `--maxmemory` with the
    volatile-lru policy. Sessions carry a TTL and shares do not, so only sessions are evicted:
    100,000 sessions of the longest keys (about 20 MB) stay under an 8 MB cap, every share
    survives, and the newest sessions are found."""
    import asyncio

    cap = 8 * 1024 * 1024
    key = "sid:" + "k" * 128  # the longest a session key gets (routing.session_key)
    with redis_server(tmp_path, args=("--maxmemory", str(cap),
                                      "--maxmemory-policy", "volatile-lru")) as (url, _):
        r = redis.Redis.from_url(url)

        async def gateway_calls(first: bool) -> tuple[dict[str, int], str | None]:
            from chatfleet.core.fleet.fairshare import Demand
            from chatfleet.gateway.state import ReplicaAsk, SyncRequest

            st = RedisState(url)
            try:  # gateway a takes every slot of both replicas; later b finds none left
                got = await st.sync(SyncRequest(
                    "gw-a" if first else "gw-b", None, 1, 5.0, Demand(1.0, 8),
                    tuple(ReplicaAsk(f"r{i}", 4, 4, 0, 4 if first else 0) for i in range(2))))
                await st.set_session(f"{key}-{first}", "r1", 600.0)
                return (got.shares, await st.get_session(f"{key}-{first}"))
            finally:
                await st.close()

        asyncio.run(gateway_calls(True))
        # the bulk, as set_session writes it (chatfleet:session:KEY, a TTL), pipelined
        for start in range(0, 100_000, 5000):
            with r.pipeline(transaction=False) as pipe:
                for i in range(start, start + 5000):
                    pipe.set(f"chatfleet:session:{key}{i:06d}", "r0", px=600_000)
                pipe.execute()
        counts, newest = asyncio.run(gateway_calls(False))
        used = int(r.info("memory")["used_memory"])
        evicted = int(r.info("stats")["evicted_keys"])
        first = r.get(f"chatfleet:session:{key}000000")
    assert counts == {"r0": 0, "r1": 0}  # a's shares survived: nothing left for b
    assert newest == "r1" and first is None and evicted > 50_000
    assert used <= cap, used


def test_no_prefix_oracle_unless_debug_headers_are_on(fakes2: list[Fake]) -> None:
    """A header saying where a client's system prompt first differs from the configured one
    lets the client recover that prompt byte by byte. Off unless an admin turned on
    debug_headers; the mismatch still counts in the metric."""
    secret = "You are the product. Internal code: 7F3A."
    prompts = [secret, "You are the product. Internal code: 0", "Something else", None]

    def answers(debug: bool) -> list[dict[str, str]]:
        cfg = gateway_config([f.url for f in fakes2], debug_headers=debug,
                             shared_prompt={"mode": "pass-through", "system": secret})
        out = []
        with gateway(cfg) as g:
            for system in prompts:
                msgs = [{"role": "user", "content": "q"}]
                if system is not None:
                    msgs.insert(0, {"role": "system", "content": system})
                resp = requests.post(g.url + "/v1/chat/completions", timeout=30,
                                     json={**CHAT, "messages": msgs})
                assert resp.status_code == 200
                out.append({k.lower(): v for k, v in resp.headers.items()
                            if k.lower() not in ("date", "x-request-id")})
            assert g.gateway.metrics.prefix_mismatches == 3
        return out

    quiet = answers(debug=False)
    assert all(h == quiet[0] for h in quiet), quiet  # nothing tells the prompts apart
    assert not any(k.startswith("x-chatfleet") for h in quiet for k in h)
    loud = answers(debug=True)
    assert [h["x-chatfleet-prefix"].split(";")[0] for h in loud] == [
        "match", "mismatch", "mismatch", "mismatch"]


def test_a_client_reset_during_the_body_read_is_one_log_line(
        fakes2: list[Fake], caplog: pytest.LogCaptureFixture) -> None:
    import socket
    import struct
    import time

    caplog.set_level(logging.INFO)
    with gateway(gateway_config([f.url for f in fakes2])) as g:
        host, port = g.url.removeprefix("http://").split(":")
        for framing in (b"Content-Length: 100000\r\n\r\n", b"Transfer-Encoding: chunked\r\n\r\n"
                        b"4000\r\n"):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + framing
                          + b'{"messages": [' + b" " * 1000)
                time.sleep(0.3)  # the gateway is reading the body
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            assert wait_for(lambda: g.gateway.metrics.client_disconnects >= 1)
        assert wait_for(lambda: g.gateway.metrics.client_disconnects == 2)
        time.sleep(0.3)
        assert requests.post(g.url + "/v1/chat/completions", json=CHAT,
                             timeout=30).status_code == 200
    no_traceback(caplog)
    lines = [r.getMessage() for r in caplog.records if "left" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in line for line in lines), lines
