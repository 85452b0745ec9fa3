"""Two versions of chatfleet side by side: the 64-user FP8 mixed-length point's cost beyond a
6-s point, and `chatfleet plan --users 200`, each version in fresh processes, alternating, so
both see the same machine load.

Usage (an old version checked out beside this one):
    git worktree add --detach /tmp/old 57ac46e
    .venv/bin/python benchmarks/twin_speed_ab.py /tmp/old/src src [--rounds 5] [--plan-rounds 3]

A version older than the typed documents gets the load as the dict it read then.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# The point both this benchmark and twin_instructions.py measure: `run(virtual_s)` runs the
# 64-user FP8 mixed-length point of `virtual_s` virtual seconds (its warm-up included)
POINT_SETUP = r'''
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.run import run_point
try:
    from chatfleet.core.documents.sweep import ClosedLoad
    load = ClosedLoad(64)
except ImportError:  # a version older than the typed documents
    load = {"mode": "closed", "concurrency": 64}
spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
wcfg = WorkloadConfig(lengths=LengthSpec("uniform", 512, 128, 0.5, "vllm"))
def run(virtual_s):
    warmup = min(30.0, virtual_s / 20)
    run_point(spec, wcfg, load, duration_s=virtual_s - warmup, warmup_s=warmup)
'''
POINT = POINT_SETUP + r'''
import json, time
def timed(virtual_s):
    t = time.perf_counter()
    run(virtual_s)
    return time.perf_counter() - t
timed(6.0)
print(json.dumps([(timed(600.0), timed(6.0)) for _ in range(3)]))
'''
PLAN = ("import sys\nfrom chatfleet.cli.app import app\n"
        "sys.argv = ['chatfleet', 'plan', '--users', '200', '--json']\napp()")


def child(src: str, code: str) -> str:
    """What `code` prints, run in a fresh process with `src` (a version's src folder) first
    on the path; a failure ends the benchmark with its error."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         cwd="/", check=False)
    if out.returncode:
        sys.exit(f"{src}: {out.stderr[-1500:]}")
    return out.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=5, help="point rounds (3 pairs each)")
    ap.add_argument("--plan-rounds", type=int, default=3)
    args = ap.parse_args()
    srcs = {"old": args.old, "new": args.new}
    beyond: dict[str, list[float]] = {k: [] for k in srcs}
    for _ in range(args.rounds):
        for k, src in srcs.items():
            beyond[k] += [a - b for a, b in json.loads(child(src, POINT))]
    plan: dict[str, list[float]] = {k: [] for k in srcs}
    for _ in range(args.plan_rounds):
        for k, src in srcs.items():
            t = time.perf_counter()
            child(src, PLAN)
            plan[k].append(time.perf_counter() - t)
    for k in srcs:
        line = f"{k}:"
        if beyond[k]:
            line += (f" 600-s point beyond a 6-s one {statistics.median(beyond[k]) * 1000:.1f} ms"
                     f" (n={len(beyond[k])})")
        if plan[k]:
            line += f" plan --users 200 {statistics.median(plan[k]):.2f} s (n={len(plan[k])})"
        print(line)
    ratios = [f"{name} {statistics.median(runs['new']) / statistics.median(runs['old']):.2f}"
              for name, runs in (("point", beyond), ("plan", plan)) if runs["new"]]
    print(f"new / old: {', '.join(ratios)}; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
