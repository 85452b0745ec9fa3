"""The shares protocol's atomic step (state.py's `sync`) against a real redis-server, and the
gateway's side of it (shared.py) against a backend that fails on cue. The invariant: the
shares of all gateways at a replica never add up to more than its cap, a share never goes
below what its gateway has in flight, and nothing a gateway cannot prove is ever added."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from chatfleet.core.fleet.fairshare import Demand
from chatfleet.gateway.config import StateSettings
from chatfleet.gateway.state import (
    RedisState,
    ReplicaAsk,
    StateUnavailable,
    SyncRequest,
    SyncResult,
)
from tests.gateway.redis_server import redis_server

pytestmark = pytest.mark.timeout(60)
FENCE = 1.0


class Client:
    """A RedisState on an event loop of its own (its connections belong to that loop)."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.state = RedisState(url)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def close(self) -> None:
        self.run(self.state.close())
        self.loop.close()


@contextlib.contextmanager
def client(url: str) -> Iterator[Client]:
    c = Client(url)
    try:
        yield c
    finally:
        c.close()


def sync(c: Client, inst: str, wanted: int, *, in_flight: int = 0, prior: int = 0,
         epoch: str | None = None, cap: int = 4, gateways: int = 2,
         rate: float = 1.0) -> SyncResult:
    req = SyncRequest(inst, epoch, gateways, FENCE, Demand(rate, in_flight),
                      (ReplicaAsk("r0", cap, wanted, in_flight, prior),))
    result: SyncResult = c.run(c.state.sync(req))
    return result


def test_a_share_grows_only_into_room_the_others_leave(tmp_path: Path) -> None:
    with redis_server(tmp_path) as (url, _), client(url) as s:
        a = sync(s, "a", 4, prior=2)  # a young epoch, b not yet in: a holds its prior
        assert a.grace and a.shares == {"r0": 2}
        b = sync(s, "b", 4, prior=2)  # both gateways are in: the epoch is settled
        assert not b.grace and b.shares == {"r0": 2} and b.gateways == 2
        assert sync(s, "a", 3, epoch=a.epoch).shares == {"r0": 2}  # no room
        assert sync(s, "b", 1, epoch=a.epoch).shares == {"r0": 1}  # b gives one back
        assert sync(s, "a", 3, epoch=a.epoch).shares == {"r0": 3}  # a takes it
        assert sync(s, "b", 4, epoch=a.epoch).shares == {"r0": 1}
        # a share never goes below what runs there: b wants none but has 1 in flight
        assert sync(s, "b", 0, in_flight=1, epoch=a.epoch).shares == {"r0": 1}
        got = sync(s, "a", 3, in_flight=2, epoch=a.epoch, rate=5.0)
        assert got.others_in_flight == {"r0": 1}
        assert got.demands == {"a": Demand(5.0, 2), "b": Demand(1.0, 1)}


def test_a_gateway_that_never_checked_in_keeps_its_fallback_share(tmp_path: Path) -> None:
    """With 2 gateways configured and only a in Redis, b's share (cap // 2) is kept for it:
    it may be serving on it without Redis."""
    with redis_server(tmp_path) as (url, _), client(url) as s:
        a = sync(s, "a", 4, prior=2)
        time.sleep(FENCE + 0.1)  # the epoch is no longer young
        assert sync(s, "a", 4, epoch=a.epoch).shares == {"r0": 2}
        assert sync(s, "a", 4, epoch=a.epoch, gateways=0).shares == {"r0": 4}  # 1 gateway


def test_a_silent_gateway_is_taken_for_dead_after_the_fence(tmp_path: Path) -> None:
    with redis_server(tmp_path) as (url, _), client(url) as s:
        a = sync(s, "a", 2, prior=2)
        sync(s, "b", 2, prior=2)
        end = time.monotonic() + FENCE + 0.3
        while time.monotonic() < end:  # a keeps checking in, b is silent
            got = sync(s, "a", 4, epoch=a.epoch, gateways=0)
            time.sleep(0.1)
        assert got.shares == {"r0": 4} and got.gateways == 1


def test_silence_of_everyone_is_forgiven(tmp_path: Path) -> None:
    """Nobody synced for longer than the fence (Redis paused, or cut off from all): b is not
    taken for dead on the first sync after it, and a cannot take its slots."""
    with redis_server(tmp_path) as (url, _), client(url) as s:
        a = sync(s, "a", 2, prior=2)
        sync(s, "b", 2, prior=2)
        time.sleep(FENCE + 0.3)
        got = sync(s, "a", 4, epoch=a.epoch)
        assert got.shares == {"r0": 2} and got.gateways == 2


def test_after_redis_lost_its_state_no_share_grows_past_its_prior(tmp_path: Path) -> None:
    """Redis restarted empty: a new epoch. a re-asserts its 3; a gateway it has not heard
    of gets only its prior (nothing here, the number of gateways unknown) until the epoch is
    settled; b, dead meanwhile, never comes back, and its slot frees after the fence."""
    with redis_server(tmp_path) as (url, proc), client(url) as s:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        a = sync(s, "a", 3, prior=3, gateways=0)
        sync(s, "b", 1, prior=1, gateways=0)
        assert sync(s, "a", 3, epoch=a.epoch, gateways=0).shares == {"r0": 3}
        proc.terminate()
        proc.wait(10)
        with pytest.raises(StateUnavailable):
            sync(s, "a", 3, epoch=a.epoch, gateways=0)
        with redis_server(tmp_path, port=port):
            again = sync(s, "a", 4, prior=3, epoch=a.epoch, gateways=0)
            assert again.epoch != a.epoch and again.grace and again.shares == {"r0": 3}
            assert sync(s, "c", 4, gateways=0).shares == {"r0": 0}
            time.sleep(FENCE + 0.1)
            assert sync(s, "c", 4, gateways=0).shares == {"r0": 1}


