"""What session affinity is worth where it matters (issue 23, item 3): sessions whose history
outgrows the shared prompt, through the gateway with affinity off, on (the default spill rule,
`cost`: a session leaves a full home when waiting costs more than recomputing its history;
`full`: whenever another replica has room, plain bounded-load) and strict (`never`: it always
waits for home), live (gateway + simserver replicas, wall clock) and in the twin (the same
core/fleet code in virtual time).

The workload: `--replicas` simserver replicas (FP8 Qwen3-8B on L4, time scale 1) behind the
gateway at `--cap`, a closed loop of `--users` in 8-turn sessions on the shared 2,048-token
prompt, 192 in / 256 out per turn (uniform, range ratio 0.5, vLLM's convention: the device
step's lengths), 3 s to think between turns (exponential), each request carrying its
session's X-Session-ID; a shed user waits its Retry-After and tries again. By the 4th turn a
session's history is longer than the shared prompt; the warm-up lets sessions get there
before the window opens.

Per mode: prefix-cache hit rate (cached / prompt tokens of the completed requests, from the
replicas' own usage), TTFT p50 / p99, goodput (requests meeting the target per second),
admitted attainment and attainment over attempts, the gateway's routes (hit, spill,
least_loaded), the most each replica's own trace held, and the replay check.

    python benchmarks/gateway_affinity.py [--modes off,cost,never] [--users 32] [--json FILE]

About 3.5 minutes of wall clock per live mode (warm-up 90 s, window 90 s, the drain); the
twin's figures for every mode take seconds. Fails (exit 1) when a request failed, a replica
held more than its cap, or a live decision did not replay. Figures: docs/gateway.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chatfleet.core.documents.sweep import ClosedLoad, SweepPoint
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, WorkloadConfig
from chatfleet.jobs.parity import run_fleet_parity
from chatfleet.twin.fleet import MEASURED_HOP_S, FleetConfig, run_fleet_point

SPEC = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
MODES = ("off", "cost", "full", "never")
NAMES = ["replica-0", "replica-1", "replica-2", "replica-3"]


def workload(args: argparse.Namespace) -> WorkloadConfig:
    return WorkloadConfig(system_prompt_tokens=2048,
                          lengths=LengthSpec("uniform", args.input_len, args.output_len, 0.5,
                                             "vllm"),
                          turns=args.turns, think_time_s=args.think)


def fleet(mode: str, args: argparse.Namespace) -> FleetConfig:
    return FleetConfig(replicas=args.replicas, cap=args.cap,
                       queue_depth=args.replicas * args.cap, ttft_budget_s=1.0,
                       hop_s=MEASURED_HOP_S, affinity=mode != "off",
                       spill="cost" if mode == "off" else mode)  # type: ignore[arg-type]


def figures(p: SweepPoint | None) -> dict[str, Any]:
    if p is None:
        return {}
    r = p.requests
    # the twin's admissions by routing rule over the whole run (live: the gateway's, below)
    routes = dict(p.fleet.routes or {}) if p.fleet is not None else {}
    return {"offered": r.offered, "completed": r.completed, "shed": r.shed,
            "failed": r.failed, "hit_rate": round(p.cached_token_share, 3),
            "ttft_ms_p50_p99": [round(p.ttft_ms.p50 or 0.0), round(p.ttft_ms.p99 or 0.0)],
            "goodput_rps": round(p.goodput_rps, 3),
            "admitted_attainment": round(p.admitted_attainment or 0.0, 4),
            "attainment": round(p.attainment or 0.0, 4), "routes": routes}


def twin(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    run = run_fleet_point(SPEC, workload(args), ClosedLoad(args.users), fleet(mode, args),
                          duration_s=args.duration, warmup_s=args.warmup, seed=args.seed,
                          replica_names=NAMES[:args.replicas])
    return figures(run.point)


def live(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        res = run_fleet_parity(SPEC, workload(args), ClosedLoad(args.users), fleet(mode, args),
                               duration_s=args.duration, warmup_s=args.warmup, seed=args.seed,
                               trace=Path(tmp) / "trace.jsonl", run_twin=False)
        wall = time.monotonic() - t0
    out = figures(res.live_point)
    out["routes"] = res.routes  # the gateway's, over the whole run
    out["max_in_flight_by_replicas"] = res.max_in_flight
    out["replay"] = res.replay_agreement
    out["wall_s"] = round(wall, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="off,cost,never", help="live modes (the twin runs all)")
    ap.add_argument("--users", type=int, default=32)
    ap.add_argument("--cap", type=int, default=16)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=192)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--think", type=float, default=3.0)
    ap.add_argument("--warmup", type=float, default=90.0)
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--no-live", action="store_true")
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args()
    if not 1 <= args.replicas <= len(NAMES):
        ap.error(f"--replicas must be 1 to {len(NAMES)}")
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    for mode in MODES:
        row: dict[str, Any] = {"mode": mode, "twin": twin(mode, args)}
        if not args.no_live and mode in args.modes.split(","):
            row["live"] = live(mode, args)
            lv = row["live"]
            if lv["failed"]:
                bad.append(f"{mode}: {lv['failed']} requests failed")
            if any(n > args.cap for n in lv["max_in_flight_by_replicas"].values()):
                bad.append(f"{mode}: a replica held more than {args.cap}")
            if lv["replay"] != 1.0:
                bad.append(f"{mode}: replay agreement {lv['replay']}")
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json:  # written after every mode: a run cut short keeps the finished ones
            Path(args.json).write_text(json.dumps(rows, indent=1))
    print()
    print("| affinity | side | hit rate | TTFT p50 / p99 ms | goodput rps | admitted "
          "attainment | attainment over attempts | shed / offered | routes |")
    print("|---|---|---:|---|---:|---:|---:|---|---|")
    for r in rows:
        for side in ("live", "twin"):
            f = r.get(side)
            if not f:
                continue
            routes = ", ".join(f"{k} {v}" for k, v in sorted(f["routes"].items()))
            print(f"| {r['mode']} | {side} | {f['hit_rate']:.3f} | {f['ttft_ms_p50_p99'][0]} / "
                  f"{f['ttft_ms_p50_p99'][1]} | {f['goodput_rps']:.2f} | "
                  f"{f['admitted_attainment']:.3f} | {f['attainment']:.3f} | "
                  f"{f['shed']} / {f['offered']} | {routes} |")
    if bad:
        print("\nNOT A MEASUREMENT OF THE ROUTING:\n  " + "\n  ".join(bad), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
