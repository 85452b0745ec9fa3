"""`chatfleet gateway`: the OpenAI-compatible gateway in front of engine replicas."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path

import typer

from chatfleet.cli.common import clean_errors, console, fail, out
from chatfleet.gateway.app import Gateway, step_time_for
from chatfleet.gateway.config import ConfigError, Overrides, cap_from_sweep, load_config
from chatfleet.gateway.config import hash_key as do_hash
from chatfleet.gateway.connections import check_room, raise_descriptor_limit
from chatfleet.gateway.server import start
from chatfleet.gateway.state import backend_from
from chatfleet.http.log import setup_logging


def gateway(
    replica: list[str] = typer.Option(
        [], "--replica", help="A replica's URL (http://host:port), or NAME=URL; repeat it. "
        "Replaces the config file's list."),
    cap: int | None = typer.Option(None, help="Requests in flight per replica (the knee's "
                                   "cap). Overrides the config file."),
    cap_from: Path | None = typer.Option(None, "--cap-from", help="Take the cap from a sweep "
                                         "document's recommended_cap."),
    queue_depth: int | None = typer.Option(None, help="The queue's maximum depth."),
    config: Path | None = typer.Option(None, help="YAML or JSON config file: keys, the shared "
                                       "prompt, timeouts, routing (docs/gateway.md). Watched "
                                       "and reloaded when it changes."),
    state: str = typer.Option("memory", help="Where gateways share caps and sessions: memory "
                              "(one gateway) or redis://HOST:PORT/DB (several)."),
    gateways: int | None = typer.Option(None, help="How many gateways share --state (the "
                                        "config's state.gateways): without Redis each serves "
                                        "cap // N, and a new one serves at once instead of "
                                        "waiting a lease TTL for its share."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8080, help="Port to bind (0: any free port)."),
    hash_key: bool = typer.Option(False, "--hash-key", help="Read an API key on stdin, print "
                                  "what the config file stores for it, and exit."),
) -> None:
    """Serve replicas behind a cap at the knee, one queue with 429 + Retry-After, session
    affinity and a byte-identical shared prompt."""
    if hash_key:
        key = sys.stdin.readline().strip()
        if not key:
            fail("no key on stdin")
        out.print(do_hash(key), highlight=False)
        return
    if not 0 <= port <= 65535:
        fail(f"--port {port} is outside 0..65535")
    with clean_errors():
        if cap_from is not None:
            if cap is not None:
                fail("give --cap or --cap-from, not both")
            cap = cap_from_sweep(cap_from)
        overrides = Overrides(tuple(replica), cap, queue_depth, gateways)
        cfg = overrides.apply(load_config(config))
        backend = backend_from(state, cfg.state.timeout_s)
        # the soft descriptor limit up to the hard one; refused when what it leaves for
        # client connections cannot fill the slots (gateway/connections.py)
        check_room(cfg, raise_descriptor_limit())
        gw = Gateway(cfg, config_path=config, overrides=overrides,
                     step_time=step_time_for(cfg), state=backend)

    async def main() -> None:
        setup_logging()

        running = await start(gw, host, port)
        out.print(running.url, highlight=False)
        auth = f"{len(cfg.keys)} API keys" if cfg.keys else "no API keys (open)"
        where = "in process" if not backend.shared else state
        up = "" if gw.shared.up or not backend.shared else (
            f" (unreachable: cap // {cfg.state.gateways} of each replica until it answers)"
            if cfg.state.gateways else " (unreachable: nothing is served until it answers; "
            "set state.gateways to serve a share without it)")
        console.print(f"gateway: {len(cfg.replicas)} replicas, cap {cfg.cap} each, queue "
                      f"{cfg.queue_depth}, {auth}, shared prompt {cfg.shared_prompt.mode}, "
                      f"state {where}{up}, client connections at most {running.guard.limit()} "
                      f"(descriptor limit {running.guard.fd_limit}); Ctrl-C stops, SIGHUP "
                      "reloads the config")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)

        def hup() -> None:
            try:
                gw.reload()
                console.print("configuration reloaded")
            except ConfigError as exc:
                console.print(f"[red]configuration not reloaded:[/] {exc}")

        if config is not None:
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signal.SIGHUP, hup)
        await stop.wait()
        await running.close()

    try:
        import uvloop

        uvloop.run(main())
    except (OSError, OverflowError) as exc:
        fail(f"cannot serve: {exc}")
