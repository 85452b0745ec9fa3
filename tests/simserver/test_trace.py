"""--trace: every token's planned and actual send time, and every scheduler step."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import requests

from chatfleet.simserver.server import serve_in_thread
from tests.waiting import wait_for

from .conftest import HTTP_TIMEOUT, MODEL, config, post, sse_events

pytestmark = pytest.mark.timeout(60)

STEP_KEYS = {"batch", "prefill_tokens", "decode_tokens", "running", "queue", "token_usage"}


def read_trace(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def check_trace_rows(rows: list[dict[str, Any]], tokens_by_rid: dict[str, int]) -> None:
    tokens = [r for r in rows if r["type"] == "token"]
    steps = [r for r in rows if r["type"] == "step"]
    assert tokens and steps
    for t in tokens:
        assert {"rid", "index", "planned", "actual", "planned_unix", "actual_unix"} <= t.keys()
        assert t["actual"] >= t["planned"], t
        assert t["actual_unix"] >= t["planned_unix"] - 1e-6, t
    per_rid = Counter(t["rid"] for t in tokens)
    for rid, n in tokens_by_rid.items():
        assert per_rid[rid] == n, (rid, per_rid[rid], n)
        idx = [t["index"] for t in tokens if t["rid"] == rid]
        assert idx == list(range(n))
        planned = [t["planned"] for t in tokens if t["rid"] == rid]
        assert planned == sorted(planned)
    kinds = Counter(s["kind"] for s in steps)
    assert kinds["prefill"] >= len(tokens_by_rid) // 2 and kinds["decode"] > 0
    for s in steps:
        assert s.keys() >= STEP_KEYS, s
        assert 0 <= s["token_usage"] <= 1
        assert s["running"] >= 0 and s["queue"] >= 0
        if s["kind"] == "prefill":
            assert s["prefill_tokens"] > 0 and s["decode_tokens"] == 0
        else:
            assert s["decode_tokens"] > 0 and s["prefill_tokens"] == 0
            assert s["batch"] == s["decode_tokens"]
    times = [s["t"] for s in steps]
    assert times == sorted(times)


def test_trace_file_after_the_server_stops(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    with serve_in_thread(config(trace=path)) as srv:
        url = srv.urls[0]
        r = post(url, "/v1/completions", {"prompt": "hello", "max_tokens": 12,
                                          "ignore_eos": True, "rid": "whole"})
        assert r.status_code == 200
        with requests.post(url + "/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "stream": True, "max_tokens": 20, "ignore_eos": True, "rid": "streamed"},
                stream=True, timeout=HTTP_TIMEOUT) as resp:
            events = list(sse_events(resp))
        assert events[-1] == "[DONE]"
    rows = read_trace(path)
    check_trace_rows(rows, {"whole": 12, "streamed": 20})
    # a step row with two requests decoding together is not required here, but the steps must
    # account for every generated token: decode tokens + one first token per prefill request
    steps = [s for s in rows if s["type"] == "step"]
    decoded = sum(s["decode_tokens"] for s in steps)
    assert decoded == (12 - 1) + (20 - 1)


def test_a_replica_held_up_by_its_host_says_how_much_model_time_it_lost(tmp_path: Path) -> None:
    """More than 50 ms (wall) behind, a replica starts its next step from the present: the
    model time in between is lost, and a "resync" row says how much (the parity checks read
    it to tell a run the host kept up with from one it did not)."""
    import threading
    import time

    path = tmp_path / "trace.jsonl"
    scale = 20.0
    with serve_in_thread(config(trace=path, time_scale=scale)) as srv:
        done = threading.Event()

        def long_request() -> None:
            post(srv.urls[0], "/v1/completions", {"prompt": "hello", "max_tokens": 400,
                                                  "ignore_eos": True, "rid": "long"})
            done.set()

        threading.Thread(target=long_request, daemon=True).start()
        rep = srv.replicas[0]
        assert rep._task is not None
        # decoding (400 tokens take about 1 s of wall time), then the host holds it up
        assert wait_for(lambda: "long" in rep.handles and rep.handles["long"].emitted >= 20)
        rep._task.get_loop().call_soon_threadsafe(time.sleep, 0.25)
        assert done.wait(HTTP_TIMEOUT)
    rows = read_trace(path)
    lost = [r for r in rows if r["type"] == "resync"]
    assert lost, "no resync row"
    assert all(r["replica"] == "replica-0" and r["lost_s"] > 0 for r in lost)
    assert 0.2 * scale <= sum(r["lost_s"] for r in lost) <= 1.0 * scale
