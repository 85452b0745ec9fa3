"""The live harness's own event-loop lag in a chat sweep, and what holds the loop.

Usage:
    .venv/bin/python benchmarks/harness_loop_lag.py [--users 64] [--time-scale 3]
        [--duration 30] [--warmup 10] [--repeat 3] [--lengths sharegpt|fixed]
        [--length-file FILE] [--turns 1] [--pin] [--json FILE]
        [--target URL --engine vllm --telemetry nvml --no-flush]

Each repeat starts `chatfleet simserver` (L4 model, FP8 weights and KV cache) as a subprocess at
`--time-scale k` (k times faster than the modelled L4, so a 64-user point streams about 1,000
output tokens per wall second, what vLLM did at 32-64 users on an H200), and runs one closed-loop
point of `chatfleet sweep` against it through `LiveSweep`, exactly as the CLI does: the chat API
with real Qwen3 text of exact token counts (2,048-token shared system prompt, the ShareGPT length
mix by default), the /metrics scraper every second, the token check. `--duration` and
`--warmup` are wall seconds. With `--target URL` the point runs against that engine instead
(no simserver, no time scale): how the figures of docs/harness-accuracy.md against vLLM on the
H200 were taken.

Reported per repeat, and as medians over the repeats:
- output tok/s per wall second, the window's loop-lag and send-lag p99 (what the sweep judges
  the client on: invalid when loop lag p99 > 10 ms);
- the loop's own CPU in the window, which contention does not move: its iterations' CPU time
  (how many held it over 2 and 5 ms) and the cyclic garbage collector's passes;
- what ran on the loop: every asyncio callback that held it over 2 ms, grouped by what it ran
  (a task's coroutine, or a transport callback), with the CPU time (`time.thread_time`) beside
  the wall time. A callback whose wall time far exceeds its CPU time was not running: the
  process was preempted (this machine has 2 cores shared by client, server and more).

To measure another version of the harness against the same script, put its sources first on
the path: `git archive <commit> src | tar -x -C /tmp/base` and
`PYTHONPATH=/tmp/base/src .venv/bin/python benchmarks/harness_loop_lag.py` (the simserver
subprocess and the prompt workers inherit the path). Results: docs/harness-accuracy.md.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.base_events
import asyncio.events
import collections
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chatfleet.bench import live_run
from chatfleet.bench.sweep import LiveSweep
from chatfleet.bench.sweep_config import LiveSweepConfig
from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.workload import LengthSpec, WorkloadConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from simserver_lag import SimServer

SLOW_MS = 2.0


class LoopHolds:
    """Every asyncio callback that ran longer than SLOW_MS: (what, wall ms, CPU ms)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float]] = []
        self._orig = asyncio.events.Handle._run

    def __enter__(self) -> LoopHolds:
        orig, rows = self._orig, self.rows

        def run(handle: asyncio.events.Handle) -> None:
            c0, w0 = time.thread_time(), time.perf_counter()
            orig(handle)
            wall = (time.perf_counter() - w0) * 1000
            if wall > SLOW_MS:
                rows.append((describe(handle), wall, (time.thread_time() - c0) * 1000))

        asyncio.events.Handle._run = run  # type: ignore[method-assign, assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.events.Handle._run = self._orig  # type: ignore[method-assign]

    def table(self) -> list[dict[str, Any]]:
        groups: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        for what, wall, cpu in self.rows:
            groups[what].append((wall, cpu))
        out = []
        for what, v in groups.items():
            walls, cpus = sorted(w for w, _ in v), sorted(c for _, c in v)
            out.append({"what": what, "count": len(v), "wall_ms_sum": round(sum(walls), 1),
                        "wall_ms_p50": round(walls[len(walls) // 2], 2),
                        "wall_ms_max": round(walls[-1], 2),
                        "cpu_ms_sum": round(sum(cpus), 1),
                        "cpu_ms_p50": round(cpus[len(cpus) // 2], 2),
                        "cpu_ms_max": round(cpus[-1], 2)})
        return sorted(out, key=lambda r: -r["cpu_ms_sum"])


class WindowCpu:
    """The loop's own CPU in the run's window, contention aside: each iteration of the event
    loop (`_run_once`: its callbacks' CPU time, `time.thread_time`) and each pass of the cyclic
    garbage collector (its CPU time, its generation), and the clock the run's window counts
    from (chatfleet.bench.live_run's Clock, as it is made)."""

    def __init__(self) -> None:
        self.iterations: list[tuple[float, float]] = []  # (monotonic start, CPU ms)
        self.collections: list[tuple[float, int, float]] = []  # (start, generation, CPU ms)
        self.t0: float | None = None
        self._run_once = asyncio.base_events.BaseEventLoop._run_once  # type: ignore[attr-defined]
        self._clock = live_run.Clock  # type: ignore[attr-defined]
        self._started = (0.0, 0.0)

    def __enter__(self) -> WindowCpu:
        orig, its = self._run_once, self.iterations

        def run_once(loop: asyncio.AbstractEventLoop) -> None:
            w0, c0 = time.monotonic(), time.thread_time()
            orig(loop)
            its.append((w0, (time.thread_time() - c0) * 1000))

        outer = self

        class Clock(self._clock):  # type: ignore[misc, name-defined]
            def __init__(self, *a: Any, **k: Any) -> None:
                super().__init__(*a, **k)
                outer.t0 = self.t0

        asyncio.base_events.BaseEventLoop._run_once = run_once  # type: ignore[attr-defined]
        live_run.Clock = Clock  # type: ignore[attr-defined]
        gc.callbacks.append(self._gc)
        return self

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = (time.monotonic(), time.thread_time())
        else:
            w0, c0 = self._started
            self.collections.append((w0, info["generation"], (time.thread_time() - c0) * 1000))

    def __exit__(self, *exc: object) -> None:
        asyncio.base_events.BaseEventLoop._run_once = self._run_once  # type: ignore[attr-defined]
        live_run.Clock = self._clock  # type: ignore[attr-defined]
        gc.callbacks.remove(self._gc)

    def summary(self, warmup_s: float, duration_s: float) -> dict[str, Any]:
        """Over the window (wall seconds from the clock's start): the iterations, their CPU,
        those over 2 and 5 ms of CPU, the largest; the collector's passes, CPU, largest, and
        its full passes."""
        if self.t0 is None:
            return {}
        lo, hi = self.t0 + warmup_s, self.t0 + warmup_s + duration_s
        cpu = sorted(c for w, c in self.iterations if lo <= w < hi)
        gcs = [(g, c) for w, g, c in self.collections if lo <= w < hi]
        return {"iterations": len(cpu), "cpu_s": round(sum(cpu) / 1000, 3),
                "over_2ms": sum(1 for c in cpu if c > 2.0),
                "over_5ms": sum(1 for c in cpu if c > 5.0),
                "max_ms": round(cpu[-1], 2) if cpu else 0.0,
                "gc_passes": len(gcs), "gc_cpu_ms": round(sum(c for _, c in gcs), 1),
                "gc_max_ms": round(max((c for _, c in gcs), default=0.0), 2),
                "gc_full_passes": sum(1 for g, _ in gcs if g == 2)}


def describe(handle: asyncio.events.Handle) -> str:
    cb = handle._callback  # type: ignore[attr-defined]
    owner = getattr(cb, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return f"task {owner.get_coro().__qualname__}"  # type: ignore[union-attr]
    return str(getattr(cb, "__qualname__", None) or type(cb).__name__)


def workload(args: argparse.Namespace) -> WorkloadConfig:
    if args.length_file is not None:
        from chatfleet.data.lengths import load_length_file

        lengths = LengthSpec("file", pairs=tuple(load_length_file(args.length_file)))
    elif args.lengths == "sharegpt":
        from chatfleet.data.sharegpt import cached_sharegpt_length_pairs

        lengths = LengthSpec("sharegpt", pairs=tuple(cached_sharegpt_length_pairs()))
    else:
        lengths = LengthSpec("fixed", args.input_len, args.output_len)
    return WorkloadConfig(system_prompt_tokens=args.system_tokens, lengths=lengths,
                          turns=args.turns)


def run_once(args: argparse.Namespace, seed: int, workdir: Path) -> dict[str, Any]:
    srv: SimServer | None = None
    if args.target is not None:  # a running engine: its own speed, no time scale
        k, url, engine = 1.0, args.target, args.engine
    else:
        k, engine = args.time_scale, "simserver"
        server_cpus, client_cpus = args.cpus
        srv = SimServer(workdir / f"trace-{seed}.jsonl", workdir / f"simserver-{seed}.log",
                        None, time_scale=k, cpus=server_cpus)
        if client_cpus is not None:  # the client (and its prompt workers) on the others
            os.sched_setaffinity(0, client_cpus)
        url = srv.start()
    try:
        cfg = LiveSweepConfig(
            targets=[url], engine=engine, model=args.model,
            loads=[ClosedLoad(args.users)], wcfg=workload(args),
            out=workdir / f"sweep-{seed}", duration_s=args.duration * k,
            warmup_s=args.warmup * k, drain_s=120.0 * k, api="chat",
            telemetry=args.telemetry, flush=args.flush, seed=seed, save_records=False)
        with LoopHolds() as holds, WindowCpu() as cpu:
            doc = asyncio.run(LiveSweep(cfg).run())
    finally:
        if srv is not None:
            srv.stop()
    p = doc.points[0]
    assert p.live is not None and p.live.token_check is not None
    return {"seed": seed, "valid": p.valid, "invalid_reason": p.invalid_reason,
            "requests": p.requests.completed,
            "output_tok_s_wall": round(p.output_tok_s * k, 1),
            "loop_lag_ms_p99": p.client.loop_lag_ms_p99,
            "loop_lag_ms_max": p.client.loop_lag_ms_max,
            "send_lag_ms_p99": p.client.send_lag_ms_p99,
            "token_check_mismatched": p.live.token_check.mismatched,
            "window_cpu": cpu.summary(args.warmup, args.duration),
            "holds": holds.table()[:8]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=64)
    ap.add_argument("--time-scale", type=float, default=3.0)
    ap.add_argument("--duration", type=float, default=30.0, help="window, wall seconds")
    ap.add_argument("--warmup", type=float, default=10.0, help="wall seconds")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lengths", choices=("sharegpt", "fixed"), default="sharegpt")
    ap.add_argument("--length-file", type=Path, help="JSON Lines of input_len/output_len "
                    "(instead of --lengths)")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--system-tokens", type=int, default=2048)
    ap.add_argument("--turns", type=int, default=1)
    ap.add_argument("--target", help="a running engine's URL instead of a simserver")
    ap.add_argument("--engine", default="vllm", help="with --target: its adapter")
    ap.add_argument("--model", default="qwen3-8b", help="the served model name")
    ap.add_argument("--telemetry", default="none", help="as chatfleet sweep --telemetry")
    ap.add_argument("--no-flush", dest="flush", action="store_false")
    ap.add_argument("--pin", action="store_true", help="the simserver on the first CPU, the "
                    "client and its prompt workers on the others")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    args.cpus = (({cpus[0]}, set(cpus[1:])) if args.pin and len(cpus) > 1 else (None, None))
    load = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="loop-lag-") as tmp:
        for i in range(args.repeat):
            r = run_once(args, args.seed + i, Path(tmp))
            runs.append(r)
            print(f"repeat {i + 1}: {r['output_tok_s_wall']:.0f} tok/s (wall), loop lag p99 "
                  f"{r['loop_lag_ms_p99']:.2f} ms (max {r['loop_lag_ms_max']:.1f}), send lag "
                  f"p99 {r['send_lag_ms_p99']:.2f} ms, valid {r['valid']}", flush=True)
            w = r["window_cpu"]
            if w:
                print(f"    window: {w['iterations']} loop iterations, {w['cpu_s']:.2f} s CPU, "
                      f"{w['over_2ms']} over 2 ms and {w['over_5ms']} over 5 ms (max "
                      f"{w['max_ms']:.1f}); collector {w['gc_passes']} passes, "
                      f"{w['gc_cpu_ms']:.0f} ms CPU (max {w['gc_max_ms']:.1f}, "
                      f"{w['gc_full_passes']} full)")
            for h in r["holds"][:5]:
                print(f"    {h['count']:5d} x  cpu p50 {h['cpu_ms_p50']:6.2f} max "
                      f"{h['cpu_ms_max']:7.2f} ms | wall p50 {h['wall_ms_p50']:6.2f} max "
                      f"{h['wall_ms_max']:7.2f} ms  {h['what']}")
    summary = {k: statistics.median(r[k] for r in runs)
               for k in ("output_tok_s_wall", "loop_lag_ms_p99", "send_lag_ms_p99")}
    print(f"median over {len(runs)}: {summary} (load average at start {load[0]:.2f})")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "loadavg_start": load, "runs": runs,
                                         "median": summary}, indent=1))


if __name__ == "__main__":
    main()
