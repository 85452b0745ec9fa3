"""Garbage at the front door: every answer a clear 4xx (or a normal answer), never a 5xx, a
hang or a crash; the gateway serves normally afterwards."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import requests
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from chatfleet.gateway.config import hash_key
from tests.gateway.conftest import raw_connection, raw_post
from tests.reliability.conftest import fleet, record
from tests.reliability.test_faults import ask
from tests.schemathesis_drive import GENERATING, drive_schema

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

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
    ("JSON nested 300 deep (read, but too deep to forward)",
     raw_post(b'{"messages": [' + MSG + b'], "x": ' + b"[" * 300 + b"]" * 300 + b"}")),
    ("JSON nested 1,000 deep", raw_post(b'{"messages": [' + MSG + b'], "x": '
                                        + b"[" * 1000 + b"]" * 1000 + b"}")),
    ("a body that is not the gzip its Content-Encoding says",
     raw_post(b"not gzip at all", headers="Content-Encoding: gzip\r\n")),
    ("an X-Session-ID that is not UTF-8",
     b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Session-ID: caf\xe9\xff\r\n"
     b"Content-Length: %d\r\n\r\n%s" % (len(b'{"messages": [' + MSG + b']}'),
                                       b'{"messages": [' + MSG + b']}')),
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


REPLICA_CASES = {"JSON nested 300 deep (read, but too deep to forward)", "JSON nested 1,000 deep",
                 "a body that is not the gzip its Content-Encoding says"}


def test_garbage_gets_a_clear_4xx_and_no_crash(tmp_path: Path) -> None:
    with fleet(tmp_path, cap=4, gateways=1, replicas=1) as f:
        url = f.gateway_urls[0]
        seen: dict[str, int | None] = {}
        for name, data in CASES:
            try:
                seen[name] = raw(url, data)
            except (TimeoutError, ConnectionResetError):
                seen[name] = None  # the lying Content-Length: the gateway waits, then drops it
        # the replica itself (a simserver) reads bodies too
        for name, data in CASES:
            if name in REPLICA_CASES:
                seen[f"{name} (to the replica)"] = raw(f.replica_urls[0], data)
        assert requests.get(url + "/health", timeout=5).status_code == 200
        after = [ask(url, 10, f"s{i}") for i in range(3)]
    assert "Traceback" not in (tmp_path / "sim-0.log").read_text()
    bad = {k: v for k, v in seen.items() if v is not None and v >= 500}
    unanswered = [k for k, v in seen.items() if v is None]
    record("input", f"{len(CASES)} kinds of bad request (bodies, encodings, nesting, types, "
           "absurd max_tokens, header injection and bytes, framing, paths), "
           f"{len(REPLICA_CASES)} of them to the replica too",
           "a clear 4xx (or a normal answer for a legal oddity), never a 5xx or a crash; the "
           "gateway serves normally afterwards",
           f"statuses {sorted({v for v in seen.values() if v is not None})}; no 5xx; "
           f"{len(unanswered)} closed without a status ({', '.join(unanswered) or 'none'}); "
           f"{sum(r['outcome'] == 'ok' for r in after)}/3 ok afterwards",
           requests_sent=len(CASES) + len(REPLICA_CASES) + 3, lost=len(bad))
    assert not bad, bad
    assert set(unanswered) <= {"a Content-Length that lies (longer than the body)"}
    assert all(v is None or 200 <= v < 500 for v in seen.values())
    assert all(r["outcome"] == "ok" for r in after)


# --- Schemathesis over the gateway's own OpenAPI description ------------------------------------
#
# Driven as tests/simserver/test_schemathesis.py drives the simserver (its docstring says why
# `from_url` + `as_strategy` + `@given` rather than the pytest loader, and how every generating
# case is bounded to 8 tokens). Phase 1: every operation without a key (the admin API answers
# 401), positive and negative modes. Phase 2: the admin operations with the admin key; the file
# is reloaded after it, which restates whatever the cases changed.

ADMIN_KEY = "admin-key-schemathesis"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


def conforming(case: Any, response: requests.Response) -> None:
    """No 5xx, the OpenAI error body on every 4xx, and the description's statuses, types,
    headers and bodies."""
    what = (case.method, case.path, case.headers, case.body, response.text[:300])
    assert response.status_code < 500, what
    if response.status_code >= 400:
        err = response.json()["error"]
        assert isinstance(err["message"], str) and err["message"], what
        assert {"type", "param", "code"} <= set(err), what
    case.validate_response(response, checks=CHECKS)


def schemathesis_run(url: str, mode: GenerationMode, examples: int, *, admin: bool = False,
                     ) -> dict[str, int]:
    if not admin:
        return drive_schema(url, mode, examples, conforming)
    return drive_schema(url, mode, examples, conforming, path_regex="^/admin",
                        headers={"Authorization": f"Bearer {ADMIN_KEY}"})


def test_schemathesis_over_the_gateway(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with fleet(tmp_path, cap=4, gateways=1, replicas=1,
               extra={"admin": {"sha256": hash_key(ADMIN_KEY)}}) as f:
        url = f.gateway_urls[0]
        seen: dict[str, dict[str, int]] = {}
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            seen[mode.value] = schemathesis_run(url, mode, 150)
            seen[f"admin {mode.value}"] = schemathesis_run(url, mode, 40, admin=True)
        restated = requests.post(url + "/admin/reload", timeout=10,
                                 headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert restated.status_code == 200, restated.text
        assert requests.get(url + "/health", timeout=5).status_code == 200
        after = [ask(url, 10, f"s{i}") for i in range(3)]
    cases = {k: sum(v.values()) for k, v in seen.items()}
    statuses = sorted({int(k.rsplit(" ", 1)[1]) for v in seen.values() for k in v})
    pos, neg = seen["positive"], seen["negative"]
    record("input", f"Schemathesis over the gateway's /openapi.json: {sum(cases.values())} "
           f"generated requests (positive {cases['positive']}, negative {cases['negative']}, "
           f"admin API with its key {cases['admin positive'] + cases['admin negative']}), "
           "every generating one bounded to 8 tokens",
           "no 5xx, every 4xx with the OpenAI error body, status, content type, headers and "
           "body as described; the gateway serves normally afterwards",
           f"statuses {statuses}; no 5xx; every answer conformant; "
           f"{sum(r['outcome'] == 'ok' for r in after)}/3 ok afterwards "
           f"({time.monotonic() - t0:.0f} s)",
           requests_sent=sum(cases.values()) + 3, lost=0)
    # the run reached the generating routes, with answers and with rejections
    for path in GENERATING:
        assert any(k.startswith(f"POST {path} 200") for k in pos), pos
        assert any(k.startswith(f"POST {path} 400") for k in neg), neg
    assert any(k.endswith(" 401") for k in pos), pos  # the admin API without its key
    assert all(r["outcome"] == "ok" for r in after)
