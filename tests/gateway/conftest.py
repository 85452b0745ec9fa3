"""Gateway tests: fake replicas (tiny inline aiohttp apps, each in its own thread and loop) and
the gateway in a thread. Every server binds 127.0.0.1 and is stopped by its fixture."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web

from chatfleet.gateway.app import Gateway
from chatfleet.gateway.config import GatewayConfig, Overrides, parse_config
from chatfleet.gateway.server import RunningGateway, serve_in_thread

HTTP_TIMEOUT = 30


def sse(i: int, text: str, usage: dict[str, Any] | None = None) -> bytes:
    obj: dict[str, Any] = {"id": "x", "object": "chat.completion.chunk", "model": "fake",
                           "choices": [{"index": 0, "delta": {"content": text},
                                        "finish_reason": None}]}
    if usage is not None:
        obj = {"id": "x", "object": "chat.completion.chunk", "model": "fake", "choices": [],
               "usage": usage}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


@dataclass
class Fake:
    """One fake replica. A request's body may carry `"fake": {...}`: chunks (int), gap_s,
    die_after (chunks, then the connection is cut), pad (characters added to each chunk),
    status (answer that status with a body holding a secret), head_delay_s. `mode` = "ok" |
    "fail" (503 to everything, /health included) | "error" (500 to every generation request
    before a byte, /health 200) applies to the whole replica. `probed_at` and `requests_at`
    (time.monotonic) record when it answered /health 200 and when requests reached it;
    `stop()` closes its port (connections are refused from then on)."""

    name: str
    url: str = ""
    mode: str = "ok"
    bodies: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    started: int = 0
    completed: int = 0
    aborted: int = 0
    prompt_tokens: int = 100
    loop: asyncio.AbstractEventLoop | None = None
    runner: web.AppRunner | None = None
    probed_at: list[float] = field(default_factory=list)
    requests_at: list[float] = field(default_factory=list)

    def stop(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None and self.loop is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), self.loop).result(30)

    def app(self) -> web.Application:
        async def generate(request: web.Request) -> web.StreamResponse:
            self.requests_at.append(time.monotonic())
            if self.mode == "fail":
                return web.Response(status=503, text="SECRET-upstream-detail")
            if self.mode == "error":
                return web.Response(status=500, text="SECRET-upstream-detail")
            body = await request.json()
            self.bodies.append(body)
            spec = body.get("fake") or {}
            if spec.get("status"):
                return web.Response(status=int(spec["status"]), text="SECRET-upstream-detail",
                                    headers={"X-Upstream-Secret": "1"})
            self.started += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(float(spec.get("head_delay_s", 0)))
                n, gap = int(spec.get("chunks", 3)), float(spec.get("gap_s", 0.01))
                usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": n,
                         "total_tokens": self.prompt_tokens + n,
                         "prompt_tokens_details": {"cached_tokens": 0}}
                if not body.get("stream"):
                    await asyncio.sleep(gap * n)
                    self.completed += 1
                    return web.json_response({
                        "id": "x", "object": "chat.completion", "model": "fake",
                        "choices": [{"index": 0, "message": {"role": "assistant",
                                                             "content": "ok " * n},
                                     "finish_reason": "length"}], "usage": usage})
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                                   "X-Upstream-Secret": "1"})
                await resp.prepare(request)
                die = spec.get("die_after")
                for i in range(n):
                    if die is not None and i == int(die):
                        assert request.transport is not None
                        request.transport.abort()
                        return resp
                    await resp.write(sse(i, f"t{i} " + "x" * int(spec.get("pad", 0))))
                    await asyncio.sleep(gap)
                await resp.write(sse(n, "", usage))
                await resp.write(b"data: [DONE]\n\n")
                # the whole answer is written: counted before write_eof, which may wait on the
                # connection that a gateway, done with the stream at [DONE], closes (and
                # cancel this handler: a 200 the replica then never counted)
                self.completed += 1
                await resp.write_eof()
                return resp
            except asyncio.CancelledError:
                self.aborted += 1
                raise
            finally:
                self.in_flight -= 1

        async def health(request: web.Request) -> web.Response:
            if self.mode == "fail":
                return web.Response(status=503)
            self.probed_at.append(time.monotonic())
            return web.json_response({"status": "ok"})

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", generate)
        app.router.add_post("/v1/completions", generate)
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        return app


def raw_post(body: bytes | dict[str, Any], *, path: str = "/v1/chat/completions",
             headers: str = "Content-Type: application/json\r\n") -> bytes:
    """The bytes of a POST, written by hand (no client library would send the odd ones)."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    return (b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n%s"
            % (path.encode(), headers.encode(), len(data), data))


@contextlib.contextmanager
def raw_connection(url: str, request: bytes, *, timeout: float | None = 10,
                   rcvbuf: int | None = None) -> Iterator[socket.socket]:
    """A plain socket to `url` that has sent `request` (rcvbuf: a small receive buffer, for a
    client that reads slowly or not at all)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        if rcvbuf is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.sendall(request)
        yield s


def free_port() -> int:
    """A port nothing listens on (connections to it are refused until a server takes it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextlib.contextmanager
def fake_replicas(n: int, ports: list[int] | None = None) -> Iterator[list[Fake]]:
    """n fake replicas on one loop in one thread (on `ports`, or any free ones)."""
    loop = asyncio.new_event_loop()
    fakes = [Fake(f"f{i}", loop=loop) for i in range(n)]
    ready = threading.Event()

    async def boot() -> None:
        for i, f in enumerate(fakes):
            runner = web.AppRunner(f.app(), handler_cancellation=True, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", ports[i] if ports else 0,
                               reuse_address=True)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            f.url = f"http://127.0.0.1:{port}"
            f.runner = runner
        ready.set()

    def main() -> None:
        asyncio.set_event_loop(loop)
        task = loop.create_task(boot())
        loop.run_forever()
        del task

    t = threading.Thread(target=main, daemon=True)
    t.start()
    assert ready.wait(30)
    try:
        yield fakes
    finally:
        async def stop() -> None:
            for f in fakes:
                runner, f.runner = f.runner, None
                if runner is not None:
                    await runner.cleanup()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        t.join(30)
        loop.close()


def gateway_config(urls: list[str], names: list[str] | None = None, **raw: Any) -> GatewayConfig:
    raw.setdefault("health", {"probe_interval_s": 0.2, "eject_after_failures": 2,
                              "readmit_after_successes": 1})
    cfg = parse_config(raw)
    names = names or [f"f{i}" for i in range(len(urls))]
    return Overrides(tuple(f"{n}={u}" for n, u in zip(names, urls, strict=True))).apply(cfg)


@contextlib.contextmanager
def gateway(cfg: GatewayConfig, **kw: Any) -> Iterator[RunningGateway]:
    with serve_in_thread(Gateway(cfg, **kw)) as g:
        yield g


@pytest.fixture
def fakes2() -> Iterator[list[Fake]]:
    with fake_replicas(2) as fakes:
        yield fakes
