"""The gateway's benchmark (issue 5): `chatfleet gateway` against direct connections, LiteLLM's
proxy and SGLang's router, side by side in one run, at 32 and 256 streams, on a fake engine
(64 SSE chunks per request, 20 ms apart).

    python benchmarks/gateway.py [--streams 32,256] [--reps 3] [--measure-s 8]
        [--peer-litellm /tmp/ll/bin/python] [--peer-router /tmp/sr/bin/sglang-router]
        [--profile DIR] [--json FILE] [--quickack] [--fresh-connections]

The peers live in their own virtual environments, never in requirements.lock:

    python3 -m venv /tmp/ll && /tmp/ll/bin/pip install 'litellm[proxy]==1.108.7'
    python3 -m venv /tmp/sr && /tmp/sr/bin/pip install 'sglang-router==0.3.2'

Every piece is a separate process started from this file, all bound to 127.0.0.1: the fake
engine (`engine`, benchmarks/relay_engine.py), the load client (`client`,
benchmarks/relay_client.py: what each figure is), `chatfleet gateway` in front of the engine
(`chatfleet-gateway`, in this Python), and the peers: LiteLLM's proxy (`--peer-litellm
PYTHON`: a venv with litellm[proxy]; one worker, a model `openai/qwen3-8b` whose api_base is
the engine) and SGLang's router (`--peer-router BIN`: the `sglang-router` entry point of a venv
with sglang-router; its router is Rust, loaded into that Python process; round_robin policy, one
worker = the engine, router and metrics bound to 127.0.0.1). Every request carries
`Authorization: Bearer <a random sk- key>` (LiteLLM's master key; the others ignore it).

The client runs without --quickack by default (Linux's delayed ACKs, as SDK clients), so a
relay that writes without TCP_NODELAY shows its Nagle stall. The gateway runs with a cap no run
reaches (--chatfleet-cap, 2,000) and refuses to start when its connection limit, from the
descriptor limit, is below the largest stream count.

Per run (one target, one stream count): TTFT p50/p99, ITL p50/p99/max, chunks received in the
window against those the engine's cadence offers (delivered share; a target is marked
saturated below 90%, or at a full core for one Python process), the target's CPU seconds over
the window per 1,000 chunks received, the cores it used, the engine's cores, the client's
event-loop lag p99 and the cores used by every other process. The direct run (the client
against the engine) is a target like the others. Each repetition runs every target once, in an
order rotated per repetition; added TTFT = the target's percentile minus the direct run's of
the same repetition. Every target but the one being measured is stopped (SIGSTOP) during a run,
so that an idle peer's background work is not counted as noise. The table gives the medians
over repetitions (and the spread of the added median TTFT).

Before the load, each target is checked once: a full stream must relay 64 chunks and [DONE],
and 4 streams dropped by the client after 3 chunks must show up as aborted at the engine
within 2 s (disconnect propagation).

A run that does not stand fails loudly (exit status 1, each reason on stderr, the JSON written
with them under "shortfalls"): a target that did not start or died, or any target but
LiteLLM's proxy (MAY_SATURATE: its saturation here is a finding) that delivered less than 90%
of what the engine's cadence offered, or met errors, in any repetition.

--profile DIR reruns the gateway for one window at the largest stream count under cProfile
with a CPU-time clock (slower: not for the reported figures) and reports the shares of its
CPU time by package and its top functions; --reps 0 --profile DIR profiles only.

The relay prototypes that chose the gateway's design (aiohttp, Starlette, uvicorn, httpx and
hand-written relays, on uvloop and asyncio) ran in this harness until issue 24; their findings
are docs/gateway-relay.md, and the harness that ran them is benchmarks/gateway_relay.py in the
history (`git show 0f5f496:benchmarks/gateway_relay.py`).

This machine has 2 cores, shared by the engine, the target and the client (and whatever else
runs): figures are noisy and only comparable inside one run of this script. Figures:
docs/gateway.md#performance.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from relay_client import client_main
from relay_engine import HOST, MODEL, start_engine
from relay_procs import API_KEY, CHAT_PATH, Proc, abort_check, wait_ready

SCRIPT = Path(__file__).resolve()
CHATFLEET_CAP = 2_000  # above every stream count measured: no run reaches the cap
# targets whose saturation is a finding (they deliver less than offered on this machine); any
# other target that delivers less than SHORT_OF its offer, or meets errors, fails the run
MAY_SATURATE = frozenset({"litellm"})
SHORT_OF = 0.9
PEERS = ("litellm", "sglang-router")


def run_loop(main: Callable[[], Any], use_uvloop: bool) -> None:
    """Run the coroutine function `main` on uvloop or on asyncio's default loop."""
    if use_uvloop:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


