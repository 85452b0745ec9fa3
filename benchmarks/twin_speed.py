"""How fast the twin runs: simulated seconds per wall second, and fleet scaling.

Usage: .venv/bin/python benchmarks/twin_speed.py [--repeat 5] [--engine-model sglang|vllm|both]

Each case is a 64-user closed-loop point of 600 virtual seconds (30 s warm-up included in the
600) on an L4 twin, timed end to end (workload, engine, records and the point's summary). The
figure reported is the median of --repeat runs, measured side by side in one process. Fleet
scaling runs k replicas with 64 k users (users pinned to replicas) and reports wall time / k.
"""

from __future__ import annotations

import argparse
import statistics
import time

from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.run import run_point

VIRTUAL_S = 600.0
WARMUP_S = 30.0


def timed(spec: EngineSpec, wcfg: WorkloadConfig, users: int, replicas: int = 1) -> float:
    t = time.perf_counter()
    run_point(spec, wcfg, ClosedLoad(users),
              duration_s=VIRTUAL_S - WARMUP_S, warmup_s=WARMUP_S, replicas=replicas)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--engine-model", default="both", choices=("sglang", "vllm", "both"))
    args = ap.parse_args()
    models = ("sglang", "vllm") if args.engine_model == "both" else (args.engine_model,)
    gpu, model = get_gpu("l4"), builtin_model("qwen3-8b")
    workloads = {
        "fixed 512/128": WorkloadConfig(),
        "mixed (vllm uniform r=0.5)": WorkloadConfig(
            lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm")),
    }
    print(f"64-user closed loop, {VIRTUAL_S:.0f} s virtual, median of {args.repeat}")
    print(f"{'model':7s} {'precision':9s} {'lengths':28s} {'wall ms':>8s} "
          f"{'sim s / wall s':>15s}")
    for prec in ("bf16", "fp8"):
        for name, wcfg in workloads.items():
            for em in models:
                spec = EngineSpec(gpu, model, precision(prec, prec), engine_model=em)
                walls = [timed(spec, wcfg, 64) for _ in range(args.repeat)]
                med = statistics.median(walls)
                print(f"{em:7s} {prec:9s} {name:28s} {med * 1000:8.1f} "
                      f"{VIRTUAL_S / med:15.0f}")
    if models == ("vllm",):
        return
    print("\nfleet scaling (FP8, mixed lengths, 64 users per replica)")
    print(f"{'replicas':>8s} {'wall ms':>8s} {'wall ms / replica':>18s}")
    spec = EngineSpec(gpu, model, precision("fp8", "fp8"))
    wcfg = workloads["mixed (vllm uniform r=0.5)"]
    for k in (1, 2, 4, 8):
        walls = [timed(spec, wcfg, 64 * k, replicas=k) for _ in range(max(1, args.repeat // 2))]
        med = statistics.median(walls)
        print(f"{k:8d} {med * 1000:8.1f} {med * 1000 / k:18.1f}")


if __name__ == "__main__":
    main()
