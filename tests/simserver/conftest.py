"""Shared pieces of the simserver tests: specs, servers in a thread, small HTTP helpers."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.data.paths import qwen_tokenizer_dir
from chatfleet.simserver.server import RunningServer, ServerConfig, serve_in_thread

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TIME_SCALE = 20
MODEL = "qwen3-8b"
HTTP_TIMEOUT = 30  # seconds: no request of these tests may hang


def l4_spec(**kw: Any) -> EngineSpec:
    """The reference deployment: Qwen3-8B on an L4, FP8 weights and FP8 KV cache."""
    return EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"), **kw)


def config(**kw: Any) -> ServerConfig:
    spec_kw = {k: kw.pop(k) for k in ("pool_tokens", "thermal", "max_running_requests")
               if k in kw}
    kw.setdefault("time_scale", TIME_SCALE)
    return ServerConfig(spec=l4_spec(**spec_kw), **kw)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    """One L4 FP8/FP8 replica shared by the tests of a module (they do not depend on its state)."""
    with serve_in_thread(config()) as srv:
        yield srv


@pytest.fixture(scope="module")
def url(server: RunningServer) -> str:
    return server.urls[0]


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    """The reference tokenizer, loaded independently of chatfleet's own with transformers."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))


@pytest.fixture(scope="module")
def vocab() -> dict[str, int]:
    return json.loads((qwen_tokenizer_dir() / "vocab.json").read_text(encoding="utf-8"))


def hf_chat_ids(tok: Any, messages: list[dict[str, Any]], **kw: Any) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kw)
    ids = out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out
    return [int(i) for i in ids]


def post(url: str, path: str, body: Any = None, *, data: bytes | None = None,
         timeout: float = HTTP_TIMEOUT) -> requests.Response:
    if data is not None:
        return requests.post(url + path, data=data, timeout=timeout,
                             headers={"Content-Type": "application/json"})
    return requests.post(url + path, json=body, timeout=timeout)


def chat(url: str, messages: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    r = post(url, "/v1/chat/completions", {"model": MODEL, "messages": messages, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics by name (labels dropped: one model per replica)."""
    r = requests.get(url + "/metrics", timeout=HTTP_TIMEOUT)
    assert r.status_code == 200
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[s.name] = s.value
    return out


def sse_events(resp: requests.Response) -> Iterator[dict[str, Any] | str]:
    """The `data:` payloads of a server-sent event stream: dicts, then "[DONE]"."""
    for line in resp.iter_lines():
        if not line or not line.startswith(b"data: "):
            continue
        payload = line[len(b"data: "):]
        if payload == b"[DONE]":
            yield "[DONE]"
            return
        yield json.loads(payload)


def raw_stream_request(url: str, path: str, body: dict[str, Any]) -> socket.socket:
    """Send a POST on a raw socket and return it (the caller reads and closes it)."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=HTTP_TIMEOUT)
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload)
    return sock


def engine_is_idle(srv: RunningServer, i: int = 0) -> bool:
    """The replica holds no request: nothing running, waiting or chunked, no KV owned by a
    request, no locked prefix."""
    sched = srv.replicas[i].sched
    return (not sched.running and not sched.waiting and sched.chunked is None
            and sched.pool.num_request_tokens == 0 and sched.tree.protected_size() == 0
            and not srv.replicas[i].handles)


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