def test_a_gateway_that_leaves_gives_its_shares_back(tmp_path: Path) -> None:
    with redis_server(tmp_path) as (url, _), client(url) as s:
        a = sync(s, "a", 2, prior=2)
        sync(s, "b", 2, prior=2)
        time.sleep(FENCE + 0.1)  # the epoch is settled
        assert sync(s, "a", 4, epoch=a.epoch, gateways=0).shares == {"r0": 2}
        s.run(s.state.leave("b", ["r0"]))
        assert sync(s, "a", 4, epoch=a.epoch, gateways=0).shares == {"r0": 4}


# --- the gateway's side (shared.py), against a backend that fails on cue ----------------------
class Scripted:
    """A shared backend whose answers the test sets: `fail` makes every call raise; else a
    sync grants min(wanted, `room`) and records what was asked."""

    shared = True

    def __init__(self) -> None:
        self.fail = False
        self.room = 4
        self.asked: list[SyncRequest] = []

    async def start(self, instance: str) -> None:
        if self.fail:
            raise StateUnavailable("down")

    async def close(self) -> None:
        return None

    async def sync(self, req: SyncRequest) -> SyncResult:
        self.asked.append(req)
        if self.fail:
            raise StateUnavailable("down")
        shares = {r.name: max(r.in_flight, min(r.wanted, self.room)) for r in req.replicas}
        return SyncResult("e1", False, 1, shares, {r.name: 0 for r in req.replicas},
                          {req.instance: req.demand})

    async def leave(self, instance: str, replicas: Sequence[str]) -> None:
        return None

    async def get_session(self, key: str) -> str | None:
        return None

    async def set_session(self, key: str, replica: str, ttl_s: float) -> None:
        return None


class FakeFleet:
    """What SharedCaps reads of the fleet (shared.SharedFleet, which mypy checks this keeps):
    replicas with caps, in-flight counts, demand."""

    def __init__(self, caps: dict[str, int]) -> None:
        self.replicas = {n: type("Rep", (), {"cap": c})() for n, c in caps.items()}
        self.running = dict.fromkeys(caps, 0)
        self.need = 0
        self.shares: dict[str, int] = {}
        self.others: dict[str, int] = {}
        self.state_up = True

    def in_flight(self, name: str) -> int:
        return self.running[name]

    def demand(self) -> Demand:
        return Demand(1.0, self.need)

    def set_shares(self, shares: dict[str, int]) -> None:
        self.shares = dict(shares)


def shared_caps(backend: Scripted, fleet: FakeFleet, gateways: int = 2) -> Any:
    from chatfleet.gateway.metrics import GatewayMetrics
    from chatfleet.gateway.shared import SharedCaps

    return SharedCaps(backend, fleet, GatewayMetrics(),
                      StateSettings(gateways=gateways))


def test_without_redis_a_gateway_keeps_what_was_confirmed_and_grows_nothing() -> None:
    async def main() -> None:
        backend, fleet = Scripted(), FakeFleet({"r0": 4, "r1": 4})
        caps = shared_caps(backend, fleet)
        fleet.need = 10
        await caps.sync()
        assert caps.up and fleet.shares == {"r0": 4, "r1": 4}  # alone: the whole fleet
        backend.room = 3
        backend.fail = True
        await caps.sync()
        assert not caps.up and not fleet.state_up and fleet.shares == {"r0": 4, "r1": 4}
        caps.demands = {"other": Demand(3.0, 10)}  # another gateway's demand, seen before
        fleet.running = {"r0": 3, "r1": 0}
        await caps.sync()  # its fair share fell to 1 + 1: lowered at once, even now
        assert fleet.shares == {"r0": 1, "r1": 1}
        caps.demands = {}
        await caps.sync()  # the fair share is the whole fleet again: nothing grows unproven
        assert fleet.shares == {"r0": 1, "r1": 1}
        # each ask offered what it had in flight as the floor, and its share as the prior
        assert backend.asked[-1].replicas[0].in_flight == 3
        assert backend.asked[-1].replicas[0].prior == 3
        backend.fail = False
        await caps.sync()  # Redis answers: it confirms the room, the gateway takes it
        assert caps.up and fleet.state_up and fleet.shares == {"r0": 3, "r1": 3}

    asyncio.run(main())


@pytest.mark.parametrize(("gateways", "share"), [(2, 2), (0, 0)])
def test_a_gateway_that_never_reached_redis_runs_its_fallback_share(gateways: int,
                                                                    share: int) -> None:
    async def main() -> None:
        backend, fleet = Scripted(), FakeFleet({"r0": 4, "r1": 5})
        backend.fail = True
        caps = shared_caps(backend, fleet, gateways)
        await caps.start()
        try:
            assert not caps.up
            assert fleet.shares == {"r0": share, "r1": 5 // gateways if gateways else 0}
        finally:
            await caps.close()

    asyncio.run(main())
