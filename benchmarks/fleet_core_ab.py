"""Two versions of chatfleet side by side on the four fleet runs of `chatfleet plan --users 200`
(the doubled-traffic hour, thermal off and on: the gateway's admission and routing in front of
the twin's engines), each version in fresh processes, alternating, so both see the same load.

Each child captures the plan's fleet runs (after the plan's own sweeps) and reports, per run,
in CPU seconds (process time: on a shared machine it moves less with the other jobs than the
wall clock does):
- `run_s`: the run in-process (engines, workload and fleet core together);
- `core_s`: the fleet core alone: the run's calls on `Fleet` recorded once, then replayed into a
  fresh `Fleet` (best of three), with the reads the twin makes after each batch;
- a digest of every decision the replay made. The two versions' digests must be equal: a
  faster fleet core that decides differently is a bug, and the script exits non-zero.

Usage (an old version checked out beside this one):
    git worktree add --detach /tmp/old main
    .venv/bin/python benchmarks/fleet_core_ab.py /tmp/old/src src [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from twin_speed_ab import child  # benchmarks/: a child process on a version's src

CHILD = r'''
import gc, hashlib, importlib, json, time
import chatfleet.jobs.plan as P
from chatfleet.core.engine.build import build_engine
from chatfleet.core.fleet.fleet import Fleet, FleetSettings, FleetTrace
from chatfleet.core.specs import builtin_model, get_gpu
from chatfleet.twin.fleet import run_fleet_point

runs = []
class Captured(Exception):
    pass
def capture(fleet_runs, *_):  # the plan's worker pool and tick, where a version has them
    runs.extend(fleet_runs)
    raise Captured
P.run_fleet_runs = capture
try:
    P.make_plan(P.PlanRequest(get_gpu("l4"), builtin_model("qwen3-8b"), 200))
except Captured:
    pass

def replay(calls, caps, settings, step):
    fleet = Fleet(caps, settings, step)
    out = []
    for now, name, args, kwargs in calls:
        result = getattr(fleet, name)(*args, now, **kwargs)
        if isinstance(result, list):
            out.extend(result)
            fleet.ac.queue_depth(), fleet.ac.next_deadline()
    return out

rows = []
for r in runs:
    t = time.process_time()
    r.point()
    run_s = time.process_time() - t
    trace = FleetTrace()  # the same run again, its calls on Fleet recorded
    home = importlib.import_module(type(r).__module__)  # jobs.plan, or jobs.plan_tasks
    home.run_fleet_point = lambda *a, **k: run_fleet_point(*a, trace=trace, **k)
    r.point()
    home.run_fleet_point = run_fleet_point
    names = [f"twin-{i}" for i in range(r.fleet.replicas)]
    settings = FleetSettings(queue_depth=r.fleet.queue_depth,
                             ttft_budget_s=r.fleet.ttft_budget_s,
                             prefill_reserve_s=r.fleet.prefill_reserve_s,
                             affinity=r.fleet.affinity,
                             shared_prefix_tokens=r.wcfg.system_prompt_tokens)
    caps = {n: r.fleet.cap for n in names}
    step = build_engine(r.spec).step_model
    best = float("inf")
    gc.disable()  # as the twin's loop runs
    for _ in range(3):
        t = time.process_time()
        decisions = replay(trace.calls, caps, settings, step)
        best = min(best, time.process_time() - t)
    gc.enable()
    # every field of every decision, read by name (a Decision's repr differs between versions)
    digest = hashlib.sha256(repr([
        (d.request.request_id, d.outcome, d.at, d.replica, d.deadline, d.reason,
         d.retry_after_s, d.retry_after_ms) for d in decisions]).encode()).hexdigest()[:16]
    rows.append({"run_s": run_s, "core_s": best, "calls": len(trace.calls),
                 "decisions": len(decisions), "digest": digest})
print(json.dumps(rows))
'''


def runs_of(src: str) -> list[dict[str, float | str]]:
    rows: list[dict[str, float | str]] = json.loads(child(src, CHILD))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    srcs = {"old": args.old, "new": args.new}
    seen: dict[str, list[list[dict[str, float | str]]]] = {k: [] for k in srcs}
    for _ in range(args.rounds):
        for k, src in srcs.items():
            seen[k].append(runs_of(src))
    digests = {k: [row["digest"] for row in rounds[0]] for k, rounds in seen.items()}
    if digests["old"] != digests["new"]:
        sys.exit(f"the versions decide differently: {digests}")

    def medians(k: str, field: str) -> list[float]:
        return [statistics.median(float(rnd[i][field]) for rnd in seen[k])
                for i in range(len(seen[k][0]))]

    def sums(k: str, field: str) -> float:
        return statistics.median(sum(float(row[field]) for row in rnd) for rnd in seen[k])

    for field in ("run_s", "core_s"):
        for k in srcs:
            per_run = ", ".join(f"{v:.3f}" for v in medians(k, field))
            print(f"{k} {field}: [{per_run}] sum {sums(k, field):.3f} (n={args.rounds})")
        ratios = ", ".join(f"{n / o:.2f}" for n, o in zip(medians("new", field),
                                                          medians("old", field), strict=True))
        print(f"new / old {field}: [{ratios}] sum {sums('new', field) / sums('old', field):.2f}")
    print(f"decisions identical ({', '.join(str(d) for d in digests['new'])}); "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
