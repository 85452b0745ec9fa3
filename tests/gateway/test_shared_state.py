"""Several gateways, one truth (issues 6 and 14): two gateways sharing a real redis-server hold
each replica's cap fleet-wide (checked against the simserver's own trace), keep a session
where another gateway placed it, and keep the shares Redis last confirmed when it goes away.
The protocol's own checks: test_shares_protocol.py; under faults: tests/reliability."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from chatfleet.bench.client import Clock, make_session
from chatfleet.bench.drive import DriveResult, drive
from chatfleet.bench.payload import IdsPayload
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.fleet.routing import rendezvous_top
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import ClosedLoop, LengthSpec, Workload, WorkloadConfig
from chatfleet.gateway.state import MemoryState, RedisState, StateBackend
from chatfleet.jobs.parity import max_in_flight_from_trace
from chatfleet.simserver.server import ServerConfig, serve_in_thread
from tests.gateway.conftest import Fake, gateway, gateway_config
from tests.gateway.redis_server import redis_server
from tests.gateway.test_relay import chat
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(180)

SPEC = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
WCFG = WorkloadConfig(system_prompt_tokens=256, lengths=LengthSpec("fixed", 64, 32), turns=3,
                      think_time_s=0.2)
SCALE = 10.0
STATE = {"gateways": 2, "lease_ttl_s": 1.0}


def two_gateways_under_load(tmp: Path, states: list[StateBackend],
                            users: int = 24) -> tuple[dict[str, int], DriveResult]:
    """`users` closed-loop users, turns alternating between two gateways, in front of two
    simserver replicas (cap 4 each); the replicas' largest in-flight counts from their trace."""
    trace = tmp / f"trace-{id(states)}.jsonl"
    with serve_in_thread(ServerConfig(spec=SPEC, replicas=2, time_scale=SCALE,
                                      trace=trace)) as srv:
        cfg = gateway_config(srv.urls, names=["replica-0", "replica-1"], cap=4,
                             queue_depth=16, ttft_budget_s=5.0, state=STATE)
        with gateway(cfg, state=states[0]) as g1, gateway(cfg, state=states[1]) as g2:
            async def main() -> DriveResult:
                async with make_session() as session:
                    driver = ClosedLoop(Workload(WCFG, random.Random(3)), users)
                    return await drive(
                        [g1.url, g2.url], driver, IdsPayload("qwen3-8b", send_rid=True),
                        window_end=60.0, drain_s=60.0, clock=Clock(SCALE), session=session,
                        route=lambda spec, n: (spec.user + spec.turn) % n, retry_shed=True,
                        session_header="X-Session-ID")

            res = asyncio.run(main())
    return max_in_flight_from_trace(trace), res


@pytest.mark.slow
def test_two_gateways_sharing_redis_hold_each_replicas_cap(tmp_path: Path) -> None:
    with redis_server(tmp_path) as (url, _):
        peak, res = two_gateways_under_load(tmp_path, [RedisState(url), RedisState(url)])
    assert peak == {"replica-0": 4, "replica-1": 4}, peak  # held exactly: full, never over
    outcomes = {r.outcome for r in res.records}
    assert outcomes <= {"ok", "shed"}, outcomes
    assert sum(r.outcome == "ok" for r in res.records) >= 50


@pytest.mark.slow
def test_without_shared_state_two_gateways_double_the_cap(tmp_path: Path) -> None:
    """The control: the same load through two gateways that each count alone."""
    peak, _ = two_gateways_under_load(tmp_path, [MemoryState(), MemoryState()])
    assert max(peak.values()) > 4, peak


