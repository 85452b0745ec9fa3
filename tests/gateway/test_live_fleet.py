"""LiveFleet, the core's admission on the gateway's own event loop (uvloop's, as it serves)."""

from __future__ import annotations

import asyncio

import uvloop

from chatfleet.core.engine.build import step_time_model
from chatfleet.core.fleet.admission import Decision, FleetRequest
from chatfleet.core.fleet.fleet import FleetTrace
from chatfleet.gateway.fleet import LiveFleet
from chatfleet.gateway.metrics import GatewayMetrics
from tests.gateway.conftest import gateway_config
from tests.gateway.test_overload_parity import SPEC


def test_each_queue_deadline_is_checked_about_once_not_in_a_spin() -> None:
    """uvloop's clock reads whole milliseconds. A deadline timer armed a fraction of a
    millisecond after the deadline fired while the clock still read the deadline's own
    millisecond, so nothing was past it (the core sheds when now > deadline): the fleet armed
    the timer again, 0 ms away, and spun until the clock moved. The gateway of the parity
    run called the core's expire 200-1,000 times for its 60 deadlines, on the thread that
    shares the GIL with the engine and the client."""
    num_queued, budget_s = 20, 0.05

    async def main() -> tuple[list[Decision], int]:
        cfg = gateway_config(["http://127.0.0.1:9"], names=["f0"], cap=1,
                             queue_depth=num_queued, ttft_budget_s=budget_s)
        calls = FleetTrace()
        fleet = LiveFleet(cfg, step_time_model(SPEC), GatewayMetrics(), trace=calls)
        # a replica takes traffic once it passed a probe
        fleet.registry.report("f0", ok=True, probe=True)
        busy = fleet.admission.offer(FleetRequest("busy", None, fleet.now()))
        assert isinstance(busy, Decision) and busy.admitted  # the only slot, never released
        waits = []
        for i in range(num_queued):  # deadlines at different fractions of a millisecond
            waits.append(asyncio.ensure_future(
                fleet.admission.acquire(FleetRequest(f"r{i}", None, fleet.now()))))
            await asyncio.sleep(0.0013)
        out = await asyncio.gather(*waits)
        fleet.close()
        return out, sum(1 for _, name, _, _ in calls.calls if name == "expire")

    decisions, num_expire_calls = uvloop.run(main())
    assert all(d.shed and d.reason == "deadline" for d in decisions)
    assert all(d.at > d.request.arrival + budget_s for d in decisions)  # never early
    assert num_expire_calls <= 2 * num_queued, num_expire_calls
