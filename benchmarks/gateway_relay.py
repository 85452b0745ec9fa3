"""SSE relay overhead: which framework should `chatfleet gateway` relay streams with?

Usage:
    .venv/bin/python benchmarks/gateway_relay.py [--streams 32,256] [--reps 3] [--measure-s 8]
        [--impls aiohttp-uvloop,raw-uvloop,...] [--starlette-python PYTHON]
        [--peer-litellm PYTHON] [--peer-router BIN] [--profile DIR] [--json FILE]
        [--quickack] [--fresh-connections]

Every piece is a separate process started from this one file, all bound to 127.0.0.1:

- `engine`: a fake OpenAI engine (raw asyncio protocol on uvloop). POST /v1/chat/completions
  (or /v1/completions, /generate) with any JSON body streams --chunks SSE chunks shaped like
  SGLang's (about 300 bytes), the first --first-ms after the request, then one every
  --interval-ms on a fixed per-stream schedule, then `data: [DONE]`; HTTP/1.1 keep-alive,
  chunked transfer encoding, one HTTP chunk per SSE event. A body without `"stream": true`
  gets one JSON completion. GET /health, /v1/models, /get_model_info, /get_server_info (any
  other GET) answer JSON for the peers' health checks and discovery; GET /stats counts
  started, completed and aborted streams (an abort is a client gone before the last chunk).
- `relay --impl NAME`: a minimal relay. Each accepts POST /v1/chat/completions, opens a
  streaming upstream request to the engine and writes the bytes to the client as they come,
  never parsing a chunk; a client that disconnects closes the upstream request. NAME is a base
  and a loop, `BASE-uvloop` or `BASE-asyncio`:
    aiohttp          aiohttp web server + aiohttp client (iter_any, re-framed by aiohttp)
    aiohttp-pass     aiohttp web server (request parsing, routing, response head) + the raw
                     upstream protocol below, whose chunk frames go to the client's transport
                     verbatim from data_received (no aiohttp writer or reader per chunk);
                     a closing client transport aborts the upstream request at the next chunk
    raw              hand-written asyncio.Protocol server + hand-written upstream protocol with
                     a keep-alive pool; the upstream's chunked body is passed through verbatim
                     (framing scanned by length to find the end, never copied or decoded)
    rawsrv-aiohttp   the same Protocol server + aiohttp client (iter_any, framed by hand)
    asgi-aiohttp     uvicorn (httptools) running a bare ASGI app + aiohttp client
    starlette-httpx  uvicorn (httptools) + Starlette StreamingResponse + httpx (aiter_raw)
    starlette-aiohttp  uvicorn (httptools) + Starlette StreamingResponse + aiohttp client
  The last three need uvicorn, httptools, starlette and httpx: they run with the interpreter
  given by --starlette-python (a venv under /tmp; the repo's venv has none of them).
- `client`: the load (raw asyncio protocol on uvloop). N users, each on its own keep-alive
  connection, send a request, read the stream to its end and send the next (closed loop, no
  think time). Users start spread evenly over one request's duration (--ramp-s, default
  chunks x interval) so the load is steady rather than in waves. Timestamps are taken in
  data_received; a read that completes k SSE events gives k gaps of (now - previous read) / k
  (docs/metrics.md: a chunk's gap is split over what it carries). TTFT = first event - send time,
  for requests sent inside the window; ITL = gaps of events that arrive inside the window.
  The window starts --warmup-s after the ramp and lasts --measure-s; then sending stops and
  what is in flight may finish for --drain-s (bounded), then every connection is closed.
  At both window edges the client reads utime+stime of the target's process tree and of the
  engine from /proc/PID/stat and the machine's busy time from /proc/stat. Every request
  carries `Authorization: Bearer <a random sk- key>` (LiteLLM's master key; others ignore it).
  --quickack makes the client ACK every read at once (TCP_QUICKACK): a target that writes
  without TCP_NODELAY stalls its first chunk behind the ACK of its response head, which a
  client with Linux's default delayed ACKs (the default here, and what SDK clients do) holds
  for up to about 40 ms. --fresh-connections opens a new connection per request.
- peers: LiteLLM's proxy (`--peer-litellm PYTHON`: a venv with litellm[proxy]; one worker,
  a model `openai/qwen3-8b` whose api_base is the engine) and SGLang's router
  (`--peer-router BIN`: the `sglang-router` entry point of a venv with sglang-router; its router
  is Rust, loaded into that Python process; round_robin policy, one worker = the engine,
  router and metrics bound to 127.0.0.1).

Per run (one target, one stream count): TTFT p50/p99, ITL p50/p99/max, chunks received in the
window against those the engine's cadence offers (delivered share; a target is marked
saturated below 90%, or at a full core for one Python process),
the target's CPU seconds over the window per 1,000 chunks received, the cores it used, the
engine's cores, the client's event-loop lag p99 and the cores used by every other process.
The direct run (the client against the engine) is a target like the others. Each repetition
runs every target once, in an order rotated per repetition; added TTFT = the target's
percentile minus the direct run's of the same repetition. Every target but the one being
measured is stopped (SIGSTOP) during a run, so that an idle peer's background work is not
counted as noise. The table gives the medians over repetitions (and the spread of the added
median TTFT).

Before the load, each target is checked once: a full stream must relay 64 chunks and [DONE],
and 4 streams dropped by the client after 3 chunks must show up as aborted at the engine
within 2 s (disconnect propagation).

A run that does not stand fails loudly (exit status 1, each reason on stderr, the JSON written
with them under "shortfalls"): a target that did not start or died, or any target but
LiteLLM's proxy (MAY_SATURATE: its saturation here is a finding) that delivered less than 90%
of what the engine's cadence offered, or met errors, in any repetition. `chatfleet gateway`
runs with a cap no run reaches (--chatfleet-cap, 2,000) and refuses to start when its
connection limit, from the descriptor limit, is below the largest stream count.

--profile DIR reruns each Python relay for one window at the largest stream count under
cProfile with a CPU-time clock (slower: not for the reported figures) and reports the shares
of its CPU time by package and its top functions; --reps 0 --profile DIR profiles only.

This machine has 2 cores, shared by the engine, the target and the client (and whatever else
runs): figures are noisy and only comparable inside one run of this script.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
HOST = "127.0.0.1"
MODEL = "qwen3-8b"
CHAT_PATH = "/v1/chat/completions"
RELAY_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/generate"})
CLK_TCK = os.sysconf("SC_CLK_TCK")
API_KEY = "sk-" + os.urandom(24).hex()  # LiteLLM refuses to start without a strong master key
STREAM_TRUE = re.compile(rb'"stream"\s*:\s*true')
PY_IMPLS = ("aiohttp", "aiohttp-pass", "raw", "rawsrv-aiohttp")
UVICORN_IMPLS = ("asgi-aiohttp", "starlette-httpx", "starlette-aiohttp")
DEFAULT_IMPLS = tuple(f"{b}-{loop}" for b in PY_IMPLS + UVICORN_IMPLS
                      for loop in ("uvloop", "asyncio"))
CHATFLEET_CAP = 2_000  # above every stream count measured: no run reaches the cap
# targets whose saturation is a finding (they deliver less than offered on this machine); any
# other target that delivers less than SHORT_OF its offer, or meets errors, fails the run
MAY_SATURATE = frozenset({"litellm"})
SHORT_OF = 0.9
SSE_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")


# ---------------------------------------------------------------------------------------------
# small shared pieces


def run_loop(main: Callable[[], Any], use_uvloop: bool) -> None:
    """Run the coroutine function `main` on uvloop or on asyncio's default loop."""
    if use_uvloop:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def split_impl(impl: str) -> tuple[str, bool]:
    base, _, loop = impl.rpartition("-")
    if loop not in ("uvloop", "asyncio") or not base:
        raise SystemExit(f"bad --impl {impl!r}: want BASE-uvloop or BASE-asyncio")
    return base, loop == "uvloop"


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


