"""Faults, each with its expected outcome: a replica killed mid-stream, a replica that hangs,
a gateway killed, a slow client. Redis's faults under load: test_redis_faults.py."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.gateway.conftest import raw_connection, raw_post
from tests.reliability.conftest import Fleet, fleet, metric, record
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def ask(url: str, tokens: int, session: str | None = None) -> dict[str, Any]:
    """One streamed chat request; what the client saw."""
    headers = {"X-Session-ID": session} if session else {}
    body = {"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": tokens, "ignore_eos": True, "stream": True}
    try:
        r = requests.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
    except requests.RequestException as exc:
        return {"status": None, "outcome": "error", "detail": f"client: {exc}"}
    text = r.text
    if r.status_code != 200:
        return {"status": r.status_code, "outcome": "shed" if r.status_code == 429 else "error",
                "detail": r.json()["error"]["message"],
                "replica": r.headers.get("x-chatfleet-replica")}
    errors = [json.loads(line[6:])["error"] for line in text.split("\n")
              if line.startswith("data: {\"error\"")]
    if errors:
        return {"status": 200, "outcome": "error", "detail": errors[0]["message"],
                "replica": r.headers.get("x-chatfleet-replica")}
    done = text.endswith("data: [DONE]\n\n")
    return {"status": 200, "outcome": "ok" if done else "cut", "detail": "",
            "replica": r.headers.get("x-chatfleet-replica")}


def many(url: str, n: int, tokens: int, prefix: str) -> list[concurrent.futures.Future[Any]]:
    pool = concurrent.futures.ThreadPoolExecutor(n)
    futs = [pool.submit(ask, url, tokens, f"{prefix}{i}") for i in range(n)]
    pool.shutdown(wait=False)
    return futs


def accounted(results: list[dict[str, Any]]) -> int:
    """Requests that ended neither ok, nor 429, nor with a clear error message: lost."""
    return sum(1 for r in results if r["outcome"] not in ("ok", "shed", "error")
               or (r["outcome"] == "error" and not r["detail"]))


def serving(f: Fleet, i: int = 0) -> list[str]:
    return list(requests.get(f.gateway_urls[i] + "/ready", timeout=5).json()["serving"])


def decoding(f: Fleet) -> list[float]:
    """The streams each replica is decoding (their first tokens are out)."""
    return [metric(requests.get(url + "/metrics", timeout=5).text, "sglang:num_running_reqs")
            for url in f.replica_urls]


def test_a_replica_killed_mid_stream(tmp_path: Path) -> None:
    with fleet(tmp_path, cap=4) as f:
        futs = many(f.gateway_urls[0], 8, 400, "k")
        assert wait_for(lambda: decoding(f) == [4, 4])  # all 8 stream, 4 on each
        f.sims[1].kill()
        f.sims[1].wait(10)
        results = [fu.result(60) for fu in futs]
        on_dead = [r for r in results if r.get("replica") == "r1"]
        assert wait_for(lambda: serving(f) == ["r0"], 10)
        after = [ask(f.gateway_urls[i % 2], 20, f"after{i}") for i in range(6)]
    lost = accounted(results + after)
    record("fault", "a replica killed (SIGKILL) with 8 streams running",
           "its streams end with an SSE error event; the others finish; it is ejected and "
           "later requests go to the survivor",
           f"{len(on_dead)} streams on it ended with '{on_dead[0]['detail'] if on_dead else ''}'"
           f"; {sum(r['outcome'] == 'ok' for r in results)} finished; afterwards "
           f"{sum(r['outcome'] == 'ok' for r in after)}/6 ok on r0",
           requests_sent=len(results) + len(after), lost=lost)
    assert on_dead and all(r["outcome"] == "error" for r in on_dead)
    assert all(r["outcome"] == "ok" for r in results if r.get("replica") == "r0")
    assert all(r["outcome"] == "ok" and r["replica"] == "r0" for r in after)
    assert lost == 0


def test_a_replica_that_hangs(tmp_path: Path) -> None:
    with fleet(tmp_path, cap=4) as f:
        futs = many(f.gateway_urls[0], 8, 400, "h")
        assert wait_for(lambda: decoding(f) == [4, 4])  # all 8 stream, 4 on each
        f.sims[0].send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        results = [fu.result(60) for fu in futs]
        waited = time.monotonic() - t0
        assert wait_for(lambda: serving(f) == ["r1"], 10)
        during = [ask(f.gateway_urls[1], 20, f"during{i}") for i in range(4)]
        f.sims[0].send_signal(signal.SIGCONT)
        assert wait_for(lambda: serving(f) == ["r0", "r1"], 10)
    hung = [r for r in results if r.get("replica") == "r0"]
    lost = accounted(results + during)
    record("fault", "a replica that hangs (SIGSTOP) with 8 streams running, then resumes",
           "its streams are cut after the idle timeout (3 s) with an SSE error; probes eject "
           "it; new requests go elsewhere; it is readmitted when it answers again",
           f"{len(hung)} streams cut with '{hung[0]['detail'] if hung else ''}' within "
           f"{waited:.1f} s; {sum(r['outcome'] == 'ok' for r in during)}/4 ok meanwhile; "
           "readmitted", requests_sent=len(results) + len(during), lost=lost)
    assert hung and all(r["outcome"] == "error" for r in hung)
    assert waited < 10
    assert all(r["outcome"] == "ok" and r["replica"] == "r1" for r in during)
    assert lost == 0


def test_a_gateway_killed_its_shares_expire(tmp_path: Path) -> None:
    with fleet(tmp_path, cap=2) as f:
        futs = many(f.gateway_urls[0], 4, 2000, "g")  # fills both replicas through gateway 0
        assert wait_for(lambda: metric(f.metrics(1),
                                       "chatfleet_gateway_other_gateways_in_flight") == 4, 10)
        f.gateways[0].kill()
        f.gateways[0].wait(10)
        t0 = time.monotonic()
        assert wait_for(lambda: metric(f.metrics(1),
                                       "chatfleet_gateway_other_gateways_in_flight") == 0, 10)
        freed = time.monotonic() - t0
        results = [fu.result(60) for fu in futs]
        after = [ask(f.gateway_urls[1], 20, f"a{i}") for i in range(4)]
    record("fault", "a gateway killed (SIGKILL) while it held every slot",
           "its clients see their connections close; after the lease TTL (2 s here) its "
           "requests no longer count and the surviving gateway takes back its shares, all "
           "but the dead one's own (cap // gateways, kept for it)",
           f"slots freed for the other gateway after {freed:.1f} s; "
           f"{sum(r['outcome'] == 'ok' for r in after)}/4 ok through it",
           requests_sent=len(after), lost=accounted(after))
    assert freed < 5
    assert all(r["status"] is None for r in results)  # the killed gateway's own clients
    assert all(r["outcome"] == "ok" for r in after)


def slow_reader(url: str, tokens: int, delay_s: float) -> tuple[bool, float]:
    body = {"model": "qwen3-8b", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": tokens, "ignore_eos": True, "stream": True}
    t0 = time.monotonic()
    with raw_connection(url, raw_post(body), timeout=30, rcvbuf=4096) as s:
        got = b""
        while not got.endswith(b"0\r\n\r\n"):
            part = s.recv(512)
            if not part:
                break
            got += part
            time.sleep(delay_s)
    return b"data: [DONE]" in got, time.monotonic() - t0


def test_a_slow_client_gets_its_answer_and_slows_no_one(tmp_path: Path) -> None:
    with fleet(tmp_path, cap=4, gateways=1) as f:
        pool = concurrent.futures.ThreadPoolExecutor(1)
        slow = pool.submit(slow_reader, f.gateway_urls[0], 150, 0.02)
        t0 = time.monotonic()
        others = [fu.result(60) for fu in many(f.gateway_urls[0], 4, 150, "o")]
        fast_s = time.monotonic() - t0
        complete, slow_s = slow.result(120)
        pool.shutdown()
    record("fault", "a slow client (reads 512 bytes every 20 ms) beside 4 normal ones",
           "it gets its whole answer, at its own pace; the others are not held up (a client "
           "that leaves more than 1 MiB unread is cut off: tests/gateway)",
           f"slow client complete in {slow_s:.1f} s; the 4 others done in {fast_s:.1f} s",
           requests_sent=5, lost=accounted(others) + (0 if complete else 1))
    assert complete
    assert all(r["outcome"] == "ok" for r in others)
    assert fast_s < slow_s