def test_a_session_placed_by_one_gateway_is_found_by_the_other(fakes2: list[Fake],
                                                               tmp_path: Path) -> None:
    """Cap 4 per replica, two gateways: each holds 2 of each replica's slots while idle.
    Session X's rendezvous home is busy with two of gateway A's requests (A's whole share of
    it), so A spills X to the other replica. X's next turn arrives at gateway B once both
    replicas are free: B must send it where A put it (its cache is there), not to X's
    rendezvous home."""
    names = ["f0", "f1"]
    key = "x-session"
    home = rendezvous_top(f"sid:{key}", names)
    other = next(n for n in names if n != home)
    blockers = [f"b{i}" for i in range(100) if rendezvous_top(f"sid:b{i}", names) == home][:2]
    with redis_server(tmp_path) as (url, _):
        cfg = gateway_config([f.url for f in fakes2], names=names, cap=4, queue_depth=4,
                             ttft_budget_s=5.0, debug_headers=True, state=STATE)
        with gateway(cfg, state=RedisState(url)) as a, gateway(cfg, state=RedisState(url)) as b:
            assert wait_for(lambda: a.gateway.fleet.ac.cap(home) == 2
                            and b.gateway.fleet.ac.cap(other) == 2)
            box: dict[str, Any] = {}
            threads = [threading.Thread(target=lambda k=k: box.setdefault(k, chat(
                a.url, {"chunks": 40, "gap_s": 0.02}, headers={"X-Session-ID": k})))
                for k in blockers]
            for t in threads:
                t.start()
            assert wait_for(lambda: a.gateway.fleet.ac.in_flight(home) == 2)
            first = chat(a.url, {"chunks": 1}, headers={"X-Session-ID": key})
            assert first.headers["x-chatfleet-replica"] == other  # spilled
            for t in threads:
                t.join(30)
            assert {box[k].headers["x-chatfleet-replica"] for k in blockers} == {home}
            second = chat(b.url, {"chunks": 1}, headers={"X-Session-ID": key})
            assert second.headers["x-chatfleet-replica"] == other
            # and gateway B on its own (no shared map) would have sent it home
            cfg_alone = gateway_config([f.url for f in fakes2], names=names, cap=1,
                                       debug_headers=True)
            with gateway(cfg_alone) as c:
                alone = chat(c.url, {"chunks": 1}, headers={"X-Session-ID": key})
                assert alone.headers["x-chatfleet-replica"] == home


def test_without_redis_each_gateway_keeps_its_shares_and_recovers(
        fakes2: list[Fake], tmp_path: Path) -> None:
    """No load: each of two gateways holds half of each cap as headroom. Redis killed: both
    keep those shares and serve on them; restarted empty, they re-assert them in its new
    epoch, and take shares from Redis again."""
    with redis_server(tmp_path) as (url, proc):
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        cfg = gateway_config([f.url for f in fakes2], names=["f0", "f1"], cap=4,
                             queue_depth=4, state=STATE)
        with gateway(cfg, state=RedisState(url)) as a, gateway(cfg, state=RedisState(url)) as b:
            assert wait_for(lambda: a.gateway.shared.gateways == 2
                            and b.gateway.shared.gateways == 2)
            assert wait_for(lambda: a.gateway.fleet.ac.cap("f0") == 2
                            and b.gateway.fleet.ac.cap("f0") == 2)
            epoch = a.gateway.shared.epoch
            assert chat(a.url, {"chunks": 1}).status_code == 200
            proc.terminate()
            proc.wait(10)
            assert wait_for(lambda: not a.gateway.shared.up, 5)
            assert a.gateway.fleet.ac.cap("f0") == 2  # what Redis last confirmed
            assert chat(a.url, {"chunks": 1}).status_code == 200  # still serving
            assert a.gateway.metrics.state_failures >= 1
            with redis_server(tmp_path, port=port):
                assert wait_for(lambda: a.gateway.shared.up and b.gateway.shared.up, 10)
                assert a.gateway.shared.epoch != epoch  # it knows Redis lost its state
                assert a.gateway.fleet.ac.cap("f0") + b.gateway.fleet.ac.cap("f0") <= 4
                assert chat(b.url, {"chunks": 1}).status_code == 200
