"""Sample engine replicas' own gauges while a load runs behind the gateway: requests running and
waiting, and the prefix-cache counters, every `--every` seconds, until SIGINT/SIGTERM or
`--seconds`. Writes one JSON line per sample to --out and prints a summary (JSON) at the end:
each replica's largest running count (the cap, read from the engine itself) and its prefix-cache
hit rate over the sampled span (hits / queries, from the counters' deltas).

Usage (device run, vLLM replicas on 8002 and 8003):
    python3 benchmarks/device/replica_sampler.py --engine vllm --url http://127.0.0.1:8002 \
        --url http://127.0.0.1:8003 --out samples.jsonl --summary summary.json &
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp

from chatfleet.engines import get_adapter
from chatfleet.engines.prom import MetricsUnavailable, fetch_metrics


async def sample(args: argparse.Namespace) -> dict[str, Any]:
    names = get_adapter(args.engine).metric_names
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    first: dict[str, dict[str, float | None]] = {}
    last: dict[str, dict[str, float | None]] = {}
    peak: dict[str, float] = dict.fromkeys(args.url, 0.0)
    peak_waiting: dict[str, float] = dict.fromkeys(args.url, 0.0)
    failures = 0
    end = time.monotonic() + args.seconds
    with open(args.out, "w") as f:
        async with aiohttp.ClientSession() as session:
            while not stop.is_set() and time.monotonic() < end:
                t = time.time()
                for url in args.url:
                    try:
                        m = await fetch_metrics(session, url)
                    except (MetricsUnavailable, aiohttp.ClientError, TimeoutError):
                        failures += 1
                        continue
                    row = {"running": m.first_of(names.running),
                           "waiting": m.first_of(names.queue),
                           "queries": m.first_of(names.prefix_queries),
                           "hits": m.first_of(names.prefix_hits)}
                    first.setdefault(url, row)
                    last[url] = row
                    peak[url] = max(peak[url], row["running"] or 0.0)
                    peak_waiting[url] = max(peak_waiting[url], row["waiting"] or 0.0)
                    f.write(json.dumps({"t": t, "url": url, **row}) + "\n")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), args.every)
    replicas = {}
    for url in args.url:
        a, b = first.get(url, {}), last.get(url, {})
        dq = (b.get("queries") or 0.0) - (a.get("queries") or 0.0)
        dh = (b.get("hits") or 0.0) - (a.get("hits") or 0.0)
        replicas[url] = {"max_running": peak[url], "max_waiting": peak_waiting[url],
                         "prefix_queries": dq, "prefix_hits": dh,
                         "prefix_hit_rate": round(dh / dq, 4) if dq > 0 else None}
    dq = sum(r["prefix_queries"] for r in replicas.values())
    dh = sum(r["prefix_hits"] for r in replicas.values())
    return {"replicas": replicas, "failures": failures,
            "prefix_hit_rate": round(dh / dq, 4) if dq > 0 else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="vllm")
    ap.add_argument("--url", action="append", required=True)
    ap.add_argument("--every", type=float, default=0.1)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--summary", type=Path, required=True)
    args = ap.parse_args()
    summary = asyncio.run(sample(args))
    args.summary.write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
