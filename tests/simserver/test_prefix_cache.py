"""Prefix cache: cached tokens in usage, /flush_cache (and its refusal while work is pending)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from chatfleet.simserver.server import RunningServer, serve_in_thread
from tests.waiting import wait_for

from .conftest import (
    HTTP_TIMEOUT,
    MODEL,
    chat,
    config,
    hf_chat_ids,
    lcp,
    metrics,
    post,
    sse_events,
)

pytestmark = pytest.mark.timeout(60)

# about 1,500 tokens of system prompt, shared byte for byte
SYSTEM = ("You are the support assistant of a bicycle shop. " + " ".join(
    f"Rule {i}: answer questions about frames, wheels, brakes and gears with care." for i in
    range(100)))


def conversation(question: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


@pytest.fixture
def fresh() -> Iterator[RunningServer]:
    with serve_in_thread(config()) as srv:
        yield srv


def test_shared_system_prompt_is_cached_until_flush(fresh: RunningServer,
                                                    hf_tokenizer: Any) -> None:
    url = fresh.urls[0]
    a, b = conversation("My brakes squeal. Why?"), conversation("How often to oil a chain?")
    shared = lcp(hf_chat_ids(hf_tokenizer, a), hf_chat_ids(hf_tokenizer, b))
    assert shared > 1000

    first = chat(url, a, max_tokens=4)["usage"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0  # nothing cached yet
    second = chat(url, b, max_tokens=4)["usage"]
    cached = second["prompt_tokens_details"]["cached_tokens"]
    assert shared <= cached < second["prompt_tokens"]

    r = post(url, "/flush_cache")
    assert r.status_code == 200, r.text
    again = chat(url, b, max_tokens=4)["usage"]
    assert again["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["prompt_tokens"] == second["prompt_tokens"]


def test_flush_cache_accepts_get_as_sglang_does(fresh: RunningServer) -> None:
    url = fresh.urls[0]
    msgs = conversation("Tubeless or tubes?")
    chat(url, msgs, max_tokens=2)
    assert chat(url, msgs, max_tokens=2)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert requests.get(url + "/flush_cache", timeout=HTTP_TIMEOUT).status_code == 200
    assert chat(url, msgs, max_tokens=2)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_a_returning_turn_finds_the_previous_answer_in_the_cache(fresh: RunningServer,
                                                                 hf_tokenizer: Any) -> None:
    """Answer text tokenizes back to the ids it was made of, so a continuation of a completion
    reuses prompt + answer (all but the last answer token, which has no KV yet)."""
    url = fresh.urls[0]
    prompt = "Tell me about bicycle gears."
    r = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 30, "ignore_eos": True})
    body = r.json()
    text, n_out = body["choices"][0]["text"], body["usage"]["completion_tokens"]
    r2 = post(url, "/v1/completions", {"prompt": prompt + text + " More please.",
                                       "max_tokens": 2})
    p_ids = hf_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == len(p_ids) + n_out - 1


def test_returning_chat_session_reuses_the_prefix_before_the_answer(
        fresh: RunningServer, hf_tokenizer: Any) -> None:
    """Qwen3's template drops earlier reasoning: the cached prefix of turn 2 is the whole turn-1
    prompt (which ends right before the answer's <think>)."""
    url = fresh.urls[0]
    turn1 = conversation("Which saddle for long rides?")
    a = chat(url, turn1, max_tokens=40, ignore_eos=True)
    answer = a["choices"][0]["message"]["content"]
    turn2 = [*turn1, {"role": "assistant", "content": answer},
             {"role": "user", "content": "And for commuting?"}]
    u2 = chat(url, turn2, max_tokens=2)["usage"]
    p1 = hf_chat_ids(hf_tokenizer, turn1)
    p2 = hf_chat_ids(hf_tokenizer, turn2)
    assert a["usage"]["prompt_tokens"] == len(p1)
    assert u2["prompt_tokens_details"]["cached_tokens"] == lcp(p1, p2) == len(p1)


def _stream_in_thread(url: str, body: dict[str, Any], out: dict[str, Any],
                      started: threading.Event) -> threading.Thread:
    def run() -> None:
        try:
            with requests.post(url + "/v1/chat/completions", json=body, stream=True,
                               timeout=HTTP_TIMEOUT) as resp:
                out["status"] = resp.status_code
                events = []
                for ev in sse_events(resp):
                    events.append(ev)
                    started.set()
                out["events"] = events
        finally:
            started.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _finish_reason(events: list[Any]) -> str | None:
    reasons = [e["choices"][0]["finish_reason"] for e in events
               if isinstance(e, dict) and e["choices"] and e["choices"][0]["finish_reason"]]
    return reasons[-1] if reasons else None


def test_flush_refused_while_a_request_runs_then_accepted(fresh: RunningServer) -> None:
    url = fresh.urls[0]
    out: dict[str, Any] = {}
    started = threading.Event()
    body = {"model": MODEL, "messages": conversation("Explain gear ratios."), "stream": True,
            "max_tokens": 600, "ignore_eos": True}
    t = _stream_in_thread(url, body, out, started)
    assert started.wait(20)
    assert len(fresh.replicas[0].sched.running) == 1
    r = post(url, "/flush_cache")
    assert r.status_code == 400
    t.join(30)
    assert not t.is_alive()
    assert out["status"] == 200 and _finish_reason(out["events"]) == "length"
    # the stream has ended: nothing runs, the flush goes through at once
    assert post(url, "/flush_cache").status_code == 200


def test_flush_refused_while_a_request_waits(hf_tokenizer: Any) -> None:
    """A 4,096-token pool: the second long request cannot be admitted beside the first and
    waits; flush is refused until both are gone."""
    with serve_in_thread(config(pool_tokens=4096)) as srv:
        url = srv.urls[0]
        sched = srv.replicas[0].sched
        outs: list[dict[str, Any]] = [{}, {}]
        threads = []
        for i, out in enumerate(outs):
            started = threading.Event()
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"hello {i}"}],
                    "stream": True, "max_tokens": 2500, "ignore_eos": True, "rid": f"long-{i}"}
            threads.append(_stream_in_thread(url, body, out, started))
            if i == 0:
                assert started.wait(20)
        assert wait_for(lambda: len(sched.waiting) == 1 and len(sched.running) == 1, 10)
        assert metrics(url)["sglang:num_queue_reqs"] == 1
        assert post(url, "/flush_cache").status_code == 400
        for i in range(2):
            r = post(url, "/abort_request", {"rid": f"long-{i}"})
            assert r.status_code == 200 and r.json()["aborted"] is True
        for t in threads:
            t.join(30)
            assert not t.is_alive()
        assert [_finish_reason(o["events"]) for o in outs] == ["abort", "abort"]
        # an aborted request's last step may still be in flight: bounded wait
        assert wait_for(lambda: post(url, "/flush_cache").status_code == 200, 5)
