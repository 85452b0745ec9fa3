"""`chatfleet telemetry-agent`: NVML readings of one GPU over HTTP, for a harness elsewhere.

Run it on the engine host; the harness reads it with `--telemetry agent:http://HOST:9400`.

    GET /telemetry  {"time", "unix_time", "gpu", "gpu_index", "sm_clock_mhz", "temp_c",
                     "power_w", "thermal_slowdown", "clock_event_reasons", "clock_event_mask"}
    GET /health     {"status": "ok", "gpu", "gpu_index"}

The JSON of /telemetry has the shape of the simserver's /telemetry; `time` is seconds since the
agent started (the harness stamps samples with its own clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import typer
from aiohttp import web

from chatfleet.bench.telemetry import NvmlReader, TelemetryError, TelemetryUnavailable
from chatfleet.cli.common import console, fail, out

DEFAULT_PORT = 9400


class Reader(Protocol):
    gpu_index: int
    name: str

    def read(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


# Tests replace this to serve a fake GPU.
READER_FACTORY: Callable[[int], Reader] = NvmlReader


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def make_app(reader: Reader) -> web.Application:
    """The agent's routes over one reader. NVML calls run in a worker thread, one at a time."""
    lock = asyncio.Lock()

    async def telemetry(request: web.Request) -> web.Response:
        try:
            async with lock:
                doc = await asyncio.to_thread(reader.read)
        except TelemetryError as exc:
            return _json({"error": str(exc)}, 503)
        except Exception as exc:  # a driver error: report it, keep serving
            return _json({"error": f"{type(exc).__name__}: {exc}"}, 503)
        return _json(doc)

    async def health(request: web.Request) -> web.Response:
        return _json({"status": "ok", "gpu": reader.name, "gpu_index": reader.gpu_index})

    app = web.Application()
    app.router.add_get("/telemetry", telemetry)
    app.router.add_get("/health", health)
    return app


@dataclass(slots=True)
class RunningAgent:
    runner: web.AppRunner
    url: str

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_agent(reader: Reader, host: str = "127.0.0.1",
                      port: int = DEFAULT_PORT) -> RunningAgent:
    """Serve `reader` on host:port (port 0: any free port); the URL says which."""
    runner = web.AppRunner(make_app(reader), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    sock = site._server.sockets[0]  # type: ignore[union-attr]
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    return RunningAgent(runner, f"http://{shown}:{bound}")


def telemetry_agent(
    host: str = typer.Option("127.0.0.1", help="Address to bind (0.0.0.0 to serve a harness "
                                               "on another host)."),
    port: int = typer.Option(DEFAULT_PORT, help="Port (0: any free port)."),
    gpu_index: int = typer.Option(0, "--gpu-index", help="NVML index of the GPU to read."),
) -> None:
    """Serve this host's GPU telemetry (NVML) as JSON: GET /telemetry, GET /health."""
    if gpu_index < 0:
        fail("--gpu-index must be 0 or more")
    if not 0 <= port <= 65535:
        fail("--port must be between 0 and 65535")
    try:
        reader = READER_FACTORY(gpu_index)
    except TelemetryUnavailable as exc:
        fail(str(exc))

    async def main() -> None:
        agent = await start_agent(reader, host, port)
        out.print(agent.url, highlight=False)
        console.print(f"telemetry-agent: GPU {gpu_index} ({reader.name}) at {agent.url}"
                      "/telemetry; Ctrl-C stops")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await agent.close()

    try:
        asyncio.run(main())
    except OSError as exc:
        fail(f"cannot serve on {host}:{port}: {exc}")
    finally:
        reader.close()
