"""How long `chatfleet plan --trace` takes on a day of traffic, and in how much memory, side by
side with `chatfleet plan --users` at the same peak (docs/plan.md, issue 25 item 3).

Usage: .venv/bin/python benchmarks/plan_trace.py [--sessions 250000] [--keep DIR]
                                                  [--precisions bf16,fp8] [--no-users]

1. A synthetic day (core/traffic/synthetic.py: sessions through the day with a peak in the
   afternoon three times the night's rate, four turns a session on average, 30 s to think)
   is written in the trace format; its lines are counted.
2. `chatfleet plan --trace FILE --json` runs as a fresh process (its workers spawned by it);
   its wall time, its CPU (the process and its workers) and its memory (the largest resident
   set of the whole process tree, sampled every 0.2 s, and the largest single process's peak
   from the kernel) are measured.
3. `chatfleet plan --users P --json` runs the same way, P the trace's peak of open sessions
   as the trace answer reports it (`target_users`).

The load average is printed with the figures: this machine is shared (read the ratio first).
A plan that fails, or answers with no recommendation, fails the benchmark (exit 1).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from chatfleet.core.traffic.synthetic import DayShape, day_trace
from chatfleet.data.traffic import write_trace

CHATFLEET = str(Path(sys.executable).with_name("chatfleet"))


def tree_rss_bytes(root: int) -> int:
    """The resident set of `root` and every process below it (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            statm = Path(f"/proc/{entry}/statm").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
        rss[int(entry)] = int(statm.split()[1]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def measured(argv: list[str]) -> dict[str, Any]:
    """Run `argv` as a fresh process: wall s, CPU s (it and its children), the largest
    resident set of its process tree (sampled), the largest single process's peak RSS, its
    exit code and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE)
        peak = [0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                peak[0] = max(peak[0], tree_rss_bytes(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, err = proc.communicate()
        stop.set()
        sampler.join()
        wall = time.perf_counter() - t0
        out.seek(0)
        stdout = out.read()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"argv": argv, "rc": proc.returncode, "wall_s": wall,
            "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "tree_rss_mib": peak[0] / 2**20, "max_process_rss_mib": after.ru_maxrss / 1024,
            "stdout": stdout, "stderr": err.decode(errors="replace")}


def plan_doc(run: dict[str, Any], what: str) -> dict[str, Any]:
    if run["rc"] != 0:
        sys.exit(f"FAILED: {what} exited {run['rc']}: {run['stderr'].strip()[-2000:]}")
    doc: dict[str, Any] = json.loads(run["stdout"])
    if doc.get("recommendation") is None:
        sys.exit(f"FAILED: {what} recommends nothing: {doc.get('why_none')}")
    return doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=250_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", type=Path, default=None, help="write the trace and plans here")
    ap.add_argument("--precisions", default="bf16,fp8")
    ap.add_argument("--no-users", action="store_true", help="skip plan --users")
    args = ap.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="plan-trace-"))
    work.mkdir(parents=True, exist_ok=True)
    trace = work / "day.jsonl"
    t0 = time.perf_counter()
    lines = write_trace(trace, day_trace(DayShape(sessions=args.sessions),
                                         random.Random(args.seed)))
    print(f"trace: {lines:,} lines, {args.sessions:,} sessions over a day, "
          f"{trace.stat().st_size / 2**20:.0f} MiB, written in {time.perf_counter() - t0:.1f} s")
    load0 = os.getloadavg()[0]
    common = ["--json", "--precisions", args.precisions]
    tr = measured([CHATFLEET, "plan", "--trace", str(trace), *common])
    tdoc = plan_doc(tr, "plan --trace")
    (work / "plan-trace.json").write_bytes(tr["stdout"])
    rec = tdoc["recommendation"]
    users = int(tdoc["target_users"])
    rows = [("plan --trace (a day)", tr, rec)]
    if not args.no_users:
        ur = measured([CHATFLEET, "plan", "--users", str(users), *common])
        udoc = plan_doc(ur, "plan --users")
        (work / "plan-users.json").write_bytes(ur["stdout"])
        rows.append((f"plan --users {users}", ur, udoc["recommendation"]))
    load1 = os.getloadavg()[0]
    print(f"load average {load0:.1f} at the start, {load1:.1f} at the end; "
          f"{os.cpu_count()} CPUs")
    print("| run | wall s | CPU s | peak RSS, tree (MiB) | peak RSS, one process (MiB) "
          "| answer |")
    print("|---|---|---|---|---|---|")
    for name, run, r in rows:
        print(f"| {name} | {run['wall_s']:.1f} | {run['cpu_s']:.1f} | "
              f"{run['tree_rss_mib']:.0f} | {run['max_process_rss_mib']:.0f} | "
              f"{r['precision']}, cap {r['gateway_cap']}, {r['cards']} cards |")
    if len(rows) == 2:
        print(f"ratio (trace / users): wall {tr['wall_s'] / rows[1][1]['wall_s']:.1f}x")
    t = tdoc["trace"]
    print(f"trace answer: peak {users} users open; {t['lines']:,} lines in {t['segments']} "
          f"segments; doubled: {t['precisions'][rec['precision']]['doubled'].get('replicas')} "
          f"replicas")


if __name__ == "__main__":
    main()