def proc_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return 0.0
    fields = raw[raw.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_tree(pid: int) -> list[int]:
    """pid and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        ppid = int(raw[raw.rfind(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def machine_busy_s() -> float:
    """Seconds of CPU time the whole machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return (sum(parts[:8]) - idle) / CLK_TCK


def pct(values: list[float] | array, q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not len(values):
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return float(s[k])


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------
# the fake engine


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


async def serve_forever(server_start: Callable[[], Any]) -> None:
    """Start a server and wait for SIGTERM/SIGINT."""
    loop = asyncio.get_running_loop()
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
    server = await server_start()
    print("ready", flush=True)
    await stop
    with contextlib.suppress(Exception):
        await server.close()


def cmd_engine(args: argparse.Namespace) -> None:
    eng = Engine(args.chunks, args.interval_ms / 1000, args.first_ms / 1000)

    async def start() -> Any:
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(lambda: EngineConn(eng), HOST, args.port, backlog=4096)

        class Closer:
            async def close(self) -> None:
                srv.close()

        return Closer()

    run_loop(lambda: serve_forever(start), not args.no_uvloop)


# ---------------------------------------------------------------------------------------------
# relays: hand-written protocol server (raw, rawsrv-aiohttp)


class PassSink:
    """Stands in for RawDown under an aiohttp handler: aiohttp parses the request and writes
    the response head; the upstream's chunk frames then go to the client's transport verbatim
    (the upstream's own `0\\r\\n\\r\\n` included, so aiohttp's writer must not add one)."""

    def __init__(self, transport: Any) -> None:
        loop = asyncio.get_running_loop()
        self.real = transport
        self.t = self
        self.early: list[bytes] = []
        self.started = False
        self.up: RawUp | None = None
        self.head: asyncio.Future[tuple[int, int | None]] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()

    def on_head(self, status: int, length: int | None) -> None:
        if not self.head.done():
            self.head.set_result((status, length))

    def write(self, data: bytes) -> None:
        if not self.started:
            self.early.append(data)
        elif self.real.is_closing():  # the client is gone: drop the upstream request now
            self.abort()
            up = self.up
            if up is not None:
                up.down = None
                up.closed = True
                up.t.abort()
        else:
            self.real.write(data)

    def start(self) -> None:
        self.started = True
        if self.early:
            self.real.write(b"".join(self.early))
            self.early = []

    def done(self) -> None:
        if not self.head.done():
            self.head.set_exception(ConnectionError("upstream closed before its head"))
        if not self.finished.done():
            self.finished.set_result(None)

    def abort(self) -> None:
        for fut in (self.head, self.finished):
            if not fut.done():
                fut.set_exception(ConnectionError("upstream closed mid-stream"))


async def start_aiohttp_pass(port: int, upstream: str) -> Any:
    from aiohttp import web

    host, uport = upstream.rsplit(":", 1)
    pool = UpPool(host, int(uport))
    host_header = upstream.encode()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        up = await pool.get()
        sink = PassSink(request.transport)
        up.bind(sink)  # type: ignore[arg-type]
        up.t.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s"
                   % (request.path.encode(), host_header, len(body), body))
        try:
            status, length = await sink.head
            resp = web.StreamResponse(status=status, headers={
                "Content-Type": "text/event-stream" if length is None else "application/json",
                "Cache-Control": "no-cache"})
            if length is None:
                resp.enable_chunked_encoding()
            else:
                resp.content_length = length
            await resp.prepare(request)
            sink.start()
            await sink.finished
            if length is None:
                resp._payload_writer.chunked = False  # type: ignore[union-attr]
            await resp.write_eof()
            return resp
        finally:
            if not sink.finished.done() or sink.finished.exception() is not None:
                if up.down is sink:
                    up.down = None
                up.closed = True
                up.t.abort()

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    for path in sorted(RELAY_PATHS):
        app.router.add_post(path, relay)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, HOST, port, backlog=4096).start()

    class Closer:
        async def close(self) -> None:
            await runner.cleanup()

    return Closer()


class UpPool:
    """Idle keep-alive connections to the upstream, for the raw relay."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.idle: list[RawUp] = []

    async def get(self) -> RawUp:
        while self.idle:
            up = self.idle.pop()
            if not up.closed:
                return up
        loop = asyncio.get_running_loop()
        _, up = await loop.create_connection(lambda: RawUp(self), self.host, self.port)
        return up


class RawUp(asyncio.Protocol):
    """Upstream side of the raw relay: passes the chunked body through verbatim."""

    def __init__(self, pool: UpPool) -> None:
        self.pool = pool
        self.closed = False
        self.down: RawDown | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]

    def bind(self, down: RawDown) -> None:
        self.down = down
        down.up = self
        self.head = b""
        self.in_body = False
        self.skip = 0  # bytes of the current chunk (payload + CRLF) still to pass
        self.pending = b""  # a chunk-size line cut by a read
        self.final = False

    def data_received(self, data: bytes) -> None:
        down = self.down
        if down is None:
            return
        if self.in_body:
            down.t.write(data)
            self.scan(data)
            return
        self.head += data
        i = self.head.find(b"\r\n\r\n")
        if i < 0:
            return
        head, rest = self.head[:i], self.head[i + 4:]
        self.head = b""
        self.in_body = True
        status = int(head[9:12])
        lower = head.lower()
        length: int | None = None
        if b"transfer-encoding: chunked" not in lower:
            m = re.search(rb"content-length:\s*(\d+)", lower)
            length = int(m.group(1)) if m else 0
        down.on_head(status, length)
        if length is not None:
            self.skip, self.final = length, True
            if length == 0:
                self.finish()
                return
        if rest:
            down.t.write(rest)
            self.scan(rest)

    def scan(self, data: bytes) -> None:
        """Follow the chunked framing by length to find the response's end."""
        if self.pending:
            data = self.pending + data
            self.pending = b""
        pos, n = 0, len(data)
        while pos < n:
            if self.skip:
                take = min(self.skip, n - pos)
                self.skip -= take
                pos += take
                if not self.skip and self.final:
                    self.finish()
                    return
                continue
            j = data.find(b"\r\n", pos)
            if j < 0:
                self.pending = data[pos:]
                return
            size = int(data[pos:j].split(b";", 1)[0], 16)
            pos = j + 2
            self.skip = size + 2
            self.final = size == 0

    def finish(self) -> None:
        down = self.down
        self.down = None
        self.in_body = False
        if down is not None:
            down.up = None
            self.pool.idle.append(self)
            down.done()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        down = self.down
        self.down = None
        if down is None:
            return
        down.up = None
        if self.in_body:
            down.t.abort()
        else:
            down.t.write(simple_response(502, b'{"error":"upstream closed"}'))
            down.done()


