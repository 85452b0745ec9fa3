"""The live fleet's two halves (gateway/fleet.py): the replica registry (replicas.py) seats
replicas in admission only through `Seats`, and admission (admission.py) decides from what it
was seated with; neither reaches into the other."""

from __future__ import annotations

import ast
import asyncio
import inspect
from types import ModuleType

from chatfleet.core.fleet.admission import Decision, FleetRequest
from chatfleet.gateway import admission as admission_mod
from chatfleet.gateway import replicas as replicas_mod
from chatfleet.gateway.admission import LiveAdmission
from chatfleet.gateway.app import step_time_for
from chatfleet.gateway.fleet import LiveFleet
from chatfleet.gateway.metrics import GatewayMetrics
from chatfleet.gateway.replicas import ReplicaRegistry, Seats
from tests.gateway.conftest import gateway_config


class SpySeats:
    """Admission as the registry sees it: every call noted, the caps it holds."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int | None]] = []
        self.caps: dict[str, int] = {}

    def add_replica(self, name: str, cap: int) -> None:
        self.calls.append(("add", name, cap))
        self.caps[name] = cap

    def remove_replica(self, name: str) -> None:
        self.calls.append(("remove", name, None))
        del self.caps[name]

    def set_cap(self, name: str, cap: int) -> None:
        self.calls.append(("cap", name, cap))
        self.caps[name] = cap

    def cap(self, name: str) -> int:
        return self.caps[name]


def test_the_registry_seats_a_replica_once_it_passes_a_probe_and_unseats_it_when_ejected(
) -> None:
    seats = SpySeats()
    metrics = GatewayMetrics()
    reg = ReplicaRegistry(seats, metrics)
    cfg = gateway_config(["http://127.0.0.1:9", "http://127.0.0.1:10"], names=["a", "b"],
                         cap=3)
    reg.apply(cfg)
    assert set(reg.replicas) == {"a", "b"} and seats.calls == []  # pending: not seated
    reg.report("a", ok=False)  # a request's failure at a pending replica is not counted
    assert seats.calls == [] and metrics.upstream_failures["a"] == 0
    reg.report("a", ok=True, probe=True)
    assert seats.calls == [("add", "a", 3)] and reg.replicas["a"].serving
    reg.report("a", ok=False, reason="boom")
    reg.report("a", ok=False, reason="boom")  # eject_after_failures is 2 (conftest)
    assert seats.calls[-1] == ("remove", "a", None) and not reg.replicas["a"].serving
    assert metrics.ejections["a"] == 1 and reg.replicas["a"].last_failure == "boom"
    reg.report("a", ok=True)  # a request that ran across the ejection brings nothing back
    assert seats.calls[-1] == ("remove", "a", None)
    reg.report("a", ok=True, probe=True)  # readmit_after_successes is 1
    assert seats.calls[-1] == ("add", "a", 3)


def test_shares_caps_and_a_new_configuration_reach_admission_as_seat_changes() -> None:
    seats = SpySeats()
    reg = ReplicaRegistry(seats, GatewayMetrics())
    cfg = gateway_config(["http://127.0.0.1:9", "http://127.0.0.1:10"], names=["a", "b"],
                         cap=4)
    reg.apply(cfg)
    reg.report("a", ok=True, probe=True)
    seats.calls.clear()
    reg.set_shares({"a": 1, "b": 2})  # b is pending: nothing to tell admission of it
    assert seats.calls == [("cap", "a", 1)]
    assert reg.effective_cap(reg.replicas["b"]) == 2
    reg.set_shares({"a": 9, "b": 9})  # a share never lifts the cap
    assert seats.calls[-1] == ("cap", "a", 4)
    reg.set_cap("b", 1)  # not seated: remembered for when it is
    assert seats.calls[-1] == ("cap", "a", 4) and reg.replicas["b"].cap == 1
    seats.calls.clear()
    pool = reg.replicas["a"].pool
    reg.apply(gateway_config(["http://127.0.0.1:10"], names=["b"], cap=4))
    assert seats.calls == [("remove", "a", None)] and "a" not in reg.replicas
    assert reg.replicas["b"].cap == 4 and pool.idle == []


def as_seats(admission: LiveAdmission) -> Seats:
    """LiveAdmission keeps the registry's contract (mypy checks this assignment)."""
    return admission


def imported(module: ModuleType) -> set[str]:
    tree = ast.parse(inspect.getsource(module))
    return {node.module for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module is not None}


def test_neither_half_imports_the_other() -> None:
    """Admission knows no pools, probes or registry; the registry knows admission only as
    `Seats`, never the core's fleet."""
    assert callable(as_seats)
    assert not imported(admission_mod) & {"chatfleet.gateway.replicas",
                                          "chatfleet.gateway.upstream",
                                          "chatfleet.core.fleet.health"}
    assert not imported(replicas_mod) & {"chatfleet.gateway.admission",
                                         "chatfleet.core.fleet.fleet",
                                         "chatfleet.core.fleet.admission"}


def test_a_fleet_admits_only_to_what_its_registry_seated() -> None:
    async def main() -> tuple[Decision | object, Decision | object, int]:
        cfg = gateway_config(["http://127.0.0.1:9"], names=["f0"], cap=1, queue_depth=0)
        fleet = LiveFleet(cfg, step_time_for(cfg), GatewayMetrics())
        before = fleet.admission.offer(FleetRequest("early", None, fleet.now()))
        fleet.registry.report("f0", ok=True, probe=True)
        after = fleet.admission.offer(FleetRequest("late", None, fleet.now()))
        cap = fleet.admission.cap("f0")
        fleet.close()
        return before, after, cap

    before, after, cap = asyncio.run(main())
    assert isinstance(before, Decision) and before.shed
    assert isinstance(after, Decision) and after.admitted and after.replica == "f0"
    assert cap == 1
