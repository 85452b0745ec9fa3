"""Fairness across gateways (issue 14): under overload, each gateway's clients get a share of
the fleet's capacity in proportion to their demand, within 20%, over 30 s. Two gateway
processes share Redis in front of two simserver replicas (cap 4 each); requests without
session ids arrive at each gateway as a Poisson process (open loop: the demand is the
offered rate), together three times what the fleet completes. Before: one gateway's clients
got 865 ok and 33 shed, the other's 53 ok and 845 shed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.reliability.conftest import fleet, record
from tests.reliability.load import Arrivals
from tests.reliability.test_redis_faults import CAP, SCALE, ready

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

TOKENS = 128  # about 0.5 s a request here: the fleet completes about 16 per second
WARMUP_S = 5.0
WINDOW_S = 30.0


@pytest.mark.parametrize(("name", "rates"), [("equal", [24.0, 24.0]),
                                             ("three to one", [36.0, 12.0])])
def test_each_gateways_clients_get_capacity_in_proportion_to_demand(
        tmp_path: Path, name: str, rates: list[float]) -> None:
    with fleet(tmp_path, cap=CAP, time_scale=SCALE) as f:
        ready(f)
        with Arrivals(f.gateway_urls, rates, tokens=TOKENS) as load:
            start = time.time() + WARMUP_S
            time.sleep(WARMUP_S + WINDOW_S)
        end = start + WINDOW_S
        counts = [load.counts(i, start, end) for i in range(2)]
    offered = [sum(c.values()) for c in counts]
    ok = [c["ok"] for c in counts]
    demand = [o / sum(offered) for o in offered]
    got = [n / max(1, sum(ok)) for n in ok]
    ratio = [g / d for g, d in zip(got, demand, strict=True)]
    record("fairness", f"two gateways, {name} demand ({rates[0]:g} and {rates[1]:g} "
           f"requests/s offered, open loop, no session ids), {WINDOW_S:.0f} s",
           "each gateway's share of the completed requests within 20% of its share of the "
           "demand",
           f"gateway 0: {ok[0]} ok, {counts[0]['shed']} shed of {offered[0]}; gateway 1: "
           f"{ok[1]} ok, {counts[1]['shed']} shed of {offered[1]}; share of ok / share of "
           f"demand {ratio[0]:.2f} and {ratio[1]:.2f}",
           requests_sent=sum(offered), lost=sum(c["lost"] + c["reset"] for c in counts),
           ratios=[round(r, 3) for r in ratio])
    assert sum(ok) >= 200  # the fleet served; overloaded: most of the rest was shed
    assert sum(c["shed"] for c in counts) > sum(ok)
    assert all(0.8 <= r <= 1.2 for r in ratio), (counts, ratio)
    assert all(c["lost"] + c["reset"] == 0 for c in counts), counts
