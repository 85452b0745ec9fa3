"""`chatfleet simserver`: the engine twin served live as SGLang-like or vLLM-like OpenAI
replicas (`--engine-model`)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
from pathlib import Path

import typer

from chatfleet.check.accuracy import AccuracyInputError, gsm8k_split
from chatfleet.cli.common import (
    clean_errors,
    console,
    fail,
    load_gpu,
    load_model,
    out,
    uncalibrated_note,
)
from chatfleet.cli.options import (
    HOST_POOL_HELP,
    RATIO_HELP,
    SIZE_HELP,
    WRITE_POLICY_HELP,
    engine_model_args,
    profile_calibration,
    with_host_tier,
)
from chatfleet.core.engine.build import EngineSpec, build_engine
from chatfleet.core.engine.host_tier import DEFAULT_WRITE_POLICY
from chatfleet.core.specs import precision
from chatfleet.simserver.oracle import Oracle
from chatfleet.simserver.server import ServerConfig, start


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
    seed: int = typer.Option(0, help="Seed of replica i is seed + i (the oracle draws from "
                             "seed itself, the same for every replica)."),
    trace: Path | None = typer.Option(None, help="Write every token's planned and actual send "
                                      "time and every scheduler step here (JSON lines)."),
    max_running_requests: int | None = typer.Option(
        None, help="Engine cap (the vLLM model's --max-num-seqs)."),
    eviction: str = typer.Option("lru", help="Radix eviction policy."),
    host_pool_tokens: int = typer.Option(0, help=HOST_POOL_HELP),
    hicache_ratio: float | None = typer.Option(None, help=RATIO_HELP),
    hicache_size: float | None = typer.Option(None, help=SIZE_HELP),
    hicache_write_policy: str = typer.Option(DEFAULT_WRITE_POLICY, help=WRITE_POLICY_HELP),
    pool_tokens: int | None = typer.Option(None, help="Override the planned KV pool."),
    served_model_name: str = typer.Option("qwen3-8b", help="Name /v1/models reports."),
    profile: Path | None = typer.Option(None, help="A calibration profile from `chatfleet "
                                        "twin calibrate`."),
    oracle_dataset: Path | None = typer.Option(
        None, help="Oracle mode: answer the questions of this GSM8K or prompts file (JSON "
                   "Lines; gsm8k: the test split shipped with chatfleet) right with probability "
                   "--oracle-accuracy (docs/accuracy.md)."),
    oracle_accuracy: float = typer.Option(
        1.0, help="Oracle mode: probability that a question is answered right, drawn per "
                  "question from --seed."),
    engine_model: str = typer.Option(
        "sglang", help="sglang: SGLang v0.5's scheduler and admin routes; vllm: vLLM 0.26's "
        "scheduler, /reset_prefix_cache, /server_info, /version and vllm:* metrics."),
    max_num_batched_tokens: int | None = typer.Option(
        None, help="vLLM model: the token budget per step (default: vLLM's for the card)."),
    long_prefill_token_threshold: int = typer.Option(
        0, help="vLLM model: cap on one request's prefill chunk (0: off)."),
) -> None:
    """Serve the engine model over HTTP in wall-clock time, as SGLang (or vLLM) would on that
    GPU."""
    with clean_errors():
        if replicas < 1:
            fail("--replicas must be at least 1")
        if not (math.isfinite(time_scale) and time_scale > 0):
            fail("--time-scale must be a positive finite number")
        if not served_model_name.strip():
            fail("--served-model-name is empty: give the name /v1/models should report")
        if not (0.0 <= oracle_accuracy <= 1.0):
            fail("--oracle-accuracy must lie in [0, 1]")
        if oracle_dataset is not None and str(oracle_dataset).strip().lower() == "gsm8k":
            try:
                oracle_dataset = gsm8k_split()
            except AccuracyInputError as exc:
                fail(f"--oracle-dataset gsm8k: {exc}")
        if oracle_dataset is not None and not oracle_dataset.is_file():
            fail(f"--oracle-dataset: no file {oracle_dataset}")
        if not 0 <= port <= 65535 or (port and port + replicas - 1 > 65535):
            fail(f"--port {port} with {replicas} replicas is outside 0..65535")
        spec = EngineSpec(load_gpu(gpu), load_model(model), precision(weights, kv_cache),
                          pool_tokens=pool_tokens, max_running_requests=max_running_requests,
                          eviction_policy=eviction, thermal=thermal,
                          calibration=profile_calibration(profile, gpu, engine_model),
                          **engine_model_args(engine_model, max_num_batched_tokens,
                                              long_prefill_token_threshold))
        spec = with_host_tier(spec, host_pool_tokens, hicache_ratio, hicache_size,
                              hicache_write_policy)
        # build the engine model once here: a bad policy, cap or pool is one line now, not a
        # traceback from inside the server's start
        build_engine(spec)
        cfg = ServerConfig(spec=spec, host=host, port=port, replicas=replicas,
                           time_scale=time_scale, seed=seed, trace=trace,
                           served_model_name=served_model_name,
                           oracle_dataset=oracle_dataset, oracle_accuracy=oracle_accuracy)
        oracle_note = None
        if oracle_dataset is not None:  # read it now: a bad file is a one-line error
            ds = Oracle.load(oracle_dataset, oracle_accuracy, seed).dataset
            oracle_note = (f"oracle: {len(ds.items)} questions of {oracle_dataset} ({ds.kind}), "
                           f"accuracy {oracle_accuracy}, seed {seed}")

    async def main() -> None:
        srv = await start(cfg)
        for url in srv.urls:
            out.print(url, highlight=False)
        cal = "" if spec.is_calibrated else " (uncalibrated)"
        console.print(f"simserver: {spec.model.name} on {spec.gpu.name}{cal}, "
                      f"{spec.precision.label}, {engine_model} model, time scale "
                      f"{time_scale}; Ctrl-C stops")
        if not spec.is_calibrated:
            console.print(f"[yellow]{uncalibrated_note(spec.gpu.name)}[/]", highlight=False)
        if oracle_note is not None:
            console.print(oracle_note)
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