async def serve_forever(server_start: Callable[[], Any]) -> None:
    """Start a server and wait for SIGTERM/SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await server_start()
    print("ready", flush=True)
    await stop.wait()
    with contextlib.suppress(Exception):
        await server.close()


# ---------------------------------------------------------------------------------------------
# the processes: the engine, the gateway, the client


def cmd_engine(args: argparse.Namespace) -> None:
    run_loop(lambda: serve_forever(lambda: start_engine(
        args.port, args.chunks, args.interval_ms / 1000, args.first_ms / 1000)),
        not args.no_uvloop)


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


def cmd_client(args: argparse.Namespace) -> None:
    out: dict[str, Any] = {}

    async def main() -> None:
        out.update(await client_main(args))

    run_loop(main, True)
    Path(args.out).write_text(json.dumps(out))


# ---------------------------------------------------------------------------------------------
# the orchestrator


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
    most = max(int(x) for x in args.streams.split(","))
    return ([sys.executable, str(SCRIPT), "chatfleet-gateway", "--port", str(port),
             "--upstream", upstream, "--cap", str(args.chatfleet_cap),
             "--min-connections", str(most)], {})


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
    ("uvloop internals (C: epoll, socket I/O, callbacks)", ("asyncio/runners.py",)),
    ("asyncio (Python: tasks, futures, selector loop)", ("asyncio/", "selectors.py")),
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


def start_targets(args: argparse.Namespace, workdir: Path, result: dict[str, Any],
                  procs: dict[str, Proc], ports: dict[str, int]) -> list[str]:
    """The engine, then the gateway and the peers asked for, each checked once (a full
    stream, then the disconnect check); the targets that stand, "direct" first."""
    engine_port = free_port()
    procs["engine"] = Proc("engine", [
        sys.executable, str(SCRIPT), "engine", "--port", str(engine_port),
        "--chunks", str(args.chunks), "--interval-ms", str(args.interval_ms),
        "--first-ms", str(args.first_ms)], workdir / "engine.log")
    ports["direct"] = engine_port
    err = wait_ready(engine_port, procs["engine"], 20)
    if err:
        raise SystemExit(f"engine: {err}")
    targets = ["chatfleet"]
    if args.peer_litellm:
        targets.append("litellm")
    if args.peer_router:
        targets.append("sglang-router")
    for name in targets:
        port = free_port()
        argv, env = target_argv(name, port, engine_port, args, workdir)
        print(f"starting {name}: {' '.join(argv)}", flush=True)
        procs[name] = Proc(name, argv, workdir / f"{name}.log", env)
        ports[name] = port
    for name in targets:
        err = wait_ready(ports[name], procs[name], 240.0 if name in PEERS else 30.0)
        if err:
            result["failed"][name] = err
            print(f"{name} FAILED: {err}", flush=True)
            procs.pop(name).stop()
            continue
        result["abort_check"][name] = abort_check(ports[name], engine_port)
        print(f"{name} ready; abort check {result['abort_check'][name]}", flush=True)
    return ["direct", *(t for t in targets if t in procs)]


def measure(args: argparse.Namespace, workdir: Path, result: dict[str, Any],
            procs: dict[str, Proc], ports: dict[str, int], targets: list[str]) -> None:
    """Every target at every stream count, `reps` times, in an order rotated per
    repetition; the others stopped (SIGSTOP) meanwhile; then the medians."""
    for n in [int(x) for x in args.streams.split(",")]:
        for rep in range(args.reps):
            order = targets[rep % len(targets):] + targets[:rep % len(targets)]
            for name in order:
                proc = procs.get(name, procs["engine"])
                if not proc.alive():
                    result["failed"].setdefault(name, f"died: {proc.tail()}")
                    continue
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


def profile_gateway(args: argparse.Namespace, workdir: Path, result: dict[str, Any],
                    procs: dict[str, Proc], ports: dict[str, int]) -> None:
    """The gateway again, under cProfile, for one window at the largest stream count."""
    pdir = Path(args.profile)
    pdir.mkdir(parents=True, exist_ok=True)
    if "chatfleet" not in procs:
        return
    procs.pop("chatfleet").stop()
    port = free_port()
    argv, _ = target_argv("chatfleet", port, ports["direct"], args, workdir)
    pfile = pdir / "chatfleet.prof"
    prof = Proc("chatfleet", [*argv, "--profile", str(pfile)], workdir / "chatfleet-prof.log")
    try:
        err = wait_ready(port, prof, 30)
        if err:
            result["profile"]["chatfleet"] = {"error": err}
            return
        run_client(f"http://{HOST}:{port}{CHAT_PATH}",
                   max(int(x) for x in args.streams.split(",")), args,
                   {"target": prof.pid, "engine": procs["engine"].pid}, workdir, "chatfleet-prof")
    finally:
        prof.stop()
    if pfile.exists():
        result["profile"]["chatfleet"] = profile_summary(pfile)
        print(f"profile chatfleet: {result['profile']['chatfleet']['shares']}", flush=True)


def cmd_run(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    print(f"logs in {workdir}", flush=True)
    procs: dict[str, Proc] = {}
    ports: dict[str, int] = {}
    result: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "python": sys.version.split()[0]},
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "failed": {}, "abort_check": {}, "runs": {}, "summary": {}, "profile": {},
    }
    try:
        targets = start_targets(args, workdir, result, procs, ports)
        measure(args, workdir, result, procs, ports, targets)
        if args.profile:
            profile_gateway(args, workdir, result, procs, ports)
    finally:
        for p in reversed(list(procs.values())):
            p.stop()
    print()
    print(table(result["summary"], [int(x) for x in args.streams.split(",")]))
    for name, why in result["failed"].items():
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
