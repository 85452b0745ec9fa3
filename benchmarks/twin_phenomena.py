"""The figures behind each phenomenon the twin must show (tests/twin/test_phenomena.py asserts
them; this prints them for docs/twin.md).

Usage: .venv/bin/python benchmarks/twin_phenomena.py
"""

from __future__ import annotations

from typing import Any

from chatfleet.core.documents.sweep import ClosedLoad, SweepPoint
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.twin.run import PointRun, run_point

MIXED = LengthSpec("uniform", 512, 128, 0.5, "vllm")


def engine(prec: str, **kw: Any) -> EngineSpec:
    return EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision(prec, prec), **kw)


def closed(spec: EngineSpec, users: int, wcfg: WorkloadConfig | None = None,
           duration: float = 300.0, warmup: float = 30.0) -> PointRun:
    return run_point(spec, wcfg or WorkloadConfig(), ClosedLoad(users),
                     duration_s=duration, warmup_s=warmup)


def line(tag: str, p: SweepPoint) -> str:
    e = p.engine
    return (f"{tag:44s} attain {p.attainment:.3f}  tok/s {p.output_tok_s:6.1f}  "
            f"TTFT p50 {p.ttft_ms.p50:7.0f} ms  TPOT p50 {p.tpot_ms.p50:5.0f} ms  "
            f"running {e.max_running:3d}  queue {e.max_queue:3d}  "
            f"usage {e.peak_token_usage:.2f}")


def main() -> None:
    print("1. 64 users, fixed 512/128, shared 2,048-token prompt")
    for prec in ("fp8", "bf16"):
        print(line(f"   {prec}", closed(engine(prec), 64).point))
    print("2. waves: FP8, fixed lengths against uniform 512/128 +-50% (same means)")
    for users in (16, 32, 64):
        f = closed(engine("fp8"), users).point
        m = closed(engine("fp8"), users, WorkloadConfig(lengths=MIXED)).point
        ratio = f.ttft_ms.p50 / m.ttft_ms.p50
        print(f"   {users} users: median TTFT fixed {f.ttft_ms.p50:.0f} ms, mixed "
              f"{m.ttft_ms.p50:.0f} ms, ratio {ratio:.1f}")
    print("3. throughput against attainment, FP8, mixed lengths")
    for users in (4, 8, 16, 32, 64):
        print(line(f"   {users} users", closed(engine("fp8"), users,
                                              WorkloadConfig(lengths=MIXED)).point))
    print("4. multi-turn (24 users x 8 turns, 32-token messages, 64-token answers half reasoning,"
          " think 10 s): share of the history found cached, turns 4-7")
    wcfg = WorkloadConfig(lengths=LengthSpec("uniform", 32, 64, 0.5, "vllm"), turns=8,
                          think_time_s=10.0, reasoning_share=0.5)
    for pool in (8192, 16384):
        run = closed(engine("fp8", pool_tokens=pool), 24, wcfg, duration=600.0, warmup=0.0)
        cached = sum(max(0, r.cached_tokens - 2048) for r in run.records
                     if r.outcome == "ok" and r.turn >= 4)
        total = sum(r.prompt_tokens - 2048 for r in run.records
                    if r.outcome == "ok" and r.turn >= 4)
        print(f"   pool {pool}: history hit share {cached / total:.2f}")
    print("5. prompt groups (BF16, 4 users, mixed lengths)")
    for groups, host in ((4, 0), (32, 0), (32, 200_000)):
        p = closed(engine("bf16", host_pool_tokens=host), 4,
                   WorkloadConfig(prompt_groups=groups, lengths=MIXED), warmup=60.0).point
        print(line(f"   {groups} groups, host tier {host} tokens", p))
    print("6. engine cap below the load (FP8, 32 users, mixed lengths)")
    for cap in (None, 16):
        p = closed(engine("fp8", max_running_requests=cap), 32,
                   WorkloadConfig(lengths=MIXED)).point
        print(line(f"   --max-running-requests {cap}", p))


if __name__ == "__main__":
    main()
