"""`chatfleet launch`: N gateways, Redis and M replicas on one machine (docs/deploy.md)."""

from __future__ import annotations

import signal
import socket
import sys
from pathlib import Path
from types import FrameType

import typer
from rich.table import Table

from chatfleet.cli.common import (
    check_output_dir,
    clean_errors,
    console,
    fail,
    load_gpu,
    out,
    path_error,
    print_json,
)
from chatfleet.core.specs import precision
from chatfleet.deploy.launcher import ChildFailed, Interrupted, Launcher, LaunchError, LaunchSpec


class _StopFlag:
    """Set by SIGINT or SIGTERM; the launcher polls it."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.signal = signum

    def __bool__(self) -> bool:
        return self.signal is not None


def launch(
    gateways: int = typer.Option(1, help="Gateways to run, sharing their state in Redis."),
    replicas: int = typer.Option(1, help="Engine replicas to run."),
    engine: str = typer.Option("simserver", help="simserver (the twin served live, one "
                               "process hosting every replica) or command (--engine-cmd, one "
                               "process per replica)."),
    engine_cmd: str | None = typer.Option(
        None, "--engine-cmd", help="The engine's command line with {port} (and optionally "
        "{host}, {index}), e.g. 'python -m sglang.launch_server --model-path "
        "Qwen/Qwen3-8B-FP8 --port {port}'. Must serve GET /health."),
    redis: str = typer.Option("auto", help="auto (start redis-server on a free loopback port, "
                              "no persistence), none (one gateway, memory state) or "
                              "redis://HOST:PORT/DB (one already running)."),
    cap: int | None = typer.Option(None, help="Requests in flight per replica (the knee)."),
    cap_from: Path | None = typer.Option(None, "--cap-from", help="Take the cap from a sweep's "
                                         "recommended_cap."),
    queue_depth: int | None = typer.Option(None, help="Each gateway's queue depth."),
    host: str = typer.Option("127.0.0.1", help="Address every gateway and replica binds."),
    port: int = typer.Option(8080, help="First gateway's port (the others follow; 0: any "
                             "free ports)."),
    replica_port: int = typer.Option(8100, help="First replica's port (the others follow; 0: "
                                     "any free ports)."),
    gpu: str = typer.Option("l4", help="simserver: the GPU it models."),
    weights: str = typer.Option("bf16", help="simserver: bf16 or fp8."),
    kv_cache: str = typer.Option("bf16", "--kv-cache", help="simserver: bf16 or fp8."),
    time_scale: float = typer.Option(1.0, help="simserver: run k times faster than the GPU."),
    config: Path | None = typer.Option(None, help="Gateway config file passed to every gateway "
                                       "(its replica list is replaced by the launched ones)."),
    log_dir: Path | None = typer.Option(None, help="One log per child here (default: a new "
                                        "temporary folder, printed)."),
    ready_timeout: float = typer.Option(120.0, help="Seconds each child has to answer its "
                                        "health check."),
    as_json: bool = typer.Option(False, "--json", help="Print the endpoints as JSON once all "
                                 "are ready."),
) -> None:
    """Run Redis, M replicas and N gateways here; stop them all, in reverse order, on Ctrl-C
    or SIGTERM."""
    spec = LaunchSpec(gateways=gateways, replicas=replicas, engine=engine,
                      engine_cmd=engine_cmd, redis=redis, cap=cap, cap_from=cap_from,
                      queue_depth=queue_depth, host=host, port=port, replica_port=replica_port,
                      gpu=gpu, weights=weights, kv_cache=kv_cache, time_scale=time_scale,
                      config=config, log_dir=log_dir, ready_timeout_s=ready_timeout)
    with clean_errors():  # every option (an unreadable --cap-from or --config too) is one line
        if engine == "simserver":  # the simserver's own options, checked before anything starts
            load_gpu(gpu)
            precision(weights, kv_cache)
        if log_dir is not None:
            check_output_dir(log_dir, "--log-dir")
        try:
            socket.getaddrinfo(host, None)
        except OSError:
            fail(f"--host {host!r} is not an address: give one of this machine's (127.0.0.1, "
                 "0.0.0.0, ...)")
        launcher = Launcher(spec)
    stop = _StopFlag()
    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    console.print(f"launch: logs in {launcher.log_dir}")
    code = 0
    try:
        try:
            launcher.start(lambda: bool(stop))
        except Interrupted:
            console.print("interrupted while starting")
        else:
            for note in launcher.notes:
                console.print(f"[yellow]note:[/] {note}")
            show(launcher.endpoints(), as_json)
            died = launcher.watch(lambda: bool(stop))
            if died is not None:
                assert died.proc is not None
                console.print(f"[bold red]error:[/] {died.name} ({died.role}, pid {died.pid}) "
                              f"exited with status {died.proc.returncode}; stopping the rest. "
                              f"Last lines of {died.log}:\n{died.log_tail()}", highlight=False)
                code = 1
    except ChildFailed as exc:
        console.print(f"[bold red]error:[/] {exc}; stopping the rest. Last lines of "
                      f"{exc.child.log}:\n{exc.tail()}", highlight=False)
        code = 1
    except LaunchError as exc:
        console.print(f"[bold red]error:[/] {exc}")
        code = 2
    except OSError as exc:  # a log folder or an address the children cannot have
        console.print(f"[bold red]error:[/] cannot launch: "
                      f"{path_error(exc) if exc.filename else exc}")
        code = 2
    finally:
        for child, status in launcher.stop():
            if child.proc is not None:
                console.print(f"stopped {child.name} (pid {child.pid}): exit status {status}",
                              highlight=False)
        sys.stdout.flush()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if code:
        raise typer.Exit(code)


def show(doc: dict[str, object], as_json: bool) -> None:
    if as_json:
        print_json(doc)
        sys.stdout.flush()
        return
    t = Table(title=f"chatfleet launch: state {doc['state']}, logs in {doc['log_dir']}")
    for col in ("role", "name", "url", "pid", "log"):
        t.add_column(col)
    rows: list[tuple[str, dict[str, object]]] = []
    for role in ("gateways", "replicas"):
        value = doc[role]
        assert isinstance(value, list)
        rows += [(role[:-1], r) for r in value]
    redis = doc["redis"]
    if isinstance(redis, dict):
        rows.append(("redis", {"name": "redis" if redis["managed"] else "redis (external)",
                               **redis}))
    for role, r in rows:
        t.add_row(role, str(r["name"]), str(r["url"]), str(r.get("pid") or "-"),
                  str(r.get("log") or "-"))
    out.print(t)
    console.print("Ctrl-C or SIGTERM stops everything (gateways, replicas, then Redis)")
    sys.stdout.flush()
