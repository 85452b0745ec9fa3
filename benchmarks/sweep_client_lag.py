"""Does `chatfleet sweep` keep up through the chat API, and are its rates the trace's?

Usage:
    .venv/bin/python benchmarks/sweep_client_lag.py [--users 1,16,64,256] [--repeat 2]
        [--duration 60] [--warmup 10] [--drain 120] [--input-len 512] [--output-len 128]
        [--system-prompt-tokens 2048] [--api chat|completions-ids] [--time-scale 1]
        [--no-pin] [--json FILE] [--keep DIR [--reanalyse]]

What a new user does (issue 21): `chatfleet simserver --trace` (L4 model, FP8 weights and KV
cache) in one process pinned to the first CPU, and `chatfleet sweep` through the chat API (the
product's path; real Qwen3 text of exact token counts) in another pinned to the second (the
simserver's core and the client's, as `taskset -c 0` / `-c 1` would), closed loop at each
user count `--repeat` times over (one sweep, the counts in order, each repetition its own run
and seed), fixed lengths (`--input-len` / `--output-len` tokens, the shared system prompt on
top). Both are the installed CLI, run as subprocesses.

Per run, from the sweep's own document (`sweep.json`) and records, matched by `response_id` to
the simserver's trace (the server's CLOCK_MONOTONIC when it wrote each token):
- the client: send lag and loop lag p99 and max over the window, the sweep's validity verdict,
  and its prompt texts (built ahead, seconds, built in the run, late);
- the rates against the trace's own (trace_rates.py): output tok/s (tokens the server wrote in
  the window), request_rps (each ok request's share of its tokens written in the window),
  goodput_rps (the same over the requests meeting the target, judged on the trace's token
  times from the client's send time), and beside them the old count (requests whose last token
  arrived in the window), and the window's cycles;
- the phase: the trace's own tok/s over the window slid back into the warm-up by 0-5 s, its
  spread (max / min - 1) beside the 1 / cycles bound the sweep's `few_cycles` warns with;
- the machine: the CPU the client (sweep and its prompt workers), the server and everything
  else used during the sweep, in cores, and the load average (other work on a shared machine
  shows there).

The client's clock is put on the trace's by the median offset of matched tokens (arrival -
server write: the network's fraction of a millisecond on one host).

The target (issue 21, this 2-core machine): send lag p99 <= 5 ms and loop lag p99 <= 5 ms at
256 users, every point valid. The script exits 1 when a run did not deliver what it offered
(failed requests, answers of the wrong length, records missing from the trace); the target's
verdict is printed. Results and commands: docs/harness-accuracy.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from chatfleet.core.records import RequestRecord

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simserver_lag import CHATFLEET, CLI_MAIN, SimServer
from trace_rates import trace_rates

TARGET_LAG_MS = 5.0
TARGET_USERS = 256
# The window slid back into the warm-up by these seconds (forward it would reach the drain,
# where no request is sent): how much the trace's own rate moves with the window's phase.
SLIDE_S = (0.0, 1.0, 2.0, 3.0, 4.0, 5.0)


def sweep_argv(url: str, args: argparse.Namespace, out: Path) -> list[str]:
    users = ",".join(str(u) for u in args.users for _ in range(args.repeat))
    head = [str(CHATFLEET)] if CHATFLEET.exists() else [sys.executable, "-c", CLI_MAIN]
    return [*head, "sweep", "--target", url, "--engine", "simserver", "--model", "qwen3-8b",
            "--concurrency", users, "--lengths", "fixed", "--input-len", str(args.input_len),
            "--output-len", str(args.output_len), "--system-prompt-tokens",
            str(args.system_prompt_tokens), "--duration", str(args.duration), "--warmup",
            str(args.warmup), "--drain", str(args.drain), "--api", args.api, "--seed",
            str(args.seed), "--out", str(out)]


# --- the machine's CPU (Linux /proc) ------------------------------------------------------------
def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (all but idle and iowait)."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


@dataclass
class Machine:
    wall_s: float
    client_cores: float
    server_cores: float
    other_cores: float
    loadavg_before: tuple[float, float, float]
    loadavg_after: tuple[float, float, float]


# --- the trace ----------------------------------------------------------------------------------
def read_trace(path: Path) -> dict[str, np.ndarray]:
    """rid -> CLOCK_MONOTONIC of each token's write, by index."""
    rows: dict[str, list[tuple[int, float]]] = {}
    with open(path, "rb") as f:
        for line in f:
            if b'"type":"token"' not in line:
                continue
            row = orjson.loads(line)
            rows.setdefault(row["rid"], []).append((row["index"], row["actual_mono"]))
    return {rid: np.array([t for _, t in sorted(r)]) for rid, r in rows.items()}


