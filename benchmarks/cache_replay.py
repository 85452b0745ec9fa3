"""How fast `chatfleet cache` replays: the default grid on the twin's scheduler.

Usage: .venv/bin/python benchmarks/cache_replay.py [--repeat 5]

The case is `chatfleet cache --sessions 24 --turns 8 --pool 8192,16384 --policy
lru,lfu,fifo,slru` (seed 1, L4, BF16): the synthetic trace, the unbounded reference replay and
the 8 replays of the grid, in one process, without the CLI's start-up. Each figure is the median
of --repeat runs; per configuration, the median replay time and the scheduler's steps.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from chatfleet.core.cache.recommend import summarize
from chatfleet.core.cache.replay import CacheConfig, unbounded_pool
from chatfleet.core.cache.trace import SyntheticConfig, synthetic_trace
from chatfleet.core.engine.build import EngineSpec, step_time_model
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.twin.cache_replay import Replay

POOLS = (8192, 16384)
POLICIES = ("lru", "lfu", "fifo", "slru")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("bf16", "bf16"))
    grid = [CacheConfig(p, pol) for p in POOLS for pol in POLICIES]
    totals: list[float] = []
    per: dict[CacheConfig, list[float]] = {c: [] for c in grid}
    steps: dict[CacheConfig, int] = {}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        trace = synthetic_trace(SyntheticConfig(), random.Random(1), step_time_model(spec))
        Replay(trace, CacheConfig(unbounded_pool(trace)), spec).run()
        for cfg in grid:
            t = time.perf_counter()
            r = Replay(trace, cfg, spec)
            summarize(r.run())
            per[cfg].append(time.perf_counter() - t)
            steps[cfg] = len(r.scheduler.log)
        totals.append(time.perf_counter() - t0)
    print(f"chatfleet cache default grid (24 sessions x 8 turns, 8 configurations), median of "
          f"{args.repeat}: {statistics.median(totals) * 1000:.0f} ms")
    print(f"{'pool':>6s} {'policy':6s} {'replay ms':>10s} {'steps':>7s}")
    for cfg in grid:
        print(f"{cfg.pool_tokens:6d} {cfg.policy:6s} {statistics.median(per[cfg]) * 1000:10.1f} "
              f"{steps[cfg]:7d}")


if __name__ == "__main__":
    main()
