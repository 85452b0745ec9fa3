"""Garbage at the front door: every answer a clear 4xx (or a normal answer), never a 5xx, a
hang or a crash; the gateway serves normally afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from tests.gateway.conftest import raw_connection, raw_post
from tests.reliability.conftest import fleet, record
from tests.reliability.test_faults import ask

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

MSG = b'{"role": "user", "content": "hi"}'


def raw(url: str, data: bytes) -> int | None:
    """Send bytes as they are; the status code of the answer (None: closed without one)."""
    with raw_connection(url, data) as s:
        got = b""
        while b"\r\n" not in got:
            part = s.recv(4096)
            if not part:
                return None
            got += part
    return int(got.split(b" ", 2)[1])


CASES: list[tuple[str, bytes]] = [
    ("a 5 MiB body", raw_post(b'{"messages": [' + MSG + b'], "x": "' + b"a" * (5 << 20) + b'"}')),
    ("invalid UTF-8 in the JSON",
     raw_post(b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}')),
    ("not JSON", raw_post(b"messages=hi")),
    ("an empty body", raw_post(b"")),
    ("JSON null", raw_post(b"null")),
    ("JSON nested 100,000 deep", raw_post(b"[" * 100_000 + b"]" * 100_000)),
    ("messages as a string", raw_post(b'{"messages": "hi"}')),
    ("a message without a role", raw_post(b'{"messages": [{"content": "hi"}]}')),
    ("max_tokens as a string", raw_post(b'{"messages": [' + MSG + b'], "max_tokens": "ten"}')),
    ("max_tokens negative", raw_post(b'{"messages": [' + MSG + b'], "max_tokens": -5}')),
    ("max_tokens 10^12", raw_post(b'{"messages": [' + MSG + b'], "max_tokens": 1000000000000}')),
    ("stream as a string", raw_post(b'{"messages": [' + MSG + b'], "stream": "yes"}')),
    ("temperature as a string", raw_post(b'{"messages": [' + MSG + b'], "temperature": "hot"}')),
    ("prompt as a number (completions)", raw_post(b'{"prompt": 42}', path="/v1/completions")),
    ("a CRLF header injection in X-Session-ID",
     raw_post(b'{"messages": [' + MSG + b']}',
          headers="X-Session-ID: a\r\n\r\nGET /admin/replicas HTTP/1.1\r\n")),
    ("a bare LF in a header value", raw_post(b'{"messages": [' + MSG + b']}',
                                          headers="X-Session-ID: a\nX-Evil: 1\r\n")),
    ("a 64 KiB header", raw_post(b'{"messages": [' + MSG + b']}',
                             headers="X-Session-ID: " + "s" * 65536 + "\r\n")),
    ("a Content-Length that lies (longer than the body)",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{}"),
    ("a negative Content-Length",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}"),
    ("broken chunked framing",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"zz\r\n{}\r\n0\r\n\r\n"),
    ("an unknown path", raw_post(b"{}", path="/v1/nothing")),
    ("the admin API without its key", raw_post(b"{}", path="/admin/reload")),
    ("a path with ../", raw_post(b"{}", path="/v1/../admin/replicas")),
]


def test_garbage_gets_a_clear_4xx_and_no_crash(tmp_path: Path) -> None:
    with fleet(tmp_path, cap=4, gateways=1, replicas=1) as f:
        url = f.gateway_urls[0]
        seen: dict[str, int | None] = {}
        for name, data in CASES:
            try:
                seen[name] = raw(url, data)
            except (TimeoutError, ConnectionResetError):
                seen[name] = None  # the lying Content-Length: the gateway waits, then drops it
        assert requests.get(url + "/health", timeout=5).status_code == 200
        after = [ask(url, 10, f"s{i}") for i in range(3)]
    bad = {k: v for k, v in seen.items() if v is not None and v >= 500}
    unanswered = [k for k, v in seen.items() if v is None]
    record("input", f"{len(CASES)} kinds of bad request (bodies, encodings, types, absurd "
           "max_tokens, header injection, framing, paths)",
           "a clear 4xx (or a normal answer for a legal oddity), never a 5xx or a crash; the "
           "gateway serves normally afterwards",
           f"statuses {sorted({v for v in seen.values() if v is not None})}; no 5xx; "
           f"{len(unanswered)} closed without a status ({', '.join(unanswered) or 'none'}); "
           f"{sum(r['outcome'] == 'ok' for r in after)}/3 ok afterwards",
           requests_sent=len(CASES) + 3, lost=len(bad))
    assert not bad, bad
    assert set(unanswered) <= {"a Content-Length that lies (longer than the body)"}
    assert all(v is None or 200 <= v < 500 for v in seen.values())
    assert all(r["outcome"] == "ok" for r in after)
