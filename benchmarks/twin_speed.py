"""How fast the twin runs: a point's cost beyond a short one, both engine models side by side,
fleet scaling, and `chatfleet plan`.

Usage: .venv/bin/python benchmarks/twin_speed.py [--repeat 5] [--engine-model sglang|vllm|both]
                                                  [--plan] [--no-fleet]

Each case is a 64-user closed-loop point of 600 virtual seconds (30 s warm-up included in the
600) on an L4 twin, timed end to end (workload, engine, records and the point's summary), and
the same point of 6 virtual seconds: the difference is what the 594 s of load cost, without
what every point costs once (building the engine, the summary's fixed part). Every figure is
the median of --repeat runs; the cases run interleaved (SGLang, vLLM, SGLang, ...) in one
process, so a ratio compares runs made under the same machine load. The load average over
the run is printed with the figures (this machine is shared: read the ratios first).

Fleet scaling runs k replicas with 64 k users (users pinned to replicas) and reports wall
time / k. --plan times `chatfleet plan --users 200` (the L4, its defaults) in-process.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import time
from collections.abc import Callable

from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.run import run_point

VIRTUAL_S = 600.0
SHORT_S = 6.0
WARMUP_S = 30.0


def timed(spec: EngineSpec, wcfg: WorkloadConfig, users: int, virtual_s: float = VIRTUAL_S,
          replicas: int = 1) -> float:
    warmup = min(WARMUP_S, virtual_s / 20)
    t = time.perf_counter()
    run_point(spec, wcfg, ClosedLoad(users),
              duration_s=virtual_s - warmup, warmup_s=warmup, replicas=replicas)
    return time.perf_counter() - t


def medians(cases: dict[str, Callable[[], float]], repeat: int) -> dict[str, float]:
    """Each case `repeat` times, interleaved; the median of each."""
    walls: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(repeat):
        for name, run in cases.items():
            walls[name].append(run())
    return {k: statistics.median(v) for k, v in walls.items()}


def plan_s() -> float:
    from chatfleet.cli import app

    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        app(["plan", "--users", "200", "--json"])
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--engine-model", default="both", choices=("sglang", "vllm", "both"))
    ap.add_argument("--plan", action="store_true", help="time chatfleet plan --users 200 too")
    ap.add_argument("--no-fleet", action="store_true", help="skip the fleet scaling table")
    args = ap.parse_args()
    models = ("sglang", "vllm") if args.engine_model == "both" else (args.engine_model,)
    gpu, model = get_gpu("l4"), builtin_model("qwen3-8b")
    workloads = {
        "fixed 512/128": WorkloadConfig(),
        "mixed (vllm uniform r=0.5)": WorkloadConfig(
            lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm")),
    }
    load_before = os.getloadavg()[0]
    print(f"64-user closed loop: {VIRTUAL_S:.0f} s virtual less a {SHORT_S:.0f} s point, "
          f"median of {args.repeat} (wall ms)")
    print(f"{'precision':9s} {'lengths':28s} " + " ".join(
        f"{m + ' 600 s':>11s} {m + ' beyond':>13s}" for m in models)
        + ("  vllm/sglang" if len(models) == 2 else ""))
    for prec in ("bf16", "fp8"):
        for name, wcfg in workloads.items():
            cases: dict[str, Callable[[], float]] = {}
            for em in models:
                spec = EngineSpec(gpu, model, precision(prec, prec), engine_model=em)
                cases[f"{em} long"] = lambda spec=spec, wcfg=wcfg: timed(spec, wcfg, 64)
                cases[f"{em} short"] = lambda spec=spec, wcfg=wcfg: timed(spec, wcfg, 64,
                                                                          SHORT_S)
            med = medians(cases, args.repeat)
            beyond = {em: med[f"{em} long"] - med[f"{em} short"] for em in models}
            cells = " ".join(f"{med[f'{em} long'] * 1000:11.1f} {beyond[em] * 1000:13.1f}"
                             for em in models)
            ratio = (f"  {beyond['vllm'] / beyond['sglang']:11.2f}"
                     if len(models) == 2 else "")
            print(f"{prec:9s} {name:28s} {cells}{ratio}")
    if models != ("vllm",) and not args.no_fleet:
        print("\nfleet scaling (SGLang, FP8, mixed lengths, 64 users per replica)")
        print(f"{'replicas':>8s} {'wall ms':>8s} {'wall ms / replica':>18s}")
        spec = EngineSpec(gpu, model, precision("fp8", "fp8"))
        wcfg = workloads["mixed (vllm uniform r=0.5)"]
        for k in (1, 2, 4, 8):
            med = medians({"k": lambda k=k: timed(spec, wcfg, 64 * k, replicas=k)},
                          max(1, args.repeat // 2))["k"]
            print(f"{k:8d} {med * 1000:8.1f} {med * 1000 / k:18.1f}")
    if args.plan:
        med = medians({"plan": plan_s}, max(1, args.repeat // 2))["plan"]
        print(f"\nchatfleet plan --users 200 (L4): {med:.2f} s wall, median of "
              f"{max(1, args.repeat // 2)}")
    print(f"\nload average (1 min): {load_before:.2f} before, {os.getloadavg()[0]:.2f} after, "
          f"on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
