"""The Slot (gateway/slots.py): one owner for a request's slot, from admission to release,
and one count per request (the relay's Outcome)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from chatfleet.core.fleet.admission import FleetRequest
from chatfleet.gateway.app import step_time_for
from chatfleet.gateway.fleet import LiveFleet
from chatfleet.gateway.metrics import GatewayMetrics
from chatfleet.gateway.slots import Slot
from tests.gateway.conftest import Fake, gateway, gateway_config
from tests.gateway.test_relay import chat, raw_connection, raw_post
from tests.waiting import wait_for

pytestmark = pytest.mark.timeout(60)


def live_fleet(caps: list[int], **raw: object) -> LiveFleet:
    names = [f"r{i}" for i in range(len(caps))]
    cfg = gateway_config([f"http://127.0.0.1:{9 + i}" for i in range(len(caps))], names=names,
                         cap=caps[0], queue_depth=4, ttft_budget_s=5.0, **raw)
    fleet = LiveFleet(cfg, step_time_for(cfg), GatewayMetrics())
    for i, name in enumerate(names):
        fleet.registry.set_cap(name, caps[i])
        fleet.registry.report(name, True, probe=True)  # it passed its first probe: it serves
    return fleet


def test_a_slot_is_released_once_and_the_queue_moves() -> None:
    async def main() -> None:
        fleet = live_fleet([1])
        placed: list[str] = []
        async with Slot(fleet.admission, FleetRequest("a", None, fleet.now()),
                        lambda r, rep: placed.append(f"{r.request_id}@{rep}")) as first:
            assert first.held and first.replica == "r0"
            waiting = Slot(fleet.admission, FleetRequest("b", None, fleet.now()))
            task = asyncio.create_task(waiting.__aenter__())
            await asyncio.sleep(0.01)
            assert not task.done() and fleet.ac.queue_depth() == 1
            first.release()
            first.release()  # the second time is a no-op
            assert (await task).held and fleet.in_flight("r0") == 1
        await waiting.__aexit__(None, None, None)
        assert fleet.in_flight("r0") == 0 and placed == ["a@r0"]
        fleet.close()

    asyncio.run(main())


def test_retry_elsewhere_moves_the_slot_and_a_cancelled_wait_holds_nothing() -> None:
    async def main() -> None:
        fleet = live_fleet([1, 1], keys=[])
        async with Slot(fleet.admission, FleetRequest("a", None, fleet.now())) as slot:
            failed = slot.replica
            d = await slot.retry_elsewhere()
            assert d.admitted and slot.replica != failed and slot.num_placed == 2
            assert fleet.in_flight(failed or "") == 0
            assert fleet.in_flight(slot.replica or "") == 1
            never = Slot(fleet.admission, FleetRequest("z", None, fleet.now()))
            never.release()  # never held: nothing to give back
            with pytest.raises(RuntimeError, match="held slot"):
                await never.retry_elsewhere()
            # a request queued behind a full fleet whose client leaves
            async with Slot(fleet.admission, FleetRequest("b", None, fleet.now())) as other:
                assert other.held
                late = asyncio.create_task(Slot(fleet.admission, FleetRequest("c", None,
                                                                    fleet.now())).__aenter__())
                await asyncio.sleep(0.01)
                late.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await late
                assert fleet.ac.queue_depth() == 0
        assert all(fleet.in_flight(n) == 0 for n in fleet.replicas)
        fleet.close()

    asyncio.run(main())


def test_every_request_is_counted_once_by_its_outcome(fakes2: list[Fake]) -> None:
    """ok, shed (queue full), rejected (the engine's 400), error (502 after two failures),
    cancelled (the client left mid-stream): requests_total adds up to the requests sent."""
    cfg = gateway_config([f.url for f in fakes2], cap=1, queue_depth=0)
    with gateway(cfg) as g:
        m = g.gateway.metrics
        assert chat(g.url, {"chunks": 2}).status_code == 200
        assert chat(g.url, {"status": 400}).status_code == 400
        with raw_connection(g.url, raw_post({"model": "m", "stream": True,
                                             "messages": [{"role": "user", "content": "x"}],
                                             "fake": {"chunks": 200, "gap_s": 0.02}})) as s:
            s.recv(100)  # streaming: both replicas' single slots are taken now...
            assert wait_for(lambda: sum(f.in_flight for f in fakes2) == 1)
            with raw_connection(g.url, raw_post({
                    "model": "m", "stream": True, "fake": {"chunks": 200, "gap_s": 0.02},
                    "messages": [{"role": "user", "content": "y"}]})) as s2:
                s2.recv(100)
                assert wait_for(lambda: sum(f.in_flight for f in fakes2) == 2)
                shed = chat(g.url, {"chunks": 1})  # ...so this one is shed (queue depth 0)
                assert shed.status_code == 429
        # both clients left mid-stream
        assert wait_for(lambda: m.requests["cancelled"] == 2)
        for f in fakes2:
            f.mode = "error"
        assert chat(g.url, {"chunks": 1}).status_code == 502
        counted = Counter(m.requests)
        assert counted == {"ok": 1, "rejected": 1, "cancelled": 2, "shed": 1, "error": 1}
        assert m.client_disconnects == 2
