"""Caps are a safety property (issue 14): whatever Redis does, the requests in flight at a
replica never add up to more than its cap. Two gateway processes share Redis in front of two
simserver replicas (cap 4 each, lease TTL 2 s, `state.gateways: 2`) under closed-loop
overload (12 clients per gateway, 3x the fleet's 8 slots), while Redis is restarted, killed,
paused (SIGSTOP / SIGCONT) and slowed (a proxy that holds every packet), or is not there when
the gateways start, and while a gateway that holds shares is killed. The in-flight counts
are the replicas' own (their traces, tests/reliability/traces.py), and each check records
what the fleet gave up: the share of its slots in use, and the longest stretch with nothing
in flight, before, during and after the fault."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.gateway.redis_server import free_port
from tests.reliability.conftest import Fleet, fleet, metric, record
from tests.reliability.load import Arrivals, Clients, Load
from tests.reliability.proxy import delay_proxy
from tests.reliability.traces import Phase, describe, phase, read_series
from tests.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CAP = 4
SCALE = 10.0
WORKERS = 12  # per gateway: 24 clients for 8 slots


def ready(f: Fleet) -> None:
    """Both gateways up, both replicas serving through each."""
    for url in f.gateway_urls:
        assert wait_for(lambda url=url: len(requests.get(url + "/ready", timeout=5)
                                             .json()["serving"]) == 2, 15)


def state_up(f: Fleet, i: int) -> bool:
    return metric(f.metrics(i), "chatfleet_gateway_state_up") == 1


def phases(f: Fleet, marks: list[tuple[str, float]], end: float) -> list[Phase]:
    series = [read_series(t, SCALE) for t in f.traces]
    bounds = [*marks, ("", end)]
    return [phase(name, series, start, bounds[k + 1][1], CAP)
            for k, (name, start) in enumerate(marks)]


def finish(check: str, expected: str, load: Load, ph: list[Phase],
           extra: str = "", resets_expected: bool = False) -> None:
    counts = load.counts()
    lost = counts["lost"] + (0 if resets_expected else counts["reset"])
    peaks = [max(p.peaks[k] for p in ph) for k in range(len(ph[0].peaks))]
    record("fault", check, expected,
           f"peaks {peaks} at cap {CAP}; {counts['ok']} ok, {counts['shed']} shed, "
           f"{counts['error']} errors" + (f", {counts['reset']} resets" if counts["reset"]
                                          else "") + f"; {describe(ph, CAP)}{extra}",
           requests_sent=sum(counts.values()), lost=lost, peaks=peaks,
           phases=[{"name": p.name, "seconds": round(p.end - p.start, 1), "peaks": p.peaks,
                    "used": round(p.used, 3), "longest_idle_s": round(p.longest_idle_s, 2)}
                   for p in ph])
    assert all(p <= CAP for p in peaks), peaks  # the invariant, at every replica
    assert lost == 0, [r for r in load.results if r.outcome == "lost"][:5]


def under_load(f: Fleet, fault: Callable[[list[tuple[str, float]]], None],
               before_s: float = 3.0, after_s: float = 4.0) -> tuple[Clients, list[Phase]]:
    """Load before, while and after `fault` (which appends its own phase marks)."""
    with Clients(f.gateway_urls, WORKERS) as load:
        marks = [("before", time.time())]
        time.sleep(before_s)
        fault(marks)
        time.sleep(after_s)
        end = time.time()
    return load, phases(f, marks, end)


def test_redis_restarted_while_idle_then_a_burst(tmp_path: Path) -> None:
    """Before: the next burst ran 8 at cap 4 (dead pooled connections, and a failed lease
    kept the slot admitted against the whole cap)."""
    with fleet(tmp_path, cap=CAP, time_scale=SCALE) as f:
        ready(f)
        f.kill_redis()
        assert wait_for(lambda: not state_up(f, 0) and not state_up(f, 1), 5)
        f.start_redis()
        time.sleep(1.0)
        marks = [("burst", time.time())]
        with Clients(f.gateway_urls, WORKERS) as load:
            time.sleep(4.0)
        ph = phases(f, marks, time.time())
        finish("Redis restarted (empty) with no load, then a burst of 24 clients",
               "no replica over its cap: each gateway re-reads Redis (a new epoch) before any "
               "share grows", load, ph)


def test_redis_killed_under_load_then_restarted(tmp_path: Path) -> None:
    """Before: 5-8 in flight at cap 4, and Redis itself held 6-8 leases."""
    with fleet(tmp_path, cap=CAP, time_scale=SCALE) as f:
        ready(f)

        def fault(marks: list[tuple[str, float]]) -> None:
            f.kill_redis()
            marks.append(("killed", time.time()))
            assert wait_for(lambda: not state_up(f, 0) and not state_up(f, 1), 5)
            time.sleep(3.0)
            f.start_redis()
            marks.append(("restarted", time.time()))
            assert wait_for(lambda: state_up(f, 0) and state_up(f, 1), 10)

        load, ph = under_load(f, fault)
        flaps = [metric(f.metrics(i), "chatfleet_gateway_state_failures_total")
                 for i in range(2)]
        finish("Redis killed (SIGKILL) under load, restarted empty 3 s later",
               "no replica over its cap: without Redis each gateway keeps the shares it last "
               "had confirmed and grows none; restarted, Redis holds the re-asserted shares "
               "and none grows past them for a lease TTL", load, ph,
               f"; state failures per gateway {flaps}")
        assert max(flaps) <= 3, flaps  # one outage, not a flapping state


def test_redis_paused_under_load_for_10_s(tmp_path: Path) -> None:
    """Before: after SIGCONT the leases released during the pause blocked the fleet until
    their TTL (nothing in flight for 1.8 s with a 2 s TTL, 14.7 s with 15 s)."""
    with fleet(tmp_path, cap=CAP, time_scale=SCALE) as f:
        ready(f)

        def fault(marks: list[tuple[str, float]]) -> None:
            f.pause_redis()
            marks.append(("paused", time.time()))
            time.sleep(10.0)
            f.resume_redis()
            marks.append(("resumed", time.time()))
            assert wait_for(lambda: state_up(f, 0) and state_up(f, 1), 10)

        load, ph = under_load(f, fault)
        finish("Redis paused (SIGSTOP) for 10 s under load, then resumed (SIGCONT)",
               "no replica over its cap; while paused each gateway keeps its confirmed shares "
               "and keeps serving on them; resumed, nobody is taken for dead and nothing "
               "blocks the fleet", load, ph)
        assert ph[-1].longest_idle_s < 0.5, ph[-1]
        assert ph[1].used > 0.5, ph[1]  # still serving while Redis is paused


def test_redis_slow_under_load(tmp_path: Path) -> None:
    """A proxy in front of Redis holds every packet: 50 ms each way (calls slow, but within
    their 0.5 s timeout), then 1 s each way (every call times out), then none again."""
    port = free_port()
    with delay_proxy(port) as proxy, fleet(
            tmp_path, cap=CAP, time_scale=SCALE, redis_port=port,
            state_url=f"redis://127.0.0.1:{proxy.port}/0") as f:
        ready(f)

        def fault(marks: list[tuple[str, float]]) -> None:
            proxy.delay_s = 0.05
            marks.append(("100 ms round trips", time.time()))
            time.sleep(3.0)
            proxy.delay_s = 1.0
            marks.append(("2 s round trips", time.time()))
            assert wait_for(lambda: not state_up(f, 0) and not state_up(f, 1), 10)
            time.sleep(3.0)
            proxy.delay_s = 0.0
            marks.append(("fast again", time.time()))
            assert wait_for(lambda: state_up(f, 0) and state_up(f, 1), 15)

        load, ph = under_load(f, fault)
        finish("Redis slow under load: round trips of 100 ms, then 2 s (past every call's "
               "0.5 s timeout), then fast again",
               "no replica over its cap: slow calls still confirm shares; calls that time "
               "out (even those Redis executes later) never add an unconfirmed share", load,
               ph)


def test_gateways_started_before_redis(tmp_path: Path) -> None:
    """Before: each gateway ran the whole cap (8 in flight at cap 4)."""
    with fleet(tmp_path, cap=CAP, time_scale=SCALE, redis_up=False) as f:
        ready(f)
        assert not state_up(f, 0) and not state_up(f, 1)

        def fault(marks: list[tuple[str, float]]) -> None:
            f.start_redis()
            marks.append(("redis started", time.time()))
            assert wait_for(lambda: state_up(f, 0) and state_up(f, 1), 10)

        load, ph = under_load(f, fault, before_s=4.0)
        finish("two gateways started while Redis is down, under load; then Redis starts",
               "no replica over its cap: a gateway that never reached Redis runs cap // "
               "gateways (state.gateways: 2) of each replica; once Redis is up, shares by "
               "demand", load, ph)
        assert ph[0].used > 0.7, ph[0]  # cap // 2 each: the fleet was still in use


def test_a_gateway_killed_while_it_holds_shares(tmp_path: Path) -> None:
    """Gateway 0 is offered three times gateway 1's requests (open loop, 36 and 12 per
    second, 128 tokens each: three times what the fleet completes), so it holds most of the
    fleet. Killed, its requests end with it (the replicas see their connections close); after
    the lease TTL (2 s) the shares it held beyond its own (cap // gateways of each replica,
    kept for it while it is away) come back to the survivor."""
    with fleet(tmp_path, cap=CAP, time_scale=SCALE) as f:
        ready(f)
        share = "chatfleet_gateway_share"
        held: list[float] = []
        freed: list[float] = []
        with Arrivals(f.gateway_urls, [36.0, 12.0], tokens=128) as load:
            marks = [("before", time.time())]
            time.sleep(4.0)
            held.extend(metric(f.metrics(i), share) for i in range(2))
            f.gateways[0].kill()
            f.gateways[0].wait(10)
            load.active[0] = False
            t0 = time.time()
            marks.append(("gateway 0 killed", t0))
            assert wait_for(lambda: metric(f.metrics(1), share) == 2 * (CAP - CAP // 2), 10)
            freed.append(time.time() - t0)
            time.sleep(3.0)
            end = time.time()
        ph = phases(f, marks, end)
        finish("a gateway killed (SIGKILL) under load while it held most of the fleet (3x "
               "the other's demand)",
               "no replica over its cap; its clients see their connections reset; after the "
               "lease TTL (2 s) the shares it held beyond its own come back to the other "
               "gateway", load, ph,
               f"; slots held before the kill {held[0]:g} and {held[1]:g} of 8; the "
               f"survivor held {2 * (CAP - CAP // 2)} (the dead one's own 4 kept for it) "
               f"{freed[0]:.1f} s after the kill", resets_expected=True)
        assert held[0] > held[1]
        assert freed[0] < 5.0


def test_what_the_fallback_costs_when_demand_moves_during_an_outage(tmp_path: Path) -> None:
    """The fallback's worst case: every client is on gateway 0, which holds the whole fleet;
    Redis is killed, and the clients move to gateway 1 (a load balancer's failover, say).
    Gateway 1 can prove no share, so it serves what it held (nothing) until Redis is back; its
    share then grows within a sync or two of the restarted Redis settling."""
    with fleet(tmp_path, cap=CAP, time_scale=SCALE) as f:
        ready(f)
        with Clients(f.gateway_urls[:1], 2 * WORKERS) as first:
            marks = [("clients on gateway 0", time.time())]
            time.sleep(3.0)
            held = [metric(f.metrics(i), "chatfleet_gateway_share") for i in range(2)]
            f.kill_redis()
        second = Clients(f.gateway_urls[1:], 2 * WORKERS)
        with second:
            marks.append(("Redis killed, clients on gateway 1", time.time()))
            time.sleep(4.0)
            f.start_redis()
            t0 = time.time()
            marks.append(("Redis restarted", t0))
            assert wait_for(lambda: metric(f.metrics(1), "chatfleet_gateway_share")
                            == 2 * CAP, 10)
            grown = time.time() - t0
            time.sleep(3.0)
            end = time.time()
        ph = phases(f, marks, end)
        outage = Counter(r.outcome for r in second.results if marks[1][1] <= r.start < t0)
        load = Clients(f.gateway_urls, 0)
        load.results = [*first.results, *second.results]
        finish("the fallback's cost: all clients on gateway 0 (it holds the fleet), then "
               "Redis killed and the clients moved to gateway 1 for 4 s, then Redis back",
               "no replica over its cap; gateway 1 serves only what Redis had confirmed to it "
               "(nothing) while Redis is away: that is the capacity given up; once Redis is "
               "back its share grows at once", load, ph,
               f"; shares before the kill {held[0]:g} and {held[1]:g} of 8; of the requests "
               f"sent to gateway 1 during the outage {outage['ok']} were served (after it, "
               f"within their TTFT budget) and {outage['shed']} shed; its share was the whole "
               f"fleet {grown:.1f} s after Redis restarted")
        assert held == [2 * CAP, 0]
        assert ph[1].used < 0.2  # what the fallback gives up
        assert ph[2].used > 0.7 and grown < 3.0