class RawDown(asyncio.Protocol):
    """Client side of the hand-written relay server."""

    def on_head(self, status: int, length: int | None) -> None:
        if length is None:
            self.t.write(SSE_HEAD if status == 200 else
                         b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n" % status)
        else:
            self.t.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % (status, length))

    def __init__(self, relay: RawRelay) -> None:
        self.relay = relay
        self.buf = b""
        self.busy = False
        self.closed = False
        self.up: RawUp | None = None
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self.next_request()

    def next_request(self) -> None:
        while not self.busy and not self.closed:
            try:
                req = take_request(self.buf)
            except ValueError:
                self.t.write(simple_response(411, b"{}"))
                self.t.close()
                return
            if req is None:
                return
            end, method, path, _close, body = req
            self.buf = self.buf[end:]
            if method == "POST" and path in RELAY_PATHS:
                self.busy = True
                self.task = asyncio.get_running_loop().create_task(
                    self.relay.stream(self, path, body))
            elif method == "GET":
                self.t.write(simple_response(200, b'{"status":"ok"}'))
            else:
                self.t.write(simple_response(404, b"{}"))

    def done(self) -> None:
        self.busy = False
        self.task = None
        if self.buf:
            self.next_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        up = self.up
        if up is not None:
            self.up = None
            up.down = None
            up.closed = True
            up.t.abort()
        if self.task is not None:
            self.task.cancel()

    def pause_writing(self) -> None:
        if self.up is not None:
            self.up.t.pause_reading()

    def resume_writing(self) -> None:
        if self.up is not None:
            self.up.t.resume_reading()


class RawRelay:
    def __init__(self, upstream: str, aiohttp_client: bool) -> None:
        host, port = upstream.rsplit(":", 1)
        self.pool = UpPool(host, int(port))
        self.host_header = upstream.encode()
        self.base = f"http://{upstream}"
        self.session: Any = None
        self.stream = self.stream_aiohttp if aiohttp_client else self.stream_raw

    async def stream_raw(self, down: RawDown, path: str, body: bytes) -> None:
        up = await self.pool.get()
        if down.closed:
            self.pool.idle.append(up)
            return
        up.bind(down)
        down.task = None
        up.t.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s"
                   % (path.encode(), self.host_header, len(body), body))

    async def stream_aiohttp(self, down: RawDown, path: str, body: bytes) -> None:
        resp = await self.session.post(self.base + path, data=body,
                                       headers={"Content-Type": "application/json"})
        ok = False
        try:
            write = down.t.write
            write(SSE_HEAD if resp.status == 200 else
                  b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n" % resp.status)
            async for data in resp.content.iter_any():
                if down.closed:
                    return
                write(b"%x\r\n%s\r\n" % (len(data), data))
            write(b"0\r\n\r\n")
            ok = True
        finally:
            if ok:
                resp.release()
                down.done()
            else:
                resp.close()


def aiohttp_session() -> Any:
    import aiohttp

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
        timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False)


async def start_raw(port: int, upstream: str, aiohttp_client: bool) -> Any:
    relay = RawRelay(upstream, aiohttp_client)
    if aiohttp_client:
        relay.session = aiohttp_session()
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(lambda: RawDown(relay), HOST, port, backlog=4096)

    class Closer:
        async def close(self) -> None:
            srv.close()
            if relay.session is not None:
                await relay.session.close()

    return Closer()


# ---------------------------------------------------------------------------------------------
# relays: aiohttp server


async def start_aiohttp(port: int, upstream: str) -> Any:
    from aiohttp import web

    session = aiohttp_session()
    base = f"http://{upstream}"

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        up = await session.post(base + request.path, data=body,
                                headers={"Content-Type": "application/json"})
        ok = False
        try:
            resp = web.StreamResponse(status=up.status, headers={
                "Content-Type": up.headers.get("Content-Type", "text/event-stream"),
                "Cache-Control": "no-cache"})
            await resp.prepare(request)
            async for data in up.content.iter_any():
                await resp.write(data)
            await resp.write_eof()
            ok = True
            return resp
        finally:
            if ok:
                up.release()
            else:
                up.close()

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    for path in sorted(RELAY_PATHS):
        app.router.add_post(path, relay)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, HOST, port, backlog=4096).start()

    class Closer:
        async def close(self) -> None:
            await runner.cleanup()
            await session.close()

    return Closer()


# ---------------------------------------------------------------------------------------------
# relays: uvicorn (httptools) with a bare ASGI app or Starlette


def asgi_aiohttp_app(upstream: str) -> Any:
    base = f"http://{upstream}"
    state: dict[str, Any] = {}

    async def relay(send: Any, path: str, body: bytes) -> None:
        if "session" not in state:
            state["session"] = aiohttp_session()
        up = await state["session"].post(base + path, data=body,
                                         headers={"Content-Type": "application/json"})
        ok = False
        try:
            await send({"type": "http.response.start", "status": up.status,
                        "headers": [(b"content-type", b"text/event-stream"),
                                    (b"cache-control", b"no-cache")]})
            async for data in up.content.iter_any():
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            ok = True
        finally:
            if ok:
                up.release()
            else:
                up.close()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    if "session" in state:
                        await state["session"].close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b'{"status":"ok"}'})
            return
        body = b""
        more = True
        while more:
            msg = await receive()
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        # the relay runs in a task that a disconnect cancels (what Starlette does for ASGI < 2.4:
        # uvicorn's send() returns silently once the client is gone)
        task = asyncio.ensure_future(relay(send, scope["path"], body))
        watch = asyncio.ensure_future(receive())
        try:
            await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, watch):
                if not t.done():
                    t.cancel()
            await asyncio.gather(task, watch, return_exceptions=True)

    return app


def starlette_app(upstream: str, client: str) -> Any:
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    base = f"http://{upstream}"
    state: dict[str, Any] = {}

    async def relay_httpx(request: Any) -> Any:
        import httpx

        if "client" not in state:
            state["client"] = httpx.AsyncClient(
                timeout=None, limits=httpx.Limits(max_connections=None,
                                                  max_keepalive_connections=4096))
        body = await request.body()
        req = state["client"].build_request("POST", base + request.url.path, content=body,
                                            headers={"content-type": "application/json"})
        up = await state["client"].send(req, stream=True)

        async def gen() -> Any:
            try:
                async for data in up.aiter_raw():
                    yield data
            finally:
                await up.aclose()

        return StreamingResponse(gen(), status_code=up.status_code,
                                 media_type="text/event-stream")

    async def relay_aiohttp(request: Any) -> Any:
        if "session" not in state:
            state["session"] = aiohttp_session()
        body = await request.body()
        up = await state["session"].post(base + request.url.path, data=body,
                                         headers={"Content-Type": "application/json"})

        async def gen() -> Any:
            ok = False
            try:
                async for data in up.content.iter_any():
                    yield data
                ok = True
            finally:
                if ok:
                    up.release()
                else:
                    up.close()

        return StreamingResponse(gen(), status_code=up.status,
                                 media_type="text/event-stream")

    async def health(request: Any) -> Any:
        return JSONResponse({"status": "ok"})

    relay = relay_httpx if client == "httpx" else relay_aiohttp
    routes = [Route(p, relay, methods=["POST"]) for p in sorted(RELAY_PATHS)]
    return Starlette(routes=[*routes, Route("/health", health)])


