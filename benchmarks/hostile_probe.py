"""Issue 23's hostile-client probe, against real processes: one simserver process of two
replicas behind one `chatfleet gateway` (cap 4 each), all on 127.0.0.1.

    .venv/bin/python benchmarks/hostile_probe.py [--src DIR] [--json FILE]

--src runs the gateway from another checkout's src/ (PYTHONPATH), e.g. main exported with
`git archive main src | tar -x -C /tmp/main`, so that the figures before and after a change
come from the same machine in the same hour (the simserver always runs this checkout, its
compiled core included). Each probe:

- **big body**: one 3.9 MB body of 130,000 one-word messages; then 8 at once. The gateway's
  answers, its event loop's longest stall (a /health poll every 10 ms from a thread: its
  longest answer), its peak resident memory (VmHWM) over its memory before, and the
  replicas' ejections (`ejections_total`).
- **empty arrays**: one 3.8 MB body of 1.3 million empty arrays in an unknown field: the
  gateway's answer and its loop's longest stall (the JSON decode).
- **non-readers**: 8 streams of 2,000 tokens whose clients never read (4 KiB receive
  buffers), on the fleet's 8 slots: how long until the gateway's in-flight count is 0 again
  (bounded at 90 s), and its stalled/slow client counts.
- **n**: a chat request with n = 4: the status, and what the replica saw.
- **server**: the `Server` header of /health and of a chat answer.

This machine has 2 cores shared with other work: the stall figures are comparable within one
run (before and after, side by side), not across machines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import orjson
import requests

CHATFLEET = Path(sys.executable).with_name("chatfleet")
CAP = 4
MODEL = "qwen3-8b"


class Proc:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name = argv[1]
        self.log = open(log, "wb")  # noqa: SIM115 (open for the child's lifetime)
        self.p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, env=env,
                                  start_new_session=True)

    def urls(self, n: int, timeout_s: float = 60.0) -> list[str]:
        assert self.p.stdout is not None
        out: list[str] = []
        end = time.monotonic() + timeout_s
        while len(out) < n and time.monotonic() < end:
            line = self.p.stdout.readline().decode().strip()
            if line.startswith("http://"):
                out.append(line)
            elif not line and self.p.poll() is not None:
                break
        if len(out) < n:
            raise SystemExit(f"{self.name} did not start: {self.log.name}")
        return out

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(2)
            try:
                self.p.wait(20)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)
        self.log.close()


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def metric(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("chatfleet_gateway_" + name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextmanager
def loop_watch(url: str) -> Iterator[list[float]]:
    """The longest /health answer (ms) while the block runs, polled every 10 ms."""
    worst = [0.0]
    stop = threading.Event()

    def poll() -> None:
        with requests.Session() as s:
            while not stop.is_set():
                t = time.monotonic()
                with suppress(requests.RequestException):
                    s.get(url + "/health", timeout=10)
                worst[0] = max(worst[0], (time.monotonic() - t) * 1000)
                time.sleep(0.01)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    time.sleep(0.2)
    try:
        yield worst
    finally:
        time.sleep(0.2)
        stop.set()
        th.join(15)


def post_raw(url: str, body: bytes, timeout_s: float = 60.0) -> int:
    r = requests.post(url + "/v1/chat/completions", data=body, timeout=timeout_s,
                      headers={"Content-Type": "application/json"})
    return r.status_code


def probe_big_body(gw: str, pid: int) -> dict[str, Any]:
    body = orjson.dumps({"model": MODEL, "max_tokens": 4,
                         "messages": [{"role": "user", "content": "a"}] * 130_000})
    before = rss_mib(pid)
    ejections0 = metric(gw, "ejections_total")
    with loop_watch(gw) as one:
        first = post_raw(gw, body)
    one_hwm = rss_mib(pid, "VmHWM")
    statuses: list[int] = []
    with loop_watch(gw) as eight:
        threads = [threading.Thread(target=lambda: statuses.append(post_raw(gw, body)))
                   for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    return {"bytes": len(body), "status": first, "loop_stall_ms": round(one[0], 1),
            "rss_before_mib": round(before, 1), "peak_after_one_mib": round(one_hwm, 1),
            "eight_statuses": sorted(statuses), "eight_loop_stall_ms": round(eight[0], 1),
            "peak_after_eight_mib": round(rss_mib(pid, "VmHWM"), 1),
            "ejections": metric(gw, "ejections_total") - ejections0}


def probe_empty_arrays(gw: str) -> dict[str, Any]:
    body = orjson.dumps({"model": MODEL, "max_tokens": 4,
                         "messages": [{"role": "user", "content": "a"}],
                         "x": [[]] * 1_300_000})
    with loop_watch(gw) as w:
        status = post_raw(gw, body)
    return {"bytes": len(body), "status": status, "loop_stall_ms": round(w[0], 1)}


def probe_non_readers(gw: str) -> dict[str, Any]:
    host, port = gw.removeprefix("http://").split(":")
    body = orjson.dumps({"model": MODEL, "stream": True, "max_tokens": 2000,
                         "ignore_eos": True, "messages": [{"role": "user", "content": "x"}]})
    raw = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
           b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    socks = []
    for _ in range(2 * CAP):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((host, int(port)))
        s.sendall(raw)
        socks.append(s)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5 and metric(gw, "in_flight") < 2 * CAP:
            time.sleep(0.1)
        full = metric(gw, "in_flight")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 90 and metric(gw, "in_flight") > 0:
            time.sleep(0.25)
        held = time.monotonic() - t0
        return {"slots_taken": full, "slots_held_s": round(held, 1),
                "freed": metric(gw, "in_flight") == 0,
                "stalled_clients": metric(gw, "stalled_clients_total"),
                "slow_clients": metric(gw, "slow_clients_total")}
    finally:
        for s in socks:
            s.close()


def probe_n(gw: str) -> dict[str, Any]:
    r = requests.post(gw + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "max_tokens": 4, "n": 4, "messages": [{"role": "user", "content": "a"}]})
    return {"status": r.status_code, "answer": r.text[:160]}


def probe_server(gw: str) -> dict[str, Any]:
    h = requests.get(gw + "/health", timeout=10).headers.get("Server")
    c = requests.post(gw + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "max_tokens": 2,
        "messages": [{"role": "user", "content": "a"}]}).headers.get("Server")
    return {"health": h, "chat": c}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--src", default=None, help="run the servers from this src/ directory")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    gw_env = {**env, "PYTHONPATH": str(Path(args.src).resolve())} if args.src else env
    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"hostile-probe-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    sim = Proc([str(CHATFLEET), "simserver", "--weights", "fp8", "--kv-cache", "fp8",
                "--replicas", "2", "--port", "0"], env, work / "simserver.log")
    gw_proc = None
    try:
        replicas = sim.urls(2)
        cfg = work / "gateway.json"
        cfg.write_text(json.dumps({"replicas": replicas, "cap": CAP, "queue_depth": 16}))
        gw_proc = Proc([str(CHATFLEET), "gateway", "--config", str(cfg), "--port", "0"],
                       gw_env, work / "gateway.log")
        [gw] = gw_proc.urls(1)
        time.sleep(1.0)
        result = {"src": args.src or "this checkout", "date": time.strftime("%Y-%m-%d %H:%M"),
                  "big_body": probe_big_body(gw, gw_proc.p.pid),
                  "empty_arrays": probe_empty_arrays(gw),
                  "non_readers": probe_non_readers(gw), "n": probe_n(gw),
                  "server": probe_server(gw)}
    finally:
        if gw_proc is not None:
            gw_proc.stop()
        sim.stop()
    text = json.dumps(result, indent=1)
    print(text)
    if re.search(r"Traceback", (work / "gateway.log").read_text()):
        print(f"the gateway logged a traceback: {work / 'gateway.log'}", file=sys.stderr)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
