"""Output length controls: max_tokens, ignore_eos, min_tokens, stop."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from chatfleet.simserver.server import RunningServer, serve_in_thread

from .conftest import HTTP_TIMEOUT, MODEL, config, post, sse_events

pytestmark = pytest.mark.timeout(60)

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


def complete(url: str, **kw: Any) -> dict[str, Any]:
    r = post(url, COMP, {"model": MODEL, "prompt": "Write a story.", **kw})
    assert r.status_code == 200, r.text
    return r.json()


def many(url: str, n: int, **kw: Any) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(n) as ex:
        return list(ex.map(lambda _: complete(url, **kw), range(n)))


def test_max_tokens_is_an_upper_bound(url: str) -> None:
    docs = many(url, 16, max_tokens=60)
    for d in docs:
        n = d["usage"]["completion_tokens"]
        reason = d["choices"][0]["finish_reason"]
        assert 1 <= n <= 60
        assert reason == ("length" if n == 60 else "stop")
        assert len(d["choices"][0]["text"].split()) == n
    # the modelled answers have a 200-token median: most of them reach the cap
    assert sum(d["usage"]["completion_tokens"] == 60 for d in docs) >= 8


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 64])
def test_ignore_eos_gives_exactly_max_tokens(url: str, max_tokens: int) -> None:
    d = complete(url, max_tokens=max_tokens, ignore_eos=True)
    assert d["usage"]["completion_tokens"] == max_tokens
    assert d["choices"][0]["finish_reason"] == "length"
    r = post(url, CHAT, {"messages": [{"role": "user", "content": "hi"}],
                         "max_completion_tokens": max_tokens, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == max_tokens
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_max_completion_tokens_wins_over_max_tokens(url: str) -> None:
    r = post(url, CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
                         "max_completion_tokens": 9, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 9


def test_ignore_eos_streamed_token_count(url: str) -> None:
    with requests.post(url + CHAT, json={
            "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 33,
            "ignore_eos": True}, stream=True, timeout=HTTP_TIMEOUT) as resp:
        events = list(sse_events(resp))
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    token_chunks = [c for c in chunks if c["choices"][0]["finish_reason"] is None]
    assert len(token_chunks) == 33
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.fixture(scope="module")
def seeded() -> Iterator[RunningServer]:
    with serve_in_thread(config(seed=1234)) as srv:
        yield srv


def test_min_tokens_is_respected_without_ignore_eos(seeded: RunningServer) -> None:
    url = seeded.urls[0]
    control = many(url, 24, max_tokens=400)
    short = [d["usage"]["completion_tokens"] for d in control
             if d["usage"]["completion_tokens"] < 250]
    assert short, "the control batch should hold answers shorter than min_tokens"
    docs = many(url, 24, max_tokens=400, min_tokens=250)
    for d in docs:
        n = d["usage"]["completion_tokens"]
        assert 250 <= n <= 400, n
        assert d["choices"][0]["finish_reason"] == ("length" if n == 400 else "stop")
    assert any(d["choices"][0]["finish_reason"] == "stop" for d in docs)


def test_min_tokens_in_chat_counts_reasoning_too(seeded: RunningServer) -> None:
    url = seeded.urls[0]

    def ask(_: int) -> int:
        r = post(url, CHAT, {"messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 300, "min_tokens": 280})
        assert r.status_code == 200, r.text
        return int(r.json()["usage"]["completion_tokens"])

    with ThreadPoolExecutor(8) as ex:
        counts = list(ex.map(ask, range(8)))
    assert all(280 <= n <= 300 for n in counts), counts


def test_min_tokens_equal_to_max_tokens(url: str) -> None:
    d = complete(url, max_tokens=12, min_tokens=12)
    assert d["usage"]["completion_tokens"] == 12


def _answer_with_seed(seed: int, **kw: Any) -> dict[str, Any]:
    with serve_in_thread(config(seed=seed)) as srv:
        return complete(srv.urls[0], **kw)


def _stream_with_seed(seed: int, **kw: Any) -> list[Any]:
    with serve_in_thread(config(seed=seed)) as srv, requests.post(
            srv.urls[0] + COMP, json={"model": MODEL, "prompt": "Write a story.",
                                      "stream": True, **kw},
            stream=True, timeout=HTTP_TIMEOUT) as resp:
        return list(sse_events(resp))


def test_stop_string_ends_the_text_before_it() -> None:
    """The same seed gives the same answer: take a word from the middle of the first answer as
    the stop string of the second."""
    first = _answer_with_seed(77, max_tokens=80, ignore_eos=True)
    text = first["choices"][0]["text"]
    words = text.split(" ")[1:]
    stop = " " + words[40]
    cut = text.index(stop)
    assert cut > 0
    second = _answer_with_seed(77, max_tokens=80, ignore_eos=True, stop=[stop, "\u2603never"])
    got = second["choices"][0]["text"]
    assert got == text[:cut]
    assert stop not in got
    assert second["choices"][0]["finish_reason"] == "stop"
    # the tokens up to and including the one that completed the stop string were generated
    assert second["usage"]["completion_tokens"] == len(got.split()) + 1

    events = _stream_with_seed(77, max_tokens=80, ignore_eos=True, stop=stop)
    chunks = [e for e in events if isinstance(e, dict)]
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    assert streamed == got
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_stop_in_chat_cuts_the_content_not_the_reasoning() -> None:
    msgs = [{"role": "user", "content": "Tell me something."}]

    def ask(**kw: Any) -> dict[str, Any]:
        with serve_in_thread(config(seed=5)) as srv:
            r = post(srv.urls[0], CHAT, {"messages": msgs, "max_tokens": 60, "ignore_eos": True,
                                         **kw})
            assert r.status_code == 200, r.text
            return r.json()

    first = ask()["choices"][0]["message"]
    content = first["content"]
    stop = " " + content.split(" ")[10]
    second = ask(stop=stop)
    msg = second["choices"][0]["message"]
    assert msg["reasoning_content"] == first["reasoning_content"]
    assert msg["content"] == content[: content.index(stop)]
    assert stop not in msg["content"]
    assert second["choices"][0]["finish_reason"] == "stop"


def test_stop_strings_on_a_long_answer_do_not_stall_the_server(url: str) -> None:
    import socket

    from .conftest import raw_stream_request

    t0 = time.monotonic()
    sock = raw_stream_request(url, COMP, {"prompt": "hi", "stream": True, "max_tokens": 40_000,
                                          "ignore_eos": True, "stop": ["zqxj never here"]})
    try:
        sock.settimeout(HTTP_TIMEOUT)
        buf = b""
        while b"data: " not in buf:
            part = sock.recv(65536)
            assert part, buf
            buf += part
        first_chunk_s = time.monotonic() - t0
    finally:
        sock.shutdown(socket.SHUT_RDWR)
        sock.close()
    # modelled TTFT is about 0.15 s / 20 = 8 ms of wall time
    assert first_chunk_s < 0.5, first_chunk_s