def run_uvicorn(base: str, port: int, upstream: str, use_uvloop: bool) -> None:
    import uvicorn

    if base == "asgi-aiohttp":
        app = asgi_aiohttp_app(upstream)
    else:
        app = starlette_app(upstream, base.split("-", 1)[1])
    config = uvicorn.Config(app, host=HOST, port=port, loop="uvloop" if use_uvloop else "asyncio",
                            http="httptools", access_log=False, log_level="warning",
                            backlog=4096, timeout_keep_alive=60, lifespan="auto")
    server = uvicorn.Server(config)
    print("ready-soon", flush=True)
    server.run()


def cmd_chatfleet(args: argparse.Namespace) -> None:
    """`chatfleet gateway` in front of the engine, as `chatfleet gateway --replica URL` runs
    it (uvloop, default configuration, the soft descriptor limit raised to the hard one), with
    a cap no run reaches (--cap, above the largest stream count) and no queue. It refuses to
    start when its connection limit is below --min-connections: a gateway that turns clients
    away measures its refusals, not its relay."""
    import uvloop

    from chatfleet.gateway.app import Gateway
    from chatfleet.gateway.config import GatewayConfig, Overrides
    from chatfleet.gateway.connections import check_room, connection_limit, raise_descriptor_limit
    from chatfleet.gateway.server import start

    cfg = Overrides((f"http://{args.upstream}",), cap=args.cap, queue_depth=0).apply(
        GatewayConfig())
    fd_limit = raise_descriptor_limit()
    check_room(cfg, fd_limit)
    limit = connection_limit(cfg, fd_limit)
    if limit < args.min_connections or args.cap < args.min_connections:
        raise SystemExit(f"chatfleet gateway: connection limit {limit}, cap {args.cap}: below "
                         f"the {args.min_connections} streams of the run")
    print(f"connection limit {limit} (descriptor limit {fd_limit}), cap {args.cap}", flush=True)
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile(time.process_time)
        prof.enable()
    try:
        uvloop.run(serve_forever(lambda: start(Gateway(cfg), HOST, args.port)))
    finally:
        if prof is not None:
            prof.disable()
            prof.dump_stats(args.profile)


def cmd_relay(args: argparse.Namespace) -> None:
    base, use_uvloop = split_impl(args.impl)
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile(time.process_time)  # CPU time: idle waits cost nothing
        prof.enable()
    try:
        if base in UVICORN_IMPLS:
            with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises SIGINT after exit
                run_uvicorn(base, args.port, args.upstream, use_uvloop)
        elif base == "aiohttp-pass":
            run_loop(lambda: serve_forever(lambda: start_aiohttp_pass(args.port, args.upstream)),
                     use_uvloop)
        elif base == "aiohttp":
            run_loop(lambda: serve_forever(lambda: start_aiohttp(args.port, args.upstream)),
                     use_uvloop)
        elif base in ("raw", "rawsrv-aiohttp"):
            run_loop(lambda: serve_forever(
                lambda: start_raw(args.port, args.upstream, base == "rawsrv-aiohttp")),
                use_uvloop)
        else:
            raise SystemExit(f"unknown relay {base!r}")
    finally:
        if prof is not None:
            prof.disable()
            prof.dump_stats(args.profile)


# ---------------------------------------------------------------------------------------------
# the load client


class Window:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.itl = array("d")  # per-event gaps (s) of events that arrived inside the window
        self.chunks = 0
        self.ttft: list[float] = []  # s, requests sent inside the window
        self.sent = 0
        self.no_first = 0
        self.errors = 0
        self.done = 0
        self.events_per_request: list[int] = []


class ClientConn(asyncio.Protocol):
    """One user's keep-alive connection: parses the head, the chunked body and SSE events."""

    def __init__(self, win: Window, quickack: bool) -> None:
        self.win = win
        self.closed = False
        self.quickack = quickack
        self.fut: asyncio.Future[bool] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]
        self.sock = transport.get_extra_info("socket")
        if self.quickack:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)

    def request(self, raw: bytes) -> asyncio.Future[bool]:
        self.fut = asyncio.get_running_loop().create_future()
        self.head = b""
        self.in_body = False
        self.chunked = True
        self.left = -1  # content-length bytes left (not chunked)
        self.cbuf = b""  # undecoded chunked bytes
        self.sse = b""  # decoded SSE text not yet ending in a blank line
        self.events = 0
        self.first: float | None = None
        self.prev = 0.0
        self.sent_at = time.monotonic()
        self.t.write(raw)
        return self.fut

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if self.quickack:  # Linux clears it after a while: ACK every read at once
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        if self.fut is None or self.fut.done():
            return
        if not self.in_body:
            self.head += data
            i = self.head.find(b"\r\n\r\n")
            if i < 0:
                return
            head, data = self.head[:i].lower(), self.head[i + 4:]
            self.head = b""
            self.in_body = True
            if head[9:12] != b"200":
                self.finish(False)
                self.t.close()
                return
            self.chunked = b"transfer-encoding: chunked" in head
            if not self.chunked:
                m = re.search(rb"content-length:\s*(\d+)", head)
                self.left = int(m.group(1)) if m else -1
        if self.chunked:
            payload, end = self.dechunk(data)
        else:
            payload = data
            if self.left >= 0:
                self.left -= len(data)
            end = self.left == 0
        if payload:
            self.sse_events(payload, now)
        if end:
            self.finish(True)

    def dechunk(self, data: bytes) -> tuple[bytes, bool]:
        buf = self.cbuf + data if self.cbuf else data
        out: list[bytes] = []
        pos, n = 0, len(buf)
        while True:
            j = buf.find(b"\r\n", pos)
            if j < 0:
                break
            size = int(buf[pos:j].split(b";", 1)[0], 16)
            if size == 0:
                if n >= j + 4:
                    self.cbuf = b""
                    return b"".join(out), True
                break
            if n < j + 2 + size + 2:
                break
            out.append(buf[j + 2:j + 2 + size])
            pos = j + 2 + size + 2
        self.cbuf = buf[pos:]
        return b"".join(out), False

    def sse_events(self, payload: bytes, now: float) -> None:
        text = self.sse + payload if self.sse else payload
        k = 0
        pos = 0
        while True:
            j = text.find(b"\n\n", pos)
            j2 = text.find(b"\r\n\r\n", pos)
            if j2 >= 0 and (j < 0 or j2 < j):
                end, nxt = j2, j2 + 4
            elif j >= 0:
                end, nxt = j, j + 2
            else:
                break
            event = text[pos:end]
            pos = nxt
            if event.startswith(b"data:") and b"[DONE]" not in event[:14]:
                k += 1
        self.sse = text[pos:]
        if not k:
            return
        win = self.win
        self.events += k
        inside = win.start <= now <= win.end
        if self.first is None:
            self.first = now
            if inside:
                win.chunks += k
                win.itl.extend([0.0] * (k - 1))
        else:
            if inside:
                win.chunks += k
                gap = (now - self.prev) / k
                win.itl.extend([gap] * k)
        self.prev = now

    def finish(self, ok: bool) -> None:
        fut = self.fut
        if fut is not None and not fut.done():
            fut.set_result(ok)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.finish(False)


