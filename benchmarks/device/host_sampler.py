"""Sample the host's CPUs while engines run: per-core busy and steal shares from /proc/stat, and
the CPU seconds of the processes whose command line matches --match (the vLLM API servers and
engine cores), every --every seconds until SIGINT/SIGTERM or --seconds. One JSON line a sample.

Why: vLLM in eager mode is bound by its host (Python launches every kernel), so a step's time
follows the CPU it gets. A virtual machine's vCPU can be taken by its host ("steal"), and the
runs of 2026-12-03 flipped between ~25 and ~47 ms steps at a fixed batch for seconds at a time,
with the GPU's clock steady and its power lower in the slow spells. This records what the CPUs
did, so a sweep's noise can be told from the engine's behaviour.

Usage (device run): python3 benchmarks/device/host_sampler.py --out host.jsonl \
    --match vllm --seconds 900 &
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_times() -> dict[str, list[int]]:
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *vals = line.split()
            out[name] = [int(v) for v in vals]
    return out


def proc_seconds(match: str) -> dict[str, float]:
    """CPU seconds (user + system) of each matching process, by 'pid:name'."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if match not in cmd:
                continue
            stat = (d / "stat").read_text()
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[f"{d.name}:{name}"] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        except (OSError, ValueError, IndexError):
            continue
    return out


def shares(before: list[int], after: list[int]) -> dict[str, float]:
    d = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(d) or 1
    idle = d[3] + (d[4] if len(d) > 4 else 0)
    steal = d[7] if len(d) > 7 else 0
    return {"busy": round((total - idle - steal) / total, 3), "steal": round(steal / total, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--every", type=float, default=1.0)
    ap.add_argument("--seconds", type=float, default=900.0)
    ap.add_argument("--match", default="vllm")
    args = ap.parse_args()
    stop = False

    def end(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, end)
    signal.signal(signal.SIGTERM, end)
    t0 = time.monotonic()
    cpus, procs = cpu_times(), proc_seconds(args.match)
    with args.out.open("w") as f:
        while not stop and time.monotonic() - t0 < args.seconds:
            time.sleep(args.every)
            now_cpus, now_procs = cpu_times(), proc_seconds(args.match)
            row = {"t": round(time.time(), 3),
                   "cpus": {c: shares(cpus[c], v) for c, v in now_cpus.items() if c in cpus},
                   "procs": {p: round((s - procs.get(p, s)) / args.every, 3)
                             for p, s in now_procs.items()}}
            f.write(json.dumps(row) + "\n")
            f.flush()
            cpus, procs = now_cpus, now_procs


if __name__ == "__main__":
    main()
