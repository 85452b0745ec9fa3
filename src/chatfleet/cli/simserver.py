"""`chatfleet simserver`: the engine twin served live as SGLang-like OpenAI replicas."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
from pathlib import Path

import typer

from chatfleet.cli.common import clean_errors, console, fail, load_gpu, load_model, out
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import precision


def simserver(
    gpu: str = typer.Option("l4", help="GPU name."),
    model: str = typer.Option("qwen3-8b", help="Built-in model name or path to a config.json."),
    weights: str = typer.Option("bf16", help="bf16 or fp8."),
    kv_cache: str = typer.Option("bf16", "--kv-cache", help="bf16 or fp8."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(0, help="First port (0: any free port for each replica)."),
    replicas: int = typer.Option(1, help="Replicas to host, one port each."),
    time_scale: float = typer.Option(
        1.0, help="Run k times faster than the modelled GPU (for tests; every report converts "
                  "back to model time)."),
    thermal: bool = typer.Option(False, "--thermal", help="Switch the thermal model on."),
    seed: int = typer.Option(0, help="Seed of replica i is seed + i."),
    trace: Path | None = typer.Option(None, help="Write every token's planned and actual send "
                                      "time and every scheduler step here (JSON lines)."),
    max_running_requests: int | None = typer.Option(None, help="Engine cap."),
    eviction: str = typer.Option("lru", help="Radix eviction policy."),
    host_pool_tokens: int = typer.Option(0, help="HiCache host tier size in tokens."),
    pool_tokens: int | None = typer.Option(None, help="Override the planned KV pool."),
    served_model_name: str = typer.Option("qwen3-8b", help="Name /v1/models reports."),
    profile: Path | None = typer.Option(None, help="A calibration profile from `chatfleet "
                                        "twin calibrate`."),
) -> None:
    """Serve the engine model over HTTP in wall-clock time, as SGLang would on that GPU."""
    from chatfleet.simserver.server import ServerConfig, start

    with clean_errors():
        if replicas < 1:
            fail("--replicas must be at least 1")
        if not (math.isfinite(time_scale) and time_scale > 0):
            fail("--time-scale must be a positive finite number")
        if not 0 <= port <= 65535 or (port and port + replicas - 1 > 65535):
            fail(f"--port {port} with {replicas} replicas is outside 0..65535")
        from chatfleet.cli.twin import profile_calibration

        spec = EngineSpec(load_gpu(gpu), load_model(model), precision(weights, kv_cache),
                          pool_tokens=pool_tokens, max_running_requests=max_running_requests,
                          eviction_policy=eviction, host_pool_tokens=host_pool_tokens,
                          thermal=thermal, calibration=profile_calibration(profile, gpu))
        spec.pool_plan()
        cfg = ServerConfig(spec=spec, host=host, port=port, replicas=replicas,
                           time_scale=time_scale, seed=seed, trace=trace,
                           served_model_name=served_model_name)

    async def main() -> None:
        srv = await start(cfg)
        for url in srv.urls:
            out.print(url, highlight=False)
        cal = "" if spec.gpu.name == "l4" else " (uncalibrated)"
        console.print(f"simserver: {spec.model.name} on {spec.gpu.name}{cal}, "
                      f"{spec.precision.label}, time scale {time_scale}; Ctrl-C stops")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await srv.close()

    try:
        asyncio.run(main())
    except (OSError, OverflowError) as exc:
        fail(f"cannot serve: {exc}")
