"""The gateway benchmark's fake OpenAI engine (benchmarks/gateway.py runs it as `engine`).

A raw asyncio protocol on uvloop. POST /v1/chat/completions (or /v1/completions, /generate)
with any JSON body streams `chunks` SSE chunks shaped like SGLang's (about 300 bytes), the first
`first_s` after the request, then one every `interval_s` on a fixed per-stream schedule, then
`data: [DONE]`; HTTP/1.1 keep-alive, chunked transfer encoding, one HTTP chunk per SSE event. A
body without `"stream": true` gets one JSON completion. GET /health, /v1/models,
/get_model_info, /get_server_info (any other GET) answer JSON for the peers' health checks and
discovery; GET /stats counts started, completed and aborted streams (an abort is a client gone
before the last chunk).
"""

from __future__ import annotations

import asyncio
import json
import re

HOST = "127.0.0.1"
MODEL = "qwen3-8b"
RELAY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/generate"})
STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")


def take_request(buf: bytes) -> tuple[int, str, str, bool, bytes] | None:
    """One complete HTTP/1.1 request at the start of buf: (end, method, path, close, body)."""
    i = buf.find(b"\r\n\r\n")
    if i < 0:
        return None
    lines = buf[:i].decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    close = False
    for line in lines[1:]:
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "content-length":
            length = int(value)
        elif key == "connection" and value.strip().lower() == "close":
            close = True
        elif key == "transfer-encoding":
            raise ValueError("chunked request bodies are not supported")
    end = i + 4 + length
    if len(buf) < end:
        return None
    return end, method, path.split("?", 1)[0], close, buf[i + 4:end]


def simple_response(status: int, body: bytes, ctype: bytes = b"application/json") -> bytes:
    reason = {200: b"OK", 404: b"Not Found", 411: b"Length Required", 502: b"Bad Gateway"}
    return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
            % (status, reason.get(status, b"X"), ctype, len(body), body))


def sse_chunk(rid: str, content: str, finish: str | None) -> bytes:
    fin = "null" if finish is None else f'"{finish}"'
    data = ('{"id":"' + rid + '","object":"chat.completion.chunk","created":1764460800,'
            '"model":"' + MODEL + '","choices":[{"index":0,"delta":{"role":"assistant",'
            '"content":"' + content + '","reasoning_content":null,"tool_calls":null},'
            '"logprobs":null,"finish_reason":' + fin + ',"matched_stop":null}],"usage":null}')
    event = b"data: " + data.encode() + b"\n\n"
    return b"%x\r\n%s\r\n" % (len(event), event)


DONE_FRAME = b"%x\r\n%s\r\n0\r\n\r\n" % (len(b"data: [DONE]\n\n"), b"data: [DONE]\n\n")
INFO = json.dumps({
    "status": "ok", "object": "list", "model_path": MODEL, "tokenizer_path": MODEL,
    "served_model_name": MODEL, "is_generation": True, "max_context_length": 40960,
    "max_total_num_tokens": 142369, "max_req_input_len": 40000, "tp_size": 1, "dp_size": 1,
    "version": "0.0.0-fake", "weight_version": "default", "model_type": "qwen3",
    "vocab_size": 151936,
    "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "fake",
              "max_model_len": 40960}],
}).encode()


class Engine:
    def __init__(self, chunks: int, interval_s: float, first_s: float) -> None:
        self.chunks, self.interval_s, self.first_s = chunks, interval_s, first_s
        self.started = self.completed = self.aborted = self.nonstream = 0

    def stats(self) -> bytes:
        return json.dumps({"started": self.started, "completed": self.completed,
                           "aborted": self.aborted, "nonstream": self.nonstream}).encode()


class EngineConn(asyncio.Protocol):
    def __init__(self, eng: Engine) -> None:
        self.eng = eng
        self.loop = asyncio.get_running_loop()
        self.buf = b""
        self.active = False
        self.handle: asyncio.TimerHandle | None = None
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.active:
            self.next_request()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
            self.eng.aborted += 1

    def next_request(self) -> None:
        while not self.active and not self.t.is_closing():
            try:
                req = take_request(self.buf)
            except ValueError:
                self.t.write(simple_response(411, b"{}"))
                self.t.close()
                return
            if req is None:
                return
            end, method, path, close, body = req
            self.buf = self.buf[end:]
            self.close_after = close
            if method == "POST" and path in RELAY_PATHS:
                if STREAM_TRUE.search(body):
                    self.start_stream()
                    return
                self.eng.nonstream += 1
                self.t.write(simple_response(200, self.full_completion()))
            elif method == "GET" and path == "/stats":
                self.t.write(simple_response(200, self.eng.stats()))
            elif method == "GET":
                self.t.write(simple_response(200, INFO))
            else:
                self.t.write(simple_response(404, b'{"error":"not found"}'))
            if close:
                self.t.close()

    def full_completion(self) -> bytes:
        return json.dumps({
            "id": "cmpl-0", "object": "chat.completion", "created": 1764460800, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": " tok" * self.eng.chunks}}],
            "usage": {"prompt_tokens": 8, "completion_tokens": self.eng.chunks,
                      "total_tokens": 8 + self.eng.chunks}}).encode()

    def start_stream(self) -> None:
        eng = self.eng
        eng.started += 1
        rid = f"{eng.started:032x}"
        self.frame = sse_chunk(rid, " tok", None)
        self.last = sse_chunk(rid, " tok", "stop") + DONE_FRAME
        self.active = True
        self.i = 0
        self.t.write(SSE_HEAD)
        self.t0 = self.loop.time() + eng.first_s
        self.handle = self.loop.call_at(self.t0, self.tick)

    def tick(self) -> None:
        self.i += 1
        eng = self.eng
        if self.i < eng.chunks:
            self.t.write(self.frame)
            self.handle = self.loop.call_at(self.t0 + self.i * eng.interval_s, self.tick)
            return
        self.t.write(self.last)
        self.handle = None
        self.active = False
        eng.completed += 1
        if self.close_after:
            self.t.close()
        elif self.buf:
            self.next_request()


class _Closer:
    def __init__(self, server: asyncio.Server) -> None:
        self.server = server

    async def close(self) -> None:
        self.server.close()


async def start_engine(port: int, chunks: int, interval_s: float, first_s: float) -> _Closer:
    """The fake engine listening on HOST:port (closed by the returned object's close())."""
    eng = Engine(chunks, interval_s, first_s)
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: EngineConn(eng), HOST, port, backlog=4096)
    return _Closer(srv)