async def client_main(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    n = args.streams
    ramp = args.ramp_s if args.ramp_s is not None else args.chunks * args.interval_ms / 1000
    t0 = time.monotonic() + 0.2
    win = Window(t0 + ramp + args.warmup_s, t0 + ramp + args.warmup_s + args.measure_s)
    drain_until = win.end + args.drain_s
    host, port = args.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    path = "/" + args.url.split("//", 1)[1].split("/", 1)[1]
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": args.chunks,
                       "messages": [{"role": "user", "content": "Say tok " * 8}]}).encode()
    raw = (b"POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
           b"Accept: text/event-stream\r\nAuthorization: Bearer %s\r\n"
           b"Content-Length: %d\r\n\r\n%s"
           % (path.encode(), host.encode(), port.encode(), args.api_key.encode(), len(body),
              body))
    conns: list[ClientConn] = []
    max_requests = args.max_requests
    quickack = args.quickack

    async def user(i: int) -> None:
        await asyncio.sleep(max(0.0, t0 + i * ramp / n - time.monotonic()))
        conn: ClientConn | None = None
        while time.monotonic() < win.end and win.done + win.errors < max_requests:
            if conn is None or conn.closed:
                try:
                    _, conn = await loop.create_connection(lambda: ClientConn(win, quickack), host,
                                                           int(port))
                except OSError:
                    win.errors += 1
                    await asyncio.sleep(0.05)
                    continue
                conns.append(conn)
            fut = conn.request(raw)
            in_window = win.start <= conn.sent_at <= win.end
            if in_window:
                win.sent += 1
            try:
                ok = await asyncio.wait_for(fut, max(0.01, drain_until - time.monotonic()))
            except TimeoutError:
                ok = False
            if conn.first is not None and in_window:
                win.ttft.append(conn.first - conn.sent_at)
            elif in_window:
                win.no_first += 1
            if ok:
                win.done += 1
                if in_window:
                    win.events_per_request.append(conn.events)
                if args.fresh_connections:
                    conn.t.close()
                    conn = None
            else:
                win.errors += 1
                conn.t.abort()
                conn = None
                await asyncio.sleep(0.01)
        if conn is not None:
            conn.t.close()

    lags: list[float] = []

    async def lag_probe() -> None:
        while time.monotonic() < drain_until:
            t = time.monotonic()
            await asyncio.sleep(0.005)
            lat = time.monotonic() - t - 0.005
            if win.start <= t <= win.end:
                lags.append(lat)

    watch = {label: int(pid) for label, pid in (x.split("=") for x in args.cpu_pid)}
    cpu0: dict[str, float] = {}
    cpu1: dict[str, float] = {}
    trees: dict[str, list[int]] = {}

    async def sample_cpu() -> None:
        await asyncio.sleep(max(0.0, win.start - time.monotonic()))
        for label, pid in watch.items():
            trees[label] = proc_tree(pid)
        trees["client"] = [os.getpid()]
        cpu0.update({k: sum(proc_cpu_s(p) for p in v) for k, v in trees.items()})
        cpu0["_machine"] = machine_busy_s()
        cpu0["_t"] = time.monotonic()
        await asyncio.sleep(max(0.0, win.end - time.monotonic()))
        cpu1.update({k: sum(proc_cpu_s(p) for p in v) for k, v in trees.items()})
        cpu1["_machine"] = machine_busy_s()
        cpu1["_t"] = time.monotonic()

    sampler = asyncio.ensure_future(sample_cpu())
    probe = asyncio.ensure_future(lag_probe())
    users = [asyncio.ensure_future(user(i)) for i in range(n)]
    await asyncio.wait(users, timeout=max(0.0, drain_until - time.monotonic()) + 1.0)
    cut = sum(1 for u in users if not u.done())
    for u in users:
        u.cancel()
    for c in conns:
        if not c.closed:
            c.t.abort()
    await asyncio.gather(*users, return_exceptions=True)
    await sampler
    probe.cancel()
    window_s = cpu1["_t"] - cpu0["_t"]
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu0 if not k.startswith("_")}
    machine = cpu1["_machine"] - cpu0["_machine"]
    itl_ms = [g * 1000 for g in win.itl]
    offered = n * args.measure_s / (args.interval_ms / 1000)
    return {
        "streams": n, "window_s": window_s, "requests_sent": win.sent,
        "requests_done": win.done, "errors": win.errors, "no_first_token": win.no_first,
        "cut_at_drain": cut,
        "ttft_ms": [x * 1000 for x in win.ttft],
        "ttft_p50_ms": pct([x * 1000 for x in win.ttft], 50),
        "ttft_p99_ms": pct([x * 1000 for x in win.ttft], 99),
        "itl_n": len(itl_ms), "itl_p50_ms": pct(itl_ms, 50), "itl_p99_ms": pct(itl_ms, 99),
        "itl_max_ms": max(itl_ms) if itl_ms else float("nan"),
        "chunks": win.chunks, "chunks_offered": offered,
        "delivered": win.chunks / offered if offered else float("nan"),
        "events_per_request": (statistics.mean(win.events_per_request)
                               if win.events_per_request else float("nan")),
        "cpu_s": cpu, "cores": {k: v / window_s for k, v in cpu.items()},
        "others_cores": (machine - sum(cpu.values())) / window_s,
        "loop_lag_p99_ms": pct([x * 1000 for x in lags], 99),
    }


def cmd_client(args: argparse.Namespace) -> None:
    out: dict[str, Any] = {}

    async def main() -> None:
        out.update(await client_main(args))

    run_loop(main, True)
    Path(args.out).write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------
# the orchestrator


class Proc:
    """A child process in its own session, stopped by its own id."""

    def __init__(self, name: str, argv: list[str], log: Path,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.fh = open(log, "ab")  # noqa: SIM115 (kept open for the child's lifetime)
        self.p = subprocess.Popen(argv, stdout=self.fh, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True,
                                  env={**os.environ, **(env or {})})

    @property
    def pid(self) -> int:
        return self.p.pid

    def alive(self) -> bool:
        return self.p.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, sig)

    def stop(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.p.pid, signal.SIGCONT)
                os.killpg(self.p.pid, signal.SIGINT)
            try:
                self.p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(timeout=5)
        self.fh.close()

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def http_get(port: int, path: str, timeout: float = 2.0) -> bytes:
    with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
        return bytes(r.read())


def raw_stream(port: int, keep_events: int | None, timeout: float) -> tuple[int, bool]:
    """POST one streaming chat request; read `keep_events` events then hang up (None: all).
    Returns (data events seen, [DONE] seen)."""
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 64,
                       "messages": [{"role": "user", "content": "hello"}]}).encode()
    req = (b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
           b"Authorization: Bearer %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
           % (CHAT_PATH.encode(), HOST.encode(), port, API_KEY.encode(), len(body), body))
    got = b""
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(req)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            data = s.recv(65536)
            if not data:
                break
            got += data
            events = got.count(b"data:") - got.count(b"[DONE]")
            if keep_events is not None and events >= keep_events:
                return events, False
            if b"[DONE]" in got and got.endswith(b"\r\n\r\n"):
                break
    return got.count(b"data:") - got.count(b"[DONE]"), b"[DONE]" in got


