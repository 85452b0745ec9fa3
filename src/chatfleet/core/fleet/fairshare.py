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
    got = dict.fromkeys(names, 0)
    left = total
    for name in names:  # rule 2
        if left and demands[name].need > 0:
            got[name] += 1
            left -= 1
    while left:  # rule 3
        needy = [n for n in names if got[n] < demands[n].need]
        if not needy:
            break
        best = max(needy, key=lambda n: (demands[n].rate / (2 * got[n] + 1), -names.index(n)))
        got[best] += 1
        left -= 1
    while left and names:  # rule 4
        fewest = min(names, key=lambda n: (got[n], names.index(n)))
        got[fewest] += 1
        left -= 1
    return got


def replica_shares(capacity: Mapping[str, int],
                   totals: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Rule 5: gateway -> replica -> slots, each replica's cap dealt by what each gateway has
    still to place. `totals` must sum to the capacity's sum."""
    if sum(totals.values()) != sum(capacity.values()):
        raise ValueError("the gateways' totals must add up to the fleet's capacity")
    names = sorted(totals)
    left = dict(totals)
    out: dict[str, dict[str, int]] = {n: {} for n in names}
    for replica in sorted(capacity):
        here = dict.fromkeys(names, 0)
        for _ in range(capacity[replica]):
            best = max((n for n in names if here[n] < left[n]),
                       key=lambda n: (left[n] / (2 * here[n] + 1), -names.index(n)))
            here[best] += 1
        for n in names:
            out[n][replica] = here[n]
            left[n] -= here[n]
    return out


def fair_shares(capacity: Mapping[str, int],
                demands: Mapping[str, Demand]) -> dict[str, dict[str, int]]:
    """Gateway -> replica -> its share of that replica's cap (the module docstring's rules)."""
    if any(cap < 0 for cap in capacity.values()):
        raise ValueError("caps must not be negative")
    totals = fleet_shares(sum(capacity.values()), demands)
    return replica_shares(capacity, totals)
