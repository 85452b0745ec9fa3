"""The gateway benchmark's load client (benchmarks/gateway.py runs it as `client`).

N users, each on its own keep-alive connection (or a new one per request with
--fresh-connections), send a streaming chat request, read the stream to its end and send the
next (closed loop, no think time). Users start spread evenly over one request's duration
(--ramp-s, default chunks x interval) so the load is steady rather than in waves. Timestamps
are taken in data_received; a read that completes k SSE events gives k gaps of (now - previous
read) / k (docs/metrics.md: a chunk's gap is split over what it carries). TTFT = first event -
send time, for requests sent inside the window; ITL = gaps of events that arrive inside the
window. The window starts --warmup-s after the ramp and lasts --measure-s; then sending stops
and what is in flight may finish for --drain-s (bounded), then every connection is closed. At
both window edges the client reads utime+stime of the target's process tree and of the engine
from /proc/PID/stat and the machine's busy time from /proc/stat. --quickack makes the client
ACK every read at once (TCP_QUICKACK): a target that writes without TCP_NODELAY stalls its
first chunk behind the ACK of its response head, which a client with Linux's default delayed
ACKs (the default here, and what SDK clients do) holds for up to about 40 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import time
from array import array
from typing import Any

from relay_engine import MODEL

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return 0.0
    fields = raw[raw.rfind(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_tree(pid: int) -> list[int]:
    """pid and all its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        ppid = int(raw[raw.rfind(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def machine_busy_s() -> float:
    """Seconds of CPU time the whole machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + parts[4]
    return (sum(parts[:8]) - idle) / CLK_TCK


def pct(values: list[float] | array[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not len(values):
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * len(s) + 0.5) - 1))
    return float(s[k])


class Window:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.itl = array("d")  # per-event gaps (s) of events that arrived inside the window
        self.chunks = 0
        self.ttft: list[float] = []  # s, requests sent inside the window
        self.sent = 0
        self.no_first = 0
        self.errors = 0
        self.done = 0
        self.events_per_request: list[int] = []


class ClientConn(asyncio.Protocol):
    """One user's keep-alive connection: parses the head, the chunked body and SSE events."""

    def __init__(self, win: Window, quickack: bool) -> None:
        self.win = win
        self.closed = False
        self.quickack = quickack
        self.fut: asyncio.Future[bool] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: asyncio.Transport = transport  # type: ignore[assignment]
        self.sock = transport.get_extra_info("socket")
        if self.quickack:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)

    def request(self, raw: bytes) -> asyncio.Future[bool]:
        self.fut = asyncio.get_running_loop().create_future()
        self.head = b""
        self.in_body = False
        self.chunked = True
        self.left = -1  # content-length bytes left (not chunked)
        self.cbuf = b""  # undecoded chunked bytes
        self.sse = b""  # decoded SSE text not yet ending in a blank line
        self.events = 0
        self.first: float | None = None
        self.prev = 0.0
        self.sent_at = time.monotonic()
        self.t.write(raw)
        return self.fut

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if self.quickack:  # Linux clears it after a while: ACK every read at once
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        if self.fut is None or self.fut.done():
            return
        if not self.in_body:
            self.head += data
            i = self.head.find(b"\r\n\r\n")
            if i < 0:
                return
            head, data = self.head[:i].lower(), self.head[i + 4:]
            self.head = b""
            self.in_body = True
            if head[9:12] != b"200":
                self.finish(False)
                self.t.close()
                return
            self.chunked = b"transfer-encoding: chunked" in head
            if not self.chunked:
                m = re.search(rb"content-length:\s*(\d+)", head)
                self.left = int(m.group(1)) if m else -1
        if self.chunked:
            payload, end = self.dechunk(data)
        else:
            payload = data
            if self.left >= 0:
                self.left -= len(data)
            end = self.left == 0
        if payload:
            self.sse_events(payload, now)
        if end:
            self.finish(True)

    def dechunk(self, data: bytes) -> tuple[bytes, bool]:
        buf = self.cbuf + data if self.cbuf else data
        out: list[bytes] = []
        pos, n = 0, len(buf)
        while True:
            j = buf.find(b"\r\n", pos)
            if j < 0:
                break
            size = int(buf[pos:j].split(b";", 1)[0], 16)
            if size == 0:
                if n >= j + 4:
                    self.cbuf = b""
                    return b"".join(out), True
                break
            if n < j + 2 + size + 2:
                break
            out.append(buf[j + 2:j + 2 + size])
            pos = j + 2 + size + 2
        self.cbuf = buf[pos:]
        return b"".join(out), False

    def sse_events(self, payload: bytes, now: float) -> None:
        text = self.sse + payload if self.sse else payload
        k = 0
        pos = 0
        while True:
            j = text.find(b"\n\n", pos)
            j2 = text.find(b"\r\n\r\n", pos)
            if j2 >= 0 and (j < 0 or j2 < j):
                end, nxt = j2, j2 + 4
            elif j >= 0:
                end, nxt = j, j + 2
            else:
                break
            event = text[pos:end]
            pos = nxt
            if event.startswith(b"data:") and b"[DONE]" not in event[:14]:
                k += 1
        self.sse = text[pos:]
        if not k:
            return
        win = self.win
        self.events += k
        inside = win.start <= now <= win.end
        if self.first is None:
            self.first = now
            if inside:
                win.chunks += k
                win.itl.extend([0.0] * (k - 1))
        else:
            if inside:
                win.chunks += k
                gap = (now - self.prev) / k
                win.itl.extend([gap] * k)
        self.prev = now

    def finish(self, ok: bool) -> None:
        fut = self.fut
        if fut is not None and not fut.done():
            fut.set_result(ok)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.finish(False)


async def client_main(args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    n = args.streams
    ramp = args.ramp_s if args.ramp_s is not None else args.chunks * args.interval_ms / 1000
    t0 = time.monotonic() + 0.2
    win = Window(t0 + ramp + args.warmup_s, t0 + ramp + args.warmup_s + args.measure_s)
    drain_until = win.end + args.drain_s
    host, port = args.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    path = "/" + args.url.split("//", 1)[1].split("/", 1)[1]
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": args.chunks,
                       "messages": [{"role": "user", "content": "Say tok " * 8}]}).encode()
    raw = (b"POST %s HTTP/1.1\r\nHost: %s:%s\r\nContent-Type: application/json\r\n"
           b"Accept: text/event-stream\r\nAuthorization: Bearer %s\r\n"
           b"Content-Length: %d\r\n\r\n%s"
           % (path.encode(), host.encode(), port.encode(), args.api_key.encode(), len(body),
              body))
    conns: list[ClientConn] = []
    max_requests = args.max_requests
    quickack = args.quickack

    async def user(i: int) -> None:
        await asyncio.sleep(max(0.0, t0 + i * ramp / n - time.monotonic()))
        conn: ClientConn | None = None
        while time.monotonic() < win.end and win.done + win.errors < max_requests:
            if conn is None or conn.closed:
                try:
                    _, conn = await loop.create_connection(lambda: ClientConn(win, quickack), host,
                                                           int(port))
                except OSError:
                    win.errors += 1
                    await asyncio.sleep(0.05)
                    continue
                conns.append(conn)
            fut = conn.request(raw)
            in_window = win.start <= conn.sent_at <= win.end
            if in_window:
                win.sent += 1
            try:
                ok = await asyncio.wait_for(fut, max(0.01, drain_until - time.monotonic()))
            except TimeoutError:
                ok = False
            if conn.first is not None and in_window:
                win.ttft.append(conn.first - conn.sent_at)
            elif in_window:
                win.no_first += 1
            if ok:
                win.done += 1
                if in_window:
                    win.events_per_request.append(conn.events)
                if args.fresh_connections:
                    conn.t.close()
                    conn = None
            else:
                win.errors += 1
                conn.t.abort()
                conn = None
                await asyncio.sleep(0.01)
        if conn is not None:
            conn.t.close()

    lags: list[float] = []

    async def lag_probe() -> None:
        while time.monotonic() < drain_until:
            t = time.monotonic()
            await asyncio.sleep(0.005)
            lat = time.monotonic() - t - 0.005
            if win.start <= t <= win.end:
                lags.append(lat)

    watch = {label: int(pid) for label, pid in (x.split("=") for x in args.cpu_pid)}
    cpu0: dict[str, float] = {}
    cpu1: dict[str, float] = {}
    trees: dict[str, list[int]] = {}

    async def sample_cpu() -> None:
        await asyncio.sleep(max(0.0, win.start - time.monotonic()))
        for label, pid in watch.items():
            trees[label] = proc_tree(pid)
        trees["client"] = [os.getpid()]
        cpu0.update({k: sum(proc_cpu_s(p) for p in v) for k, v in trees.items()})
        cpu0["_machine"] = machine_busy_s()
        cpu0["_t"] = time.monotonic()
        await asyncio.sleep(max(0.0, win.end - time.monotonic()))
        cpu1.update({k: sum(proc_cpu_s(p) for p in v) for k, v in trees.items()})
        cpu1["_machine"] = machine_busy_s()
        cpu1["_t"] = time.monotonic()

    sampler = asyncio.ensure_future(sample_cpu())
    probe = asyncio.ensure_future(lag_probe())
    users = [asyncio.ensure_future(user(i)) for i in range(n)]
    await asyncio.wait(users, timeout=max(0.0, drain_until - time.monotonic()) + 1.0)
    cut = sum(1 for u in users if not u.done())
    for u in users:
        u.cancel()
    for c in conns:
        if not c.closed:
            c.t.abort()
    await asyncio.gather(*users, return_exceptions=True)
    await sampler
    probe.cancel()
    window_s = cpu1["_t"] - cpu0["_t"]
    cpu = {k: cpu1[k] - cpu0[k] for k in cpu0 if not k.startswith("_")}
    machine = cpu1["_machine"] - cpu0["_machine"]
    itl_ms = [g * 1000 for g in win.itl]
    offered = n * args.measure_s / (args.interval_ms / 1000)
    return {
        "streams": n, "window_s": window_s, "requests_sent": win.sent,
        "requests_done": win.done, "errors": win.errors, "no_first_token": win.no_first,
        "cut_at_drain": cut,
        "ttft_ms": [x * 1000 for x in win.ttft],
        "ttft_p50_ms": pct([x * 1000 for x in win.ttft], 50),
        "ttft_p99_ms": pct([x * 1000 for x in win.ttft], 99),
        "itl_n": len(itl_ms), "itl_p50_ms": pct(itl_ms, 50), "itl_p99_ms": pct(itl_ms, 99),
        "itl_max_ms": max(itl_ms) if itl_ms else float("nan"),
        "chunks": win.chunks, "chunks_offered": offered,
        "delivered": win.chunks / offered if offered else float("nan"),
        "events_per_request": (statistics.mean(win.events_per_request)
                               if win.events_per_request else float("nan")),
        "cpu_s": cpu, "cores": {k: v / window_s for k, v in cpu.items()},
        "others_cores": (machine - sum(cpu.values())) / window_s,
        "loop_lag_p99_ms": pct([x * 1000 for x in lags], 99),
    }