def wait_ready(port: int, proc: Proc, timeout: float) -> str | None:
    """None when one full stream goes through, else the last error."""
    deadline = time.monotonic() + timeout
    err = "not tried"
    while time.monotonic() < deadline:
        if not proc.alive():
            return f"exited with {proc.p.returncode}: {proc.tail()}"
        try:
            events, done = raw_stream(port, None, 10.0)
            if events >= 1 and done:
                return None
            err = f"stream ended after {events} events, [DONE]={done}"
        except OSError as e:
            err = f"{type(e).__name__}: {e}"
        time.sleep(0.5)
    return f"not ready after {timeout:.0f} s: {err}"


def abort_check(port: int, engine_port: int, streams: int = 4) -> dict[str, Any]:
    """Drop `streams` streams after 3 events each; how many does the engine see aborted?"""
    before = json.loads(http_get(engine_port, "/stats"))
    t = time.monotonic()
    for _ in range(streams):
        with contextlib.suppress(OSError):
            raw_stream(port, 3, 5.0)
    seen, waited = 0, 0.0
    while time.monotonic() - t < 2.0 + 5.0 * streams:
        seen = json.loads(http_get(engine_port, "/stats"))["aborted"] - before["aborted"]
        waited = time.monotonic() - t
        if seen >= streams:
            break
        time.sleep(0.05)
    return {"dropped": streams, "aborted_at_engine": seen, "within_s": round(waited, 2)}


def litellm_config(workdir: Path, engine_port: int) -> Path:
    cfg = workdir / "litellm.yaml"
    cfg.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: http://{HOST}:{engine_port}/v1\n"
        "      api_key: fake-key\n"
        "general_settings:\n"
        f"  master_key: {API_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "  drop_params: true\n"
        "  set_verbose: false\n")
    return cfg


def target_argv(name: str, port: int, engine_port: int, args: argparse.Namespace,
                workdir: Path) -> tuple[list[str], dict[str, str]]:
    upstream = f"{HOST}:{engine_port}"
    if name == "litellm":
        cfg = litellm_config(workdir, engine_port)
        code = "import sys; from litellm import run_server; sys.exit(run_server())"
        return ([args.peer_litellm, "-c", code, "--config", str(cfg), "--host", HOST,
                 "--port", str(port), "--num_workers", "1"],
                {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
                 "LITELLM_TELEMETRY": "False", "NO_DOCS": "True", "NO_REDOC": "True",
                 "DISABLE_ADMIN_UI": "True"})
    if name == "sglang-router":
        return ([args.peer_router, "launch", "--host", HOST, "--port", str(port),
                 "--worker-urls", f"http://{upstream}", "--policy", "round_robin",
                 "--prometheus-host", HOST, "--prometheus-port", str(free_port()),
                 "--log-level", "warn"], {})
    if name == "chatfleet":
        most = max(int(x) for x in args.streams.split(","))
        return ([sys.executable, str(SCRIPT), "chatfleet-gateway", "--port", str(port),
                 "--upstream", upstream, "--cap", str(args.chatfleet_cap),
                 "--min-connections", str(most)], {})
    python = args.starlette_python if split_impl(name)[0] in UVICORN_IMPLS else sys.executable
    argv = [python, str(SCRIPT), "relay", "--impl", name, "--port", str(port),
            "--upstream", upstream]
    return argv, {}


def run_client(url: str, n: int, args: argparse.Namespace, pids: dict[str, int],
               workdir: Path, tag: str) -> dict[str, Any]:
    out = workdir / f"client-{tag}.json"
    argv = [sys.executable, str(SCRIPT), "client", "--url", url, "--streams", str(n),
            "--warmup-s", str(args.warmup_s), "--measure-s", str(args.measure_s),
            "--drain-s", str(args.drain_s), "--chunks", str(args.chunks),
            "--interval-ms", str(args.interval_ms), "--out", str(out),
            "--max-requests", str(args.max_requests), "--api-key", API_KEY]
    if args.fresh_connections:
        argv.append("--fresh-connections")
    if args.quickack:
        argv.append("--quickack")
    if args.ramp_s is not None:
        argv += ["--ramp-s", str(args.ramp_s)]
    for label, pid in pids.items():
        argv += ["--cpu-pid", f"{label}={pid}"]
    ramp = args.ramp_s if args.ramp_s is not None else args.chunks * args.interval_ms / 1000
    limit = ramp + args.warmup_s + args.measure_s + args.drain_s + 30
    with open(workdir / "client.log", "ab") as log:
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=limit, check=True)
    res: dict[str, Any] = json.loads(out.read_text())
    out.unlink()
    return res


