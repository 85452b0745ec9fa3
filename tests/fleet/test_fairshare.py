"""Fair shares across gateways (core/fleet/fairshare.py): proportional to demand, never more
than a gateway can use while another can, leftovers as headroom, spread over replicas."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.fleet.fairshare import Demand, fair_shares, fleet_shares, replica_shares


def test_equal_demand_splits_the_fleet_evenly() -> None:
    shares = fair_shares({"r0": 4, "r1": 4}, {"a": Demand(30.0, 40), "b": Demand(30.0, 40)})
    assert shares == {"a": {"r0": 2, "r1": 2}, "b": {"r0": 2, "r1": 2}}


def test_shares_follow_demand_three_to_one() -> None:
    shares = fair_shares({"r0": 4, "r1": 4}, {"a": Demand(45.0, 40), "b": Demand(15.0, 40)})
    assert {n: sum(s.values()) for n, s in shares.items()} == {"a": 6, "b": 2}
    assert shares["a"] == {"r0": 3, "r1": 3}


def test_two_to_one_is_as_close_as_whole_slots_allow() -> None:
    assert fleet_shares(8, {"a": Demand(20.0, 99), "b": Demand(10.0, 99)}) == {"a": 5, "b": 3}


def test_no_gateway_gets_more_than_it_can_use_while_another_can() -> None:
    # b asks for much, but has only 1 request: the rest goes to a
    assert fleet_shares(8, {"a": Demand(10.0, 20), "b": Demand(50.0, 1)}) == {"a": 7, "b": 1}


def test_a_gateway_with_waiting_clients_is_never_starved() -> None:
    assert fleet_shares(8, {"a": Demand(100.0, 50), "b": Demand(0.1, 1)}) == {"a": 7, "b": 1}


def test_leftover_slots_are_headroom_for_everyone() -> None:
    assert fleet_shares(8, {"a": Demand(5.0, 3), "b": Demand(0.0, 0)}) == {"a": 4, "b": 4}
    assert fleet_shares(8, {"a": Demand(5.0, 6), "b": Demand(0.0, 0)}) == {"a": 6, "b": 2}
    assert fleet_shares(8, {"a": Demand(0.0, 0), "b": Demand(0.0, 0)}) == {"a": 4, "b": 4}


def test_a_replica_with_no_cap_gets_nobody() -> None:
    shares = fair_shares({"r0": 0, "r1": 3}, {"a": Demand(1.0, 9), "b": Demand(1.0, 9)})
    assert shares == {"a": {"r0": 0, "r1": 2}, "b": {"r0": 0, "r1": 1}}


def test_totals_must_match_the_capacity() -> None:
    with pytest.raises(ValueError, match="add up"):
        replica_shares({"r0": 4}, {"a": 3})
    with pytest.raises(ValueError, match="demand"):
        Demand(-1.0, 0)


demands = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]),
                          st.builds(Demand, st.floats(0, 100), st.integers(0, 30)),
                          min_size=1)


@settings(max_examples=200, deadline=None)
@given(caps=st.dictionaries(st.sampled_from(["r0", "r1", "r2"]), st.integers(0, 12),
                            min_size=1), demands=demands)
def test_every_slot_is_dealt_once_and_needs_come_first(caps: dict[str, int],
                                                       demands: dict[str, Demand]) -> None:
    shares = fair_shares(caps, demands)
    for replica, cap in caps.items():  # each replica's cap, exactly
        assert sum(s[replica] for s in shares.values()) == cap
    totals = {n: sum(s.values()) for n, s in shares.items()}
    total = sum(caps.values())
    if total >= sum(d.need for d in demands.values()):
        assert all(totals[n] >= d.need for n, d in demands.items())
    else:  # overloaded: nobody over its need, and the slots are all used
        assert all(totals[n] <= max(d.need, 1) for n, d in demands.items())
    # proportional (Sainte-Lague): between two gateways both short of their need, the one
    # with the higher rate per slot could not take a slot from the other and gain
    short = [n for n, d in demands.items() if totals[n] < d.need]
    for x in short:
        for y in short:
            if totals[y] > 1 and demands[x].rate > 0:
                assert demands[x].rate / (2 * totals[x] + 1) <= \
                    demands[y].rate / (2 * totals[y] - 1) + 1e-9
    assert fair_shares(caps, demands) == shares  # deterministic