@dataclass
class Run:
    users: int
    run_index: int
    valid: bool
    invalid_reason: str | None
    send_lag_ms_p99: float
    loop_lag_ms_p99: float
    send_lag_ms_max: float | None
    loop_lag_ms_max: float | None
    prompt_texts: dict[str, Any] | None
    requests: int
    failed: int
    mismatched_tokens: int
    unmatched: int
    window_cycles: float | None
    few_cycles: bool | None
    rates: dict[str, dict[str, float]] = field(default_factory=dict)
    phase_spread: float | None = None  # the trace's tok/s over the window slid back, max/min - 1


def rel(ours: float, truth: float) -> float:
    return (ours - truth) / truth if truth else float("nan")


def record_of(d: dict[str, Any]) -> RequestRecord:
    """A record of the sweep's records.jsonl."""
    return RequestRecord(d["request_id"], d["session_id"], d["turn"], d["replica"],
                         d["scheduled_time"], d["send_time"], d["first_token_time"],
                         d["token_times"], d["prompt_tokens"], d["cached_tokens"],
                         d["output_tokens"], d["outcome"], d["error"],
                         d.get("itl_estimated", False), d.get("response_id"))


def analyse(point: dict[str, Any], records: list[RequestRecord],
            trace: dict[str, np.ndarray]) -> Run:
    start, end = point["window_s"]
    matched = [(r, trace[r.response_id]) for r in records
               if r.response_id in trace and len(r.token_times)]
    unmatched = sum(1 for r in records if r.outcome == "ok" and r.response_id not in trace)
    offsets = np.concatenate([t[: len(r.token_times)] - np.asarray(r.token_times)
                              for r, t in matched]) if matched else np.zeros(1)
    t0 = float(np.median(offsets))  # the run's clock zero on the server's monotonic clock
    truth = trace_rates(records, trace, t0, (start, end))
    slid = [trace_rates(records, trace, t0, (start - d, end - d)).output_tok_s
            for d in SLIDE_S if d <= start]
    rates = {k: {"sweep": float(point[k]), "trace": v, "rel": rel(float(point[k]), v)}
             for k, v in (("output_tok_s", truth.output_tok_s),
                          ("request_rps", truth.request_rps),
                          ("goodput_rps", truth.goodput_rps))}
    by_last = point["requests"].get("finished_in_window", 0) / (end - start)
    rates["request_rps_by_last_token"] = {"sweep": by_last, "trace": truth.request_rps,
                                          "rel": rel(by_last, truth.request_rps)}
    client = point["client"]
    check = point.get("token_check") or {}
    return Run(
        users=point["load"]["concurrency"], run_index=point["run_index"],
        valid=point["valid"], invalid_reason=point["invalid_reason"],
        send_lag_ms_p99=client["send_lag_ms_p99"], loop_lag_ms_p99=client["loop_lag_ms_p99"],
        send_lag_ms_max=client.get("send_lag_ms_max"),
        loop_lag_ms_max=client.get("loop_lag_ms_max"),
        prompt_texts=point.get("prompt_texts"), requests=len(records),
        failed=sum(1 for r in records if r.outcome in ("error", "timeout", "cancelled")),
        mismatched_tokens=int(check.get("mismatched", 0)), unmatched=unmatched,
        window_cycles=point.get("window_cycles"), few_cycles=point.get("few_cycles"),
        rates=rates, phase_spread=max(slid) / min(slid) - 1 if slid and min(slid) > 0
        else None)