def summarize(runs: list[dict[str, Any]], direct: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repetitions; added TTFT against the direct run of the same repetition."""
    def med(key: str, src: list[dict[str, Any]] | None = None) -> float:
        vals = [r[key] for r in (src or runs) if r.get(key) == r.get(key)]
        return statistics.median(vals) if vals else float("nan")

    added50 = [r["ttft_p50_ms"] - d["ttft_p50_ms"] for r, d in zip(runs, direct, strict=True)]
    added99 = [r["ttft_p99_ms"] - d["ttft_p99_ms"] for r, d in zip(runs, direct, strict=True)]
    cpu_k = [r["cpu_s"]["target"] / r["chunks"] * 1000 if r["chunks"] else float("nan")
             for r in runs]
    return {
        "reps": len(runs),
        "ttft_p50_ms": med("ttft_p50_ms"), "ttft_p99_ms": med("ttft_p99_ms"),
        "added_ttft_p50_ms": statistics.median(added50),
        "added_ttft_p50_ms_range": [min(added50), max(added50)],
        "added_ttft_p99_ms": statistics.median(added99),
        "added_ttft_p99_ms_range": [min(added99), max(added99)],
        "itl_p50_ms": med("itl_p50_ms"), "itl_p99_ms": med("itl_p99_ms"),
        "itl_max_ms": med("itl_max_ms"),
        "cpu_s_per_1k_chunks": statistics.median(cpu_k),
        "cpu_s_per_1k_chunks_range": [min(cpu_k), max(cpu_k)],
        "target_cores": statistics.median(r["cores"]["target"] for r in runs),
        "engine_cores": statistics.median(r["cores"]["engine"] for r in runs),
        "client_cores": statistics.median(r["cores"]["client"] for r in runs),
        "others_cores": statistics.median(r["others_cores"] for r in runs),
        "delivered": med("delivered"), "events_per_request": med("events_per_request"),
        "loop_lag_p99_ms": med("loop_lag_p99_ms"),
        "requests_per_rep": med("requests_sent"),
        "errors": sum(r["errors"] for r in runs),
        "no_first_token": sum(r["no_first_token"] for r in runs),
    }


PROFILE_BUCKETS = (
    ("chatfleet: the pass-through (upstream.py)", ("chatfleet/gateway/upstream.py",)),
    ("chatfleet: histogram updates (metrics.py)",
     ("chatfleet/gateway/metrics.py",)),
    ("chatfleet: per request (app, relay, fleet, config, errors)", ("chatfleet/gateway/",)),
    ("chatfleet core (admission, routing, prompt)", ("chatfleet/core/",)),
    ("aiohttp server", ("aiohttp/web_", "aiohttp/http_writer", "aiohttp/base_protocol",
                        "aiohttp/_http_writer", "aiohttp/abc")),
    ("aiohttp client", ("aiohttp/",)),
    ("httpx/httpcore/h11", ("httpx/", "httpcore/", "h11/")),
    ("starlette", ("starlette/",)),
    ("uvicorn", ("uvicorn/",)),
    ("anyio", ("anyio/",)),
    ("uvloop internals (C: epoll, socket I/O, callbacks)", ("asyncio/runners.py",)),
    ("asyncio (Python: tasks, futures, selector loop)", ("asyncio/", "selectors.py")),
    ("the relay's own code", ("gateway_relay.py",)),
)


def profile_bucket(file: str, func: str) -> str:
    if file == "~":
        if "epoll" in func or "select" in func:
            return "epoll (C)"
        if "send" in func or "recv" in func:
            return "socket send/recv (C)"
        return "other C builtins"
    return next((name for name, keys in PROFILE_BUCKETS if any(k in file for k in keys)),
                "other Python")


def profile_summary(path: Path, top: int = 14) -> dict[str, Any]:
    """Where a relay's CPU time went (cProfile with a CPU-time clock). uvloop's own C code is
    not seen by cProfile: its time shows as asyncio.runners' run()."""
    import pstats

    st = pstats.Stats(str(path))
    total = 0.0
    buckets: dict[str, float] = {}
    rows = []
    for (file, line, func), (_cc, nc, tt, _ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        total += tt
        bucket = profile_bucket(file, func)
        buckets[bucket] = buckets.get(bucket, 0.0) + tt
        rows.append((tt, nc, f"{Path(file).name}:{line}({func})" if file != "~" else func))
    rows.sort(reverse=True)
    return {
        "total_cpu_s": total,
        "shares": {k: round(v / total, 3) for k, v in
                   sorted(buckets.items(), key=lambda kv: -kv[1])} if total else {},
        "top": [{"cpu_s": round(tt, 3), "calls": nc, "share": round(tt / total, 3),
                 "func": name} for tt, nc, name in rows[:top]],
    }


def fmt(x: float, nd: int = 2) -> str:
    return "n/a" if x != x else f"{x:,.{nd}f}"


def saturated(s: dict[str, Any]) -> bool:
    """One Python process at a full core, or under 90% of the chunks the engine offers."""
    return bool(s["target_cores"] >= 0.9 or s["delivered"] < 0.9)


def shortfalls(result: dict[str, Any]) -> list[str]:
    """Why the run does not stand: a target that did not start or died, or one that delivered
    less than SHORT_OF of what the engine's cadence offered, or met errors, in any repetition
    (saturation is a finding only for the MAY_SATURATE peers)."""
    out = [f"{name}: {why}" for name, why in result["failed"].items()]
    for name, per_n in result["runs"].items():
        if name in MAY_SATURATE:
            continue
        for n_s, runs in per_n.items():
            for r in runs:
                if r["delivered"] < SHORT_OF or r["errors"]:
                    out.append(f"{name} at {n_s} streams (repetition {r['rep']}): delivered "
                               f"{r['delivered']:.0%} of what it was offered, {r['errors']} "
                               "errors")
    return out


def table(summary: dict[str, dict[str, dict[str, Any]]], streams: list[int]) -> str:
    head = ("| target | streams | added TTFT p50 ms | added TTFT p99 ms | TTFT p50 / p99 ms | "
            "ITL p99 ms | CPU-s / 1k chunks | target cores | delivered | client lag p99 ms |"
            " others cores |")
    lines = [head, "|" + "---|" * 11]
    for name, per_n in summary.items():
        for n in streams:
            s = per_n.get(str(n))
            if s is None:
                continue
            sat = " (saturated)" if saturated(s) else ""
            lo, hi = s["added_ttft_p50_ms_range"]
            lines.append(
                f"| {name} | {n} | {fmt(s['added_ttft_p50_ms'])} [{fmt(lo)}, {fmt(hi)}] | "
                f"{fmt(s['added_ttft_p99_ms'])} | {fmt(s['ttft_p50_ms'])} / "
                f"{fmt(s['ttft_p99_ms'])} | {fmt(s['itl_p99_ms'])} | "
                f"{fmt(s['cpu_s_per_1k_chunks'], 3)} | {fmt(s['target_cores'])} | "
                f"{s['delivered']:.0%}{sat} | {fmt(s['loop_lag_p99_ms'])} | "
                f"{fmt(s['others_cores'])} |")
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> None:
    streams = [int(x) for x in args.streams.split(",")]
    impls = [x for x in args.impls.split(",") if x]
    skipped: dict[str, str] = {}
    if not args.starlette_python:
        for name in [x for x in impls if split_impl(x)[0] in UVICORN_IMPLS]:
            skipped[name] = "needs --starlette-python (uvicorn, httptools, starlette, httpx)"
            impls.remove(name)
    targets = ["direct", *impls]
    if args.chatfleet:
        targets.append("chatfleet")
    if args.peer_litellm:
        targets.append("litellm")
    if args.peer_router:
        targets.append("sglang-router")
    workdir = Path(tempfile.mkdtemp(prefix="gateway-relay-"))
    print(f"logs in {workdir}", flush=True)
    procs: dict[str, Proc] = {}
    ports: dict[str, int] = {}
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "skipped": skipped, "failed": {}, "abort_check": {}, "runs": {}, "summary": {},
        "profile": {},
    }
    try:
        engine_port = free_port()
        procs["engine"] = Proc("engine", [
            sys.executable, str(SCRIPT), "engine", "--port", str(engine_port),
            "--chunks", str(args.chunks), "--interval-ms", str(args.interval_ms),
            "--first-ms", str(args.first_ms)], workdir / "engine.log")
        ports["direct"] = engine_port
        err = wait_ready(engine_port, procs["engine"], 20)
        if err:
            raise SystemExit(f"engine: {err}")
        for name in targets[1:]:
            port = free_port()
            argv, env = target_argv(name, port, engine_port, args, workdir)
            print(f"starting {name}: {' '.join(argv)}", flush=True)
            procs[name] = Proc(name, argv, workdir / f"{name}.log", env)
            ports[name] = port
        for name in targets[1:]:
            timeout = 240.0 if name in ("litellm", "sglang-router") else 30.0
            err = wait_ready(ports[name], procs[name], timeout)
            if err:
                result["failed"][name] = err
                print(f"{name} FAILED: {err}", flush=True)
                procs.pop(name).stop()
                continue
            result["abort_check"][name] = abort_check(ports[name], engine_port)
            print(f"{name} ready; abort check {result['abort_check'][name]}", flush=True)
        targets = [t for t in targets if t == "direct" or t in procs]
        for n in streams:
            for rep in range(args.reps):
                order = targets[rep % len(targets):] + targets[:rep % len(targets)]
                for name in order:
                    proc = procs.get(name, procs["engine"])
                    if not proc.alive():
                        result["failed"].setdefault(name, f"died: {proc.tail()}")
                        continue
                    # every other target is stopped (SIGSTOP) while this one is measured
                    for other, p in procs.items():
                        if other != "engine":
                            p.signal(signal.SIGCONT if other == name else signal.SIGSTOP)
                    pids = {"target": proc.pid, "engine": procs["engine"].pid}
                    url = f"http://{HOST}:{ports[name]}{CHAT_PATH}"
                    try:
                        res = run_client(url, n, args, pids, workdir, f"{name}-{n}-{rep}")
                    except (subprocess.SubprocessError, OSError, ValueError) as e:
                        result["failed"].setdefault(name, f"client run failed: {e}")
                        continue
                    res["rep"] = rep
                    result["runs"].setdefault(name, {}).setdefault(str(n), []).append(res)
                    print(f"n={n} rep={rep} {name}: ttft p50 {fmt(res['ttft_p50_ms'])} "
                          f"p99 {fmt(res['ttft_p99_ms'])} itl p99 {fmt(res['itl_p99_ms'])} "
                          f"cpu/1k {fmt(res['cpu_s']['target'] / max(1, res['chunks']) * 1000, 3)}"
                          f" delivered {res['delivered']:.0%} lag {fmt(res['loop_lag_p99_ms'])}"
                          f" others {fmt(res['others_cores'])}", flush=True)
                    time.sleep(args.settle_s)
        for name, per_n in result["runs"].items():
            for n_s, runs in per_n.items():
                direct = {r["rep"]: r for r in result["runs"]["direct"][n_s]}
                paired = [r for r in runs if r["rep"] in direct]
                result["summary"].setdefault(name, {})[n_s] = summarize(
                    paired, [direct[r["rep"]] for r in paired])
        for other, p in procs.items():
            if other != "engine":
                p.signal(signal.SIGCONT)
        if args.profile:
            pdir = Path(args.profile)
            pdir.mkdir(parents=True, exist_ok=True)
            n = max(streams)
            for name in [t for t in targets if t not in ("direct", "litellm", "sglang-router")]:
                procs.pop(name).stop()
                port = free_port()
                argv, env = target_argv(name, port, engine_port, args, workdir)
                pfile = pdir / f"{name}.prof"
                prof = Proc(name, [*argv, "--profile", str(pfile)], workdir / f"{name}-prof.log")
                try:
                    err = wait_ready(port, prof, 30)
                    if err:
                        result["profile"][name] = {"error": err}
                        continue
                    run_client(f"http://{HOST}:{port}{CHAT_PATH}", n, args,
                               {"target": prof.pid, "engine": procs["engine"].pid}, workdir,
                               f"{name}-prof")
                finally:
                    prof.stop()
                if pfile.exists():
                    result["profile"][name] = profile_summary(pfile)
                    print(f"profile {name}: {result['profile'][name]['shares']}", flush=True)
    finally:
        for p in reversed(list(procs.values())):
            p.stop()
    print()
    print(table(result["summary"], streams))
    for name, why in {**skipped, **result["failed"]}.items():
        print(f"- {name}: {why}")
    result["shortfalls"] = shortfalls(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    if result["shortfalls"]:
        for line in result["shortfalls"]:
            print(f"FAILED: {line}", file=sys.stderr)
        raise SystemExit("the run does not stand: a target delivered less than it was offered "
                         "(its figures measure its refusals or its saturation, not its relay)")


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = ap.add_subparsers(dest="cmd")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--chunks", type=int, default=64, help="chunks per request")
        p.add_argument("--interval-ms", type=float, default=20.0, help="engine chunk cadence")

    run = sub.add_parser("run", help="the whole comparison (the default)")
    common(run)
    run.add_argument("--first-ms", type=float, default=20.0, help="engine time to first chunk")
    run.add_argument("--streams", default="32,256")
    run.add_argument("--reps", type=int, default=3)
    run.add_argument("--warmup-s", type=float, default=1.5)
    run.add_argument("--measure-s", type=float, default=8.0)
    run.add_argument("--drain-s", type=float, default=3.0)
    run.add_argument("--ramp-s", type=float, default=None)
    run.add_argument("--settle-s", type=float, default=1.0)
    run.add_argument("--max-requests", type=int, default=200_000)
    run.add_argument("--fresh-connections", action="store_true",
                     help="the client opens a new connection per request (default: keep-alive)")
    run.add_argument("--quickack", action="store_true",
                     help="the client ACKs every read at once (TCP_QUICKACK): hides a target's "
                          "Nagle stalls, which a client with delayed ACKs sees")
    run.add_argument("--impls", default=",".join(DEFAULT_IMPLS))
    run.add_argument("--starlette-python", default=None)
    run.add_argument("--chatfleet", action="store_true",
                     help="measure `chatfleet gateway` (in this Python) as a target")
    run.add_argument("--chatfleet-cap", type=int, default=CHATFLEET_CAP,
                     help="the gateway's cap: above every stream count, so no run reaches it")
    run.add_argument("--peer-litellm", default=None, metavar="PYTHON")
    run.add_argument("--peer-router", default=None, metavar="BIN")
    run.add_argument("--profile", default=None, metavar="DIR")
    run.add_argument("--json", default=None, metavar="FILE")
    run.set_defaults(func=cmd_run)

    eng = sub.add_parser("engine", help="the fake engine")
    common(eng)
    eng.add_argument("--port", type=int, required=True)
    eng.add_argument("--first-ms", type=float, default=20.0)
    eng.add_argument("--no-uvloop", action="store_true")
    eng.set_defaults(func=cmd_engine)

    rel = sub.add_parser("relay", help="one relay prototype")
    rel.add_argument("--impl", required=True)
    rel.add_argument("--port", type=int, required=True)
    rel.add_argument("--upstream", required=True, help="HOST:PORT of the engine")
    rel.add_argument("--profile", default=None, metavar="FILE")
    rel.set_defaults(func=cmd_relay)
    gwp = sub.add_parser("chatfleet-gateway", help="chatfleet gateway in front of the engine")
    gwp.add_argument("--port", type=int, required=True)
    gwp.add_argument("--upstream", required=True, help="HOST:PORT of the engine")
    gwp.add_argument("--profile", default=None, metavar="FILE")
    gwp.add_argument("--cap", type=int, default=CHATFLEET_CAP)
    gwp.add_argument("--min-connections", type=int, default=0)
    gwp.set_defaults(func=cmd_chatfleet)

    cli = sub.add_parser("client", help="the load client")
    common(cli)
    cli.add_argument("--url", required=True)
    cli.add_argument("--streams", type=int, required=True)
    cli.add_argument("--warmup-s", type=float, default=1.5)
    cli.add_argument("--measure-s", type=float, default=8.0)
    cli.add_argument("--drain-s", type=float, default=3.0)
    cli.add_argument("--ramp-s", type=float, default=None)
    cli.add_argument("--max-requests", type=int, default=200_000)
    cli.add_argument("--cpu-pid", action="append", default=[], metavar="LABEL=PID")
    cli.add_argument("--api-key", default="none")
    cli.add_argument("--fresh-connections", action="store_true",
                     help="a new connection per request instead of one per user")
    cli.add_argument("--quickack", action="store_true",
                     help="set TCP_QUICKACK after every read (no delayed ACKs from the client)")
    cli.add_argument("--out", required=True)
    cli.set_defaults(func=cmd_client)

    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        argv = ["run", *argv]
    args = ap.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
