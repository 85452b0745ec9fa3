"""Fair shares of the fleet's slots across gateways: in proportion to each gateway's demand.

Several gateways in front of the same replicas each run their own queue; the slots of each
replica are divided among them (docs/gateway.md, "Several gateways"). A gateway's share follows
its clients' demand, so that under overload each gateway's clients get a share of the fleet's
capacity in proportion to what they ask for, whichever gateway polls first.

Rules, for a fleet of `capacity` (replica -> cap) and gateways with a `Demand` each:

1. The fleet's slots are counted together: T = sum of the caps.
2. Every gateway with a request queued or in flight (`need` > 0) gets one slot first (in
   gateway order, while slots last): no gateway's clients are starved outright.
3. The slots are then dealt one at a time, by the Sainte-Lague rule on `rate` (requests offered
   per second): the next slot goes to the gateway with the highest rate / (2 * slots + 1),
   among those holding fewer slots than their `need`. So shares are proportional to demand,
   and no gateway gets more than it can use while another still can.
4. What is left once every need is met (the fleet is not overloaded) is dealt as headroom for
   bursts, evenly: the next slot to the gateway holding the fewest.
5. Each gateway's slots are spread over the replicas in name order: a replica's cap is dealt
   by the same Sainte-Lague rule, weighted by the slots each gateway has still to place. So a
   gateway's share of each replica follows its share of the fleet.

Ties go to the gateway that sorts first. Pure and deterministic: every gateway that reads the
same demands computes the same shares.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Demand:
    """What a gateway's clients ask for: `rate`, requests offered per second (admitted, queued
    or shed) over the gateway's window; `need`, its requests queued or in flight now."""

    rate: float
    need: int

    def __post_init__(self) -> None:
        if self.rate < 0 or self.rate != self.rate or self.need < 0:
            raise ValueError(f"a demand needs rate >= 0 and need >= 0, not {self}")


def fleet_shares(total: int, demands: Mapping[str, Demand]) -> dict[str, int]:
    """Rules 2-4: how many of the fleet's `total` slots each gateway gets."""
    names = sorted(demands)
    got = [0] * len(names)
    need = [demands[n].need for n in names]
    rate = [demands[n].rate for n in names]
    left = total
    for i in range(len(names)):  # rule 2
        if left and need[i] > 0:
            got[i] += 1
            left -= 1
    # rule 3: highest rate / (2 * slots + 1) first, ties to the first name
    heap: list[tuple[float, int]] = [(-rate[i] / (2 * got[i] + 1), i)
                                     for i in range(len(names)) if got[i] < need[i]]
    heapq.heapify(heap)
    while left and heap:
        _, i = heapq.heappop(heap)
        got[i] += 1
        left -= 1
        if got[i] < need[i]:
            heapq.heappush(heap, (-rate[i] / (2 * got[i] + 1), i))
    fewest = [(got[i], i) for i in range(len(names))]  # rule 4
    heapq.heapify(fewest)
    while left and fewest:
        n, i = heapq.heappop(fewest)
        got[i] += 1
        left -= 1
        heapq.heappush(fewest, (n + 1, i))
    return dict(zip(names, got, strict=True))


def replica_shares(capacity: Mapping[str, int],
                   totals: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Rule 5: gateway -> replica -> slots, each replica's cap dealt by what each gateway has
    still to place. `totals` must sum to the capacity's sum."""
    if sum(totals.values()) != sum(capacity.values()):
        raise ValueError("the gateways' totals must add up to the fleet's capacity")
    names = sorted(totals)
    left = [totals[n] for n in names]
    out: dict[str, dict[str, int]] = {n: {} for n in names}
    for replica in sorted(capacity):
        here = [0] * len(names)
        heap: list[tuple[float, int]] = [(-float(left[i]), i) for i in range(len(names))
                                         if left[i] > 0]
        heapq.heapify(heap)
        for _ in range(capacity[replica]):
            _, i = heapq.heappop(heap)
            here[i] += 1
            if here[i] < left[i]:
                heapq.heappush(heap, (-left[i] / (2 * here[i] + 1), i))
        for i, n in enumerate(names):
            out[n][replica] = here[i]
            left[i] -= here[i]
    return out


def fair_shares(capacity: Mapping[str, int],
                demands: Mapping[str, Demand]) -> dict[str, dict[str, int]]:
    """Gateway -> replica -> its share of that replica's cap (the module docstring's rules)."""
    if any(cap < 0 for cap in capacity.values()):
        raise ValueError("caps must not be negative")
    totals = fleet_shares(sum(capacity.values()), demands)
    return replica_shares(capacity, totals)
