"""The gateway's promise to the users it lets in (issue 23, item 1): admitted attainment at
1.5x and 3x the fleet's cap, with the prefill reserve learned per replica against the fixed
one, live (gateway + simserver replicas, wall clock) and in the twin (the same core/fleet code
in virtual time), with attainment over attempts beside it.

Each run: `--replicas` simserver replicas (FP8 Qwen3-8B on L4, time scale 1) behind
`chatfleet gateway --cap CAP`, a closed loop of users (1.5x and 3x replicas x cap) in
multi-turn sessions on the shared 2,048-token prompt (uniform 256 in / 128 out, range ratio
0.5, vLLM's convention, as benchmarks/device/vllm_h200.sh's gateway step), each session's
requests carrying X-Session-ID; a shed user waits its Retry-After and tries again (a new
attempt). Per mode:

- learned: the default gateway config (reserve learned, prefill_reserve_s 0 its prior);
- fixed: `reserve.learn: false`, prefill_reserve_s 0 (the gateway's default before issue 23).

Reported per run: attempts (offered), admitted, shed; admitted attainment (met / admitted)
and attainment over attempts (met / offered), live and twin; the live TTFT p50 / p99; the
gateway's own count of streams whose first chunk came within the budget; each replica's
learned reserve at the end (gateway, twin); the most requests each replica's own trace held;
the share of the gateway's decisions that replay exactly through the core.

    python benchmarks/gateway_promise.py [--cap 16] [--duration 30] [--json FILE]

About 45 s of wall clock per live run (4 by default). The run fails (exit 1) if a request
failed, a replica held more than its cap, or a live decision does not replay: the figures
would not measure the admission rule. Figures: docs/gateway.md.
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
from chatfleet.twin.fleet import MEASURED_HOP_S, FleetConfig

SPEC = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))


def workload(turns: int) -> WorkloadConfig:
    return WorkloadConfig(system_prompt_tokens=2048,
                          lengths=LengthSpec("uniform", 256, 128, 0.5, "vllm"), turns=turns,
                          think_time_s=0.0)


def figures(p: SweepPoint | None) -> dict[str, Any]:
    if p is None:
        return {}
    r = p.requests
    return {"offered": r.offered, "admitted": r.admitted, "shed": r.shed, "failed": r.failed,
            "met": r.met_slo, "admitted_attainment": round(p.admitted_attainment or 0.0, 4),
            "attainment": round(p.attainment or 0.0, 4),
            "ttft_ms_p50_p99": [round(p.ttft_ms.p50 or 0.0), round(p.ttft_ms.p99 or 0.0)],
            "goodput_rps": round(p.goodput_rps, 3)}


def run(mode: str, users: int, args: argparse.Namespace) -> dict[str, Any]:
    fleet = FleetConfig(replicas=args.replicas, cap=args.cap,
                        queue_depth=args.replicas * args.cap, ttft_budget_s=1.0,
                        prefill_reserve_s=args.prior, hop_s=MEASURED_HOP_S,
                        learn_reserve=mode == "learned")
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        res = run_fleet_parity(SPEC, workload(args.turns), ClosedLoad(users), fleet,
                               duration_s=args.duration, warmup_s=args.warmup, seed=args.seed,
                               trace=Path(tmp) / "trace.jsonl")
        wall = time.monotonic() - t0
    twin_reserves = (res.twin_point.fleet.reserve_s if res.twin_point is not None
                     and res.twin_point.fleet is not None else None)
    met, streams = res.gateway_ttft_met
    lag = sorted(res.drive.loop_lag_ms) or [0.0]
    return {"mode": mode, "users": users, "live": figures(res.live_point),
            "twin": figures(res.twin_point),
            "gateway_ttft_within_budget": f"{met}/{streams}",
            "reserve_s": {"live": {k: round(v, 3) for k, v in res.reserves.items()},
                          "twin": dict(twin_reserves or {})},
            "max_in_flight_by_replicas": res.max_in_flight,
            "replay": res.replay_agreement,
            "client_loop_lag_ms_p99": round(lag[int(0.99 * (len(lag) - 1))], 1),
            "wall_s": round(wall, 1)}


def problems(row: dict[str, Any], cap: int) -> list[str]:
    out = []
    if row["live"].get("failed"):
        out.append(f"{row['live']['failed']} requests failed")
    if any(n > cap for n in row["max_in_flight_by_replicas"].values()):
        out.append(f"a replica held more than {cap}: {row['max_in_flight_by_replicas']}")
    if row["replay"] != 1.0:
        out.append(f"replay agreement {row['replay']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cap", type=int, default=16)
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--loads", default="1.5,3", help="users, as multiples of the fleet's cap")
    ap.add_argument("--modes", default="learned,fixed")
    ap.add_argument("--prior", type=float, default=0.0, help="prefill_reserve_s")
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    for factor in (float(x) for x in args.loads.split(",")):
        users = round(factor * args.replicas * args.cap)
        for mode in args.modes.split(","):
            row = run(mode, users, args)
            row["load"] = f"{factor:g}x"
            rows.append(row)
            print(json.dumps(row), flush=True)
            bad += [f"{mode} at {factor:g}x: {p}" for p in problems(row, args.cap)]
            if args.json:  # written after every run: a run cut short keeps the finished ones
                Path(args.json).write_text(json.dumps(rows, indent=1))
    print()
    print("| load | reserve | attempts | admitted | met the target | admitted attainment live "
          "/ twin | attainment over attempts live / twin | TTFT p50 / p99 ms (live) | "
          "gateway: first chunk within 1 s, whole run | learned reserve s, live / twin |")
    print("|---|---|---:|---:|---:|---|---|---|---|---|")
    for r in rows:
        lv, tw = r["live"], r["twin"]
        res = r["reserve_s"]
        reserve = ("-" if r["mode"] == "fixed" else
                   f"{'/'.join(str(v) for v in res['live'].values())} / "
                   f"{'/'.join(str(v) for v in res['twin'].values())}")
        print(f"| {r['load']} ({r['users']} users) | {r['mode']} | {lv['offered']} | "
              f"{lv['admitted']} | {lv['met']} | **{lv['admitted_attainment']:.3f}** / "
              f"{tw['admitted_attainment']:.3f} | {lv['attainment']:.3f} / "
              f"{tw['attainment']:.3f} | {lv['ttft_ms_p50_p99'][0]} / "
              f"{lv['ttft_ms_p50_p99'][1]} | {r['gateway_ttft_within_budget']} | {reserve} |")
    if bad:
        print("\nNOT A MEASUREMENT OF THE RULE:\n  " + "\n  ".join(bad), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
