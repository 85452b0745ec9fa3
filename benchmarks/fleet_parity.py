"""How far the live fleet (gateway + simserver replicas, wall clock) can agree with the twin's
fleet (the same core/fleet code, virtual time), request by request, and why.

For each trace (2 replicas, cap 4, queue 4, TTFT budget 1 s with 0.2 s kept for the prefill,
FP8 Qwen3-8B on L4, 256-token shared prompt, 64 in / 32 out tokens, 0.5 s to think):

- sensitivity: the twin against itself with the gateway-engine hop moved from 2.0 ms to 1.5,
  2.5 and 3.0 ms, and (open loops) with every session arrival moved by up to +-1 ms: the
  share of requests whose admit/shed decision stays the same, and of sessions whose first
  admitted turn keeps its replica. A wall-clock run jitters every event by about that much
  (send lag, emission lag, the relay), so it cannot be expected to agree better.
- live (with --live): the trace through `chatfleet gateway` in front of two simserver replicas
  (time scale 1), against the twin with a 2 ms hop (and with none): decision agreement,
  sessions whose first admitted turn went to the same replica, and the replay check (the
  gateway's traced core calls replayed through a fresh core Fleet: same decisions).

    python benchmarks/fleet_parity.py [--live] [--json FILE]

Takes about 20 s without --live, and 30-40 s of wall clock per live trace. Figures:
docs/gateway.md.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from chatfleet.core.documents.sweep import ClosedLoad, Load, OpenLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, OpenLoop, Workload, WorkloadConfig
from chatfleet.jobs.parity import _key, run_fleet_parity
from chatfleet.twin.fleet import FleetConfig, run_fleet_point

SPEC = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
NAMES = ["replica-0", "replica-1"]


def wcfg(turns: int, think: str = "exp") -> WorkloadConfig:
    return WorkloadConfig(system_prompt_tokens=256, lengths=LengthSpec("fixed", 64, 32),
                          turns=turns, think_time_s=0.5, think_dist=think)  # type: ignore[arg-type]


def fleet(hop_s: float) -> FleetConfig:
    return FleetConfig(replicas=2, cap=4, queue_depth=4, ttft_budget_s=1.0,
                       prefill_reserve_s=0.2, hop_s=hop_s)


def bursts(num_bursts: int, period_s: float, gap_s: float) -> list[float]:
    """Bursts of 20 sessions, `gap_s` apart, one every `period_s`, from 2 s on."""
    return [2.0 + b * period_s + i * gap_s for b in range(num_bursts) for i in range(20)]


# name, workload, load, duration, seed, arrival times
TRACES: list[tuple[str, WorkloadConfig, Load, float, int, list[float] | None]] = [
    ("Poisson 1.5 sessions/s x 2 turns", wcfg(2), OpenLoad(1.5), 20.0, 1,
     None),
    ("Poisson 3 sessions/s x 2 turns", wcfg(2), OpenLoad(3.0), 30.0, 1,
     None),
    ("Poisson 9 sessions/s x 1 turn", wcfg(1), OpenLoad(9.0), 20.0, 1,
     None),
    ("closed loop, 24 users (3x the cap)", wcfg(2), ClosedLoad(24),
     20.0, 1, None),
    ("bursts of 20 every 3 s, 4 ms apart x 2 turns", wcfg(2, "fixed"),
     OpenLoad(120 / 18.0), 18.0, 1, bursts(6, 3.0, 0.004)),
    # tests/gateway/test_overload_parity.py's trace: each burst meets an idle fleet
    ("bursts of 20 every 4.5 s, 20 ms apart x 2 turns", wcfg(2, "fixed"),
     OpenLoad(100 / 22.5), 22.5, 1, bursts(5, 4.5, 0.020)),
]


def outcomes(cfg: WorkloadConfig, load: Load, duration: float, seed: int,
             times: list[float] | None, hop_s: float) -> dict[str, str]:
    return {k: v[0] for k, v in placed(cfg, load, duration, seed, times, hop_s).items()}


def placed(cfg: WorkloadConfig, load: Load, duration: float, seed: int,
           times: list[float] | None, hop_s: float) -> dict[str, tuple[str, str | None]]:
    run = run_fleet_point(SPEC, cfg, load, fleet(hop_s), duration_s=duration, warmup_s=2.0,
                          seed=seed, replica_names=NAMES, arrival_times=times)
    return {_key(r.session_id, r.turn, r.request_id): (r.outcome, r.replica)
            for r in run.records}


def arrival_trace(cfg: WorkloadConfig, load: Load, duration: float,
                  seed: int) -> list[float]:
    """The session arrival times an open loop draws for this seed (what the twin and the
    live run both follow)."""
    assert isinstance(load, OpenLoad)
    loop = OpenLoop(Workload(cfg, random.Random(seed)), float(load.rate_rps),
                    float(load.burstiness or 1.0))
    out: list[float] = []
    t = 0.0
    while t < duration + 2.0:
        t = loop.next_arrival(t).scheduled_time
        out.append(t)
    return out


def jitter_check(cfg: WorkloadConfig, load: Load, duration: float, seed: int,
                 times: list[float] | None) -> tuple[float, str]:
    """The twin against itself with every session arrival moved by up to +-1 ms (uniform,
    order kept): decision agreement, and sessions whose first admitted turn kept its replica."""
    base_times = times if times is not None else arrival_trace(cfg, load, duration, seed)
    rng = random.Random(99)
    moved = sorted(t + rng.uniform(-0.001, 0.001) for t in base_times)
    a = placed(cfg, load, duration, seed, base_times, 0.002)
    b = placed(cfg, load, duration, seed, moved, 0.002)
    common = set(a) & set(b)
    same = sum(1 for k in common if (a[k][0] == "shed") == (b[k][0] == "shed"))

    def first(side: dict[str, tuple[str, str | None]]) -> dict[str, str]:
        out: dict[str, str] = {}
        for k in sorted(side):
            if side[k][0] != "shed" and side[k][1] is not None:
                out.setdefault(k.split("/", 1)[0], side[k][1] or "")
        return out

    fa, fb = first(a), first(b)
    both = set(fa) & set(fb)
    return same / len(common), f"{sum(1 for x in both if fa[x] == fb[x])}/{len(both)}"


def agreement(a: dict[str, str], b: dict[str, str]) -> float:
    common = set(a) & set(b)
    same = sum(1 for k in common if (a[k] == "shed") == (b[k] == "shed"))
    return same / len(common) if common else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--live", action="store_true", help="also run each trace live")
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for name, cfg, load, duration, seed, times in TRACES:
        base = outcomes(cfg, load, duration, seed, times, 0.002)
        row: dict[str, Any] = {
            "trace": name, "requests": len(base),
            "shed": sum(1 for v in base.values() if v == "shed"),
            "twin_vs_twin": {f"{h * 1000:g} ms": round(agreement(base, outcomes(
                cfg, load, duration, seed, times, h)), 3) for h in (0.0015, 0.0025, 0.003)},
        }
        if load.mode == "open":
            agree, sessions = jitter_check(cfg, load, duration, seed, times)
            row["twin_vs_twin_jitter_1ms"] = {"decisions": round(agree, 3),
                                              "sessions_same_replica": sessions}
        if args.live:
            with tempfile.TemporaryDirectory() as tmp:
                t0 = time.monotonic()
                res = run_fleet_parity(SPEC, cfg, load, fleet(0.002), duration_s=duration,
                                       warmup_s=2.0, seed=seed, trace=Path(tmp) / "t.jsonl",
                                       arrival_times=times)
                wall = time.monotonic() - t0
            no_hop = outcomes(cfg, load, duration, seed, times, 0.0)
            live = {k: v[0] for k, v in res.live.items()}
            same, both = res.same_session_replica()
            def share(side: dict[str, Any]) -> float:
                return round(sum(1 for v in side.values() if v[0] == "shed") / len(side), 3)

            row["live"] = {"vs_twin_hop_2ms": round(res.decision_agreement(), 3),
                           "shed_share_twin_live": f"{share(res.twin)} / {share(res.live)}",
                           "admitted_attainment_twin_live": (
                               f"{res.twin_point.admitted_attainment:.3f} / "
                               f"{res.live_point.admitted_attainment:.3f}"),
                           "vs_twin_no_hop": round(agreement(no_hop, live), 3),
                           "sessions_same_replica": f"{same}/{both}",
                           "replay": res.replay_agreement, "wall_s": round(wall, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    head = ("| trace | requests | shed | twin vs twin, hop 1.5 / 2.5 / 3 ms | twin vs twin, "
            "arrivals +-1 ms: decisions, sessions |")
    sep = "|---|---:|---:|---|---|"
    if args.live:
        head += (" live vs twin (2 ms hop) | live vs twin (no hop) | sessions on the same "
                 "replica | shed share twin / live | admitted attainment twin / live | replay |")
        sep += "---:|---:|---:|---:|---:|---:|"
    print(head)
    print(sep)
    for r in rows:
        jit = r.get("twin_vs_twin_jitter_1ms")
        jtext = f"{jit['decisions']}, {jit['sessions_same_replica']}" if jit else "n/a"
        line = (f"| {r['trace']} | {r['requests']} | {r['shed']} | "
                f"{' / '.join(str(v) for v in r['twin_vs_twin'].values())} | {jtext} |")
        if args.live:
            lv = r["live"]
            line += (f" {lv['vs_twin_hop_2ms']} | {lv['vs_twin_no_hop']} | "
                     f"{lv['sessions_same_replica']} | {lv['shed_share_twin_live']} | "
                     f"{lv['admitted_attainment_twin_live']} | {lv['replay']} |")
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
