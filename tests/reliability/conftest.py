"""The reliability suite (issue 6): real processes on 127.0.0.1 — redis-server, simserver
replicas, `chatfleet gateway` instances sharing Redis — pushed past overload, faulted and fed
garbage, every loop bounded. Each check adds a row to the suite's report (RESULTS, written at
the end of the session to $CHATFLEET_RELIABILITY_OUT or out/reliability.json), from which
`benchmarks/reliability_table.py` renders docs/reliability.md."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.gateway.redis_server import free_port, start_redis, stop_redis
from tests.processes import spawn, stop
from tests.simserver.test_cli_simserver import read_urls

RESULTS: list[dict[str, Any]] = []
ROOT = Path(__file__).parents[2]


def record(kind: str, check: str, expected: str, observed: str, *, requests_sent: int = 0,
           lost: int = 0, **extra: Any) -> None:
    RESULTS.append({"kind": kind, "check": check, "expected": expected, "observed": observed,
                    "requests": requests_sent, "lost": lost, **extra})


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not RESULTS:
        return
    out = Path(os.environ.get("CHATFLEET_RELIABILITY_OUT", ROOT / "out" / "reliability.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": RESULTS}, indent=1))
    tmp.replace(out)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Fleet:
    """redis-server, simserver processes (one replica each, so that each can be killed) and
    gateway processes sharing Redis. `redis` is None while Redis is down (`kill_redis`,
    `start_redis`; `pause_redis` and `resume_redis` stop and continue it)."""

    tmp: Path
    redis_url: str
    redis: subprocess.Popen[bytes] | None
    sims: list[subprocess.Popen[bytes]] = field(default_factory=list)
    replica_urls: list[str] = field(default_factory=list)
    traces: list[Path] = field(default_factory=list)
    gateways: list[subprocess.Popen[bytes]] = field(default_factory=list)
    gateway_urls: list[str] = field(default_factory=list)

    def metrics(self, i: int) -> str:
        return requests.get(self.gateway_urls[i] + "/metrics", timeout=5).text

    @property
    def redis_port(self) -> int:
        return int(self.redis_url.rsplit(":", 1)[1].split("/")[0])

    def kill_redis(self) -> None:
        """SIGKILL: its state is gone with it."""
        if self.redis is not None:
            self.redis.kill()
            self.redis.wait(10)
            self.redis = None

    def start_redis(self) -> None:
        """A fresh, empty redis-server on the same port."""
        assert self.redis is None
        self.redis = start_redis(self.tmp, self.redis_port)

    def pause_redis(self) -> None:
        assert self.redis is not None
        self.redis.send_signal(signal.SIGSTOP)

    def resume_redis(self) -> None:
        assert self.redis is not None
        self.redis.send_signal(signal.SIGCONT)


def metric(text: str, name: str) -> float:
    """Sum of a metric's samples in a Prometheus text page."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextlib.contextmanager
def fleet(tmp: Path, *, replicas: int = 2, gateways: int = 2, cap: int = 4,
          time_scale: float = 10.0, extra: dict[str, Any] | None = None,
          redis_up: bool = True, redis_port: int | None = None,
          state_url: str | None = None) -> Iterator[Fleet]:
    """`redis_up` False: the gateways start with Redis down (the test starts it); `state_url`:
    where the gateways find Redis (a proxy in front of `redis_port`, say), else Redis
    itself."""
    port = redis_port or free_port()
    url = f"redis://127.0.0.1:{port}/0"
    f = Fleet(tmp, url, start_redis(tmp, port) if redis_up else None)
    try:
        for i in range(replicas):
            trace = tmp / f"replica-{i}.jsonl"
            sim = spawn("simserver", "--weights", "fp8", "--kv-cache", "fp8", "--port", "0",
                        "--time-scale", str(time_scale), "--trace", str(trace),
                        "--seed", str(i), log=tmp / f"sim-{i}.log")
            f.sims.append(sim)
            [u] = read_urls(sim, 1, 30)
            f.replica_urls.append(u)
            f.traces.append(trace)
        cfg = {"replicas": [{"name": f"r{i}", "url": u}
                            for i, u in enumerate(f.replica_urls)],
               "cap": cap, "queue_depth": 32, "ttft_budget_s": 5.0,
               "health": {"probe_interval_s": 0.5, "eject_after_failures": 2,
                          "readmit_after_successes": 1},
               "timeouts": {"idle_s": 3.0, "first_byte_s": 10.0, "probe_s": 0.5},
               "state": {"lease_ttl_s": 2.0, "gateways": gateways}, "debug_headers": True,
               **(extra or {})}
        path = tmp / "gateway.yaml"
        path.write_text(yaml.safe_dump(cfg))
        for i in range(gateways):
            gw = spawn("gateway", "--config", str(path), "--port", "0", "--state",
                       state_url or url, log=tmp / f"gateway-{i}.log")
            f.gateways.append(gw)
            [g] = read_urls(gw, 1, 30)
            f.gateway_urls.append(g)
        yield f
    finally:
        for p in [*f.gateways, *f.sims]:
            stop(p)
        if f.redis is not None:
            stop_redis(f.redis)
        for i in range(len(f.gateways)):
            log = (tmp / f"gateway-{i}.log").read_text()
            assert "Traceback" not in log, log[-3000:]