def run_sweep(args: argparse.Namespace, workdir: Path) -> tuple[list[Run], Machine]:
    trace_path = workdir / "trace.jsonl"
    out = workdir / "sweep"
    shutil.rmtree(out, ignore_errors=True)
    trace_path.unlink(missing_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    pin = not args.no_pin and len(cpus) >= 2
    srv = SimServer(trace_path, workdir / "simserver.log", args.pool_tokens,
                    cpus={cpus[0]} if pin else None, time_scale=args.time_scale)
    client_cpus = set(cpus[1:]) if pin else None
    try:
        srv.start()
        load0, busy0, srv0, kids0, t0 = (os.getloadavg(), machine_busy_s(), srv.cpu_s(),
                                          children_cpu_s(), time.monotonic())
        with open(workdir / "sweep.log", "wb") as log:
            proc = subprocess.run(
                sweep_argv(srv.url, args, out), stdout=log, stderr=subprocess.STDOUT,
                timeout=args.timeout, check=False,
                preexec_fn=None if client_cpus is None
                else (lambda: os.sched_setaffinity(0, client_cpus)))
        wall = time.monotonic() - t0
        machine = Machine(
            wall_s=wall, client_cores=(children_cpu_s() - kids0) / wall,
            server_cores=(srv.cpu_s() - srv0) / wall,
            other_cores=0.0, loadavg_before=load0, loadavg_after=os.getloadavg())
        machine.other_cores = max(0.0, (machine_busy_s() - busy0) / wall
                                  - machine.client_cores - machine.server_cores)
    except BaseException:
        srv.kill()
        raise
    srv.stop()
    if proc.returncode != 0:
        raise SystemExit(f"chatfleet sweep exited with {proc.returncode}; see "
                         f"{workdir / 'sweep.log'}")
    (workdir / "machine.json").write_text(json.dumps(asdict(machine)))
    return read_runs(workdir), machine


def read_runs(workdir: Path) -> list[Run]:
    """Every run of the sweep in `workdir`, against its trace."""
    out = workdir / "sweep"
    doc = orjson.loads((out / "sweep.json").read_bytes())
    trace = read_trace(workdir / "trace.jsonl")
    runs = []
    for point in doc["points"]:
        path = out / point["files"]["records"]
        records = [record_of(orjson.loads(x)) for x in path.read_bytes().splitlines()
                   if x.strip()]
        runs.append(analyse(point, records, trace))
    return runs


# --- output -------------------------------------------------------------------------------------
def fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None or x != x else f"{x:.{nd}f}"


def pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{100 * x:.1f}%"


def rows(runs: list[Run]) -> Iterator[str]:
    yield (f"{'users':>5} {'run':>3} {'valid':>5} {'send p99':>8} {'send max':>8} "
           f"{'loop p99':>8} {'loop max':>8} {'ahead':>6} {'ahead s':>7} {'in run':>6} "
           f"{'late':>4} {'cycles':>6} {'1/cycles':>8} {'phase':>6}")
    for r in runs:
        t = r.prompt_texts or {}
        yield (f"{r.users:5d} {r.run_index:3d} {'yes' if r.valid else 'NO':>5} "
               f"{fmt(r.send_lag_ms_p99):>8} {fmt(r.send_lag_ms_max):>8} "
               f"{fmt(r.loop_lag_ms_p99):>8} {fmt(r.loop_lag_ms_max):>8} "
               f"{t.get('built_ahead', '-'):>6} {fmt(t.get('ahead_s'), 1):>7} "
               f"{t.get('built_in_run', '-'):>6} {t.get('late', '-'):>4} "
               f"{fmt(r.window_cycles, 1) + ('!' if r.few_cycles else ''):>6} "
               f"{pct(1 / r.window_cycles if r.window_cycles else None):>8} "
               f"{pct(r.phase_spread):>6}")


def rate_rows(runs: list[Run]) -> Iterator[str]:
    yield (f"{'users':>5} {'run':>3} {'tok/s':>8} {'trace':>8} {'rel':>7} {'req/s':>7} "
           f"{'trace':>7} {'rel':>7} {'goodput':>7} {'trace':>7} {'rel':>7} "
           f"{'by last':>7} {'rel':>7}")
    for r in runs:
        t, q, g, b = (r.rates[k] for k in ("output_tok_s", "request_rps", "goodput_rps",
                                           "request_rps_by_last_token"))
        yield (f"{r.users:5d} {r.run_index:3d} {t['sweep']:8.1f} {t['trace']:8.1f} "
               f"{t['rel']:+7.2%} {q['sweep']:7.3f} {q['trace']:7.3f} {q['rel']:+7.2%} "
               f"{g['sweep']:7.3f} {g['trace']:7.3f} {g['rel']:+7.2%} {b['sweep']:7.3f} "
               f"{b['rel']:+7.2%}")


def verdict(runs: list[Run]) -> dict[str, Any]:
    top = [r for r in runs if r.users == TARGET_USERS]
    lag_ok = bool(top) and all(r.send_lag_ms_p99 <= TARGET_LAG_MS
                               and r.loop_lag_ms_p99 <= TARGET_LAG_MS for r in top)
    return {"all_valid": all(r.valid for r in runs), "lag_at_256_ok": lag_ok,
            "target_met": lag_ok and all(r.valid for r in runs),
            "send_lag_ms_p99_at_256": [r.send_lag_ms_p99 for r in top],
            "loop_lag_ms_p99_at_256": [r.loop_lag_ms_p99 for r in top]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", default="1,16,64,256",
                    type=lambda s: [int(x) for x in s.split(",") if x.strip()])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--warmup", type=float, default=10.0)
    ap.add_argument("--drain", type=float, default=120.0)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--system-prompt-tokens", type=int, default=2048)
    ap.add_argument("--api", choices=("chat", "completions-ids"), default="chat")
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--pool-tokens", type=int, default=None,
                    help="what-if: the simserver's KV pool (default: the planned FP8 pool)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-pin", action="store_true", help="leave both to the kernel")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None, help="keep the sweep, trace and logs")
    ap.add_argument("--reanalyse", action="store_true",
                    help="read the sweep kept in --keep again instead of running one")
    args = ap.parse_args()
    if args.reanalyse and args.keep is None:
        raise SystemExit("--reanalyse reads the sweep kept in --keep DIR")
    tmp = None
    if args.keep is not None:
        workdir = args.keep
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="sweep-client-lag-")
        workdir = Path(tmp)
    print(f"chatfleet sweep --api {args.api} against a traced simserver (L4, FP8/FP8, time "
          f"scale {args.time_scale:g}); closed loop at {args.users} users x {args.repeat}, "
          f"{args.system_prompt_tokens}+{args.input_len} in / {args.output_len} out, warm-up "
          f"{args.warmup:g} s, window {args.duration:g} s; "
          f"{'server on the first CPU, client on the others' if not args.no_pin else 'unpinned'}"
          f" of {os.cpu_count()}", flush=True)
    try:
        if args.reanalyse:  # a kept sweep, read again
            runs = read_runs(workdir)
            machine = Machine(**json.loads((workdir / "machine.json").read_text()))
        else:
            runs, machine = run_sweep(args, workdir)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\nthe client (ms; the sweep's window figures), its prompt texts (built ahead, "
          "seconds, built in the run, late requests), the window's cycles (! few) with the "
          "bound they set on a rate's phase error, and the spread of the trace's own tok/s "
          f"over the window slid back by {SLIDE_S[0]:g}-{SLIDE_S[-1]:g} s (max / min - 1)")
    for line in rows(runs):
        print(line)
    print("\nrates: the sweep's against the trace's (share of each request's tokens in the "
          "window; goodput on the trace's times), and the count by last token")
    for line in rate_rows(runs):
        print(line)
    print(f"\nmachine during the sweep ({machine.wall_s:.0f} s): client "
          f"{machine.client_cores:.2f} cores, server {machine.server_cores:.2f}, other work "
          f"{machine.other_cores:.2f}; load average {machine.loadavg_before[0]:.1f} before, "
          f"{machine.loadavg_after[0]:.1f} after")
    v = verdict(runs)
    print(f"target (send and loop lag p99 <= {TARGET_LAG_MS:g} ms at {TARGET_USERS} users, "
          f"every point valid): {'MET' if v['target_met'] else 'NOT MET'} (send p99 "
          f"{v['send_lag_ms_p99_at_256']}, loop p99 {v['loop_lag_ms_p99_at_256']}, all valid: "
          f"{v['all_valid']})")
    worst = max((abs(r.rates[k]["rel"]) for r in runs for k in ("output_tok_s", "request_rps",
                                                               "goodput_rps")
                 if not math.isnan(r.rates[k]["rel"])), default=float("nan"))
    print(f"rates against the trace: worst {worst:.3%}; median window cycles "
          f"{statistics.median([r.window_cycles or 0.0 for r in runs]):.1f}")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "schema": "chatfleet.sweep_client_lag/1", "argv": sys.argv[1:],
            "runs": [asdict(r) for r in runs], "machine": asdict(machine), "verdict": v,
            "worst_rate_rel": worst}, indent=1) + "\n")
    broken = [r for r in runs if r.failed or r.mismatched_tokens or r.unmatched]
    if broken:
        for r in broken:
            print(f"run {r.run_index} ({r.users} users) did not deliver: {r.failed} failed, "
                  f"{r.mismatched_tokens} answers of the wrong length, {r.unmatched} ok "
                  "requests missing from the trace", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
