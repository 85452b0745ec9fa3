"""Overload: 10x the fleet's cap, bounded in time, through two gateways sharing Redis."""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from pathlib import Path

import pytest

from chatfleet.bench.client import Clock, make_session
from chatfleet.bench.drive import DriveResult, drive
from chatfleet.bench.payload import IdsPayload
from chatfleet.core.workload import ClosedLoop, LengthSpec, Workload, WorkloadConfig
from chatfleet.jobs.parity import max_in_flight_from_trace
from tests.reliability.conftest import fleet, metric, record, rss_mib

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

WCFG = WorkloadConfig(system_prompt_tokens=256, lengths=LengthSpec("fixed", 64, 32), turns=3,
                      think_time_s=0.2)
SCALE = 10.0


def test_ten_times_the_cap_through_two_gateways(tmp_path: Path) -> None:
    cap, replicas = 4, 2
    users = 10 * cap * replicas
    with fleet(tmp_path, replicas=replicas, cap=cap, time_scale=SCALE,
               extra={"queue_depth": 8}) as f:
        rss_before = [rss_mib(g.pid) for g in f.gateways]

        async def main() -> DriveResult:
            async with make_session() as session:
                driver = ClosedLoop(Workload(WCFG, random.Random(11)), users)
                return await drive(
                    f.gateway_urls, driver, IdsPayload("qwen3-8b", send_rid=True),
                    window_end=150.0, drain_s=100.0, clock=Clock(SCALE), session=session,
                    route=lambda spec, n: (spec.user + spec.turn) % n, retry_shed=True,
                    session_header="X-Session-ID")

        res = asyncio.run(main())
        rss_after = [rss_mib(g.pid) for g in f.gateways]
        pages = [f.metrics(i) for i in range(2)]
    peaks = [max(max_in_flight_from_trace(t).values(), default=0) for t in f.traces]
    outcomes = Counter(r.outcome for r in res.records)
    unclear = [r for r in res.records if r.outcome == "error" and not r.error]
    shed_without_retry = [r for r in res.records if r.outcome == "shed"
                          and not re.search(r"retry-after \d+\)$", r.error or "")]
    lost = sum(n for k, n in outcomes.items() if k not in ("ok", "shed", "error"))
    lost += len(unclear) + len(shed_without_retry)
    growth = max(a - b for a, b in zip(rss_after, rss_before, strict=True))
    record("load", f"{users} closed-loop users = 10x the fleet's cap ({replicas} replicas x "
           f"{cap}), 15 s, 2 gateways sharing Redis",
           "no replica over its cap; every request ok, or 429 + Retry-After, or a clear "
           "error; gateway memory bounded",
           f"replica peaks {peaks} (cap {cap}); {outcomes['ok']} ok, {outcomes['shed']} shed, "
           f"{outcomes['error']} errors; gateway RSS {[round(x) for x in rss_before]} -> "
           f"{[round(x) for x in rss_after]} MiB", requests_sent=len(res.records), lost=lost)
    assert all(p <= cap for p in peaks), peaks
    assert max(peaks) == cap
    assert lost == 0, (outcomes, unclear[:3], shed_without_retry[:3])
    # overload sheds: the first burst alone (80 users at once against 8 slots and 2 x 8 queue
    # places) sheds at least 48. How many retries are shed after it depends on timing (the
    # Retry-After follows the gateways' drain-rate estimate, over the wall clock): about 700
    # in four runs here, with and without CPU hogs beside it, but 86 in one CI rehearsal
    # (cause not found), so the bound is half the users, not a usual count
    assert outcomes["ok"] >= 100 and outcomes["shed"] >= users // 2
    assert growth < 64, (rss_before, rss_after)
    assert sum(metric(p, "chatfleet_gateway_requests_total") for p in pages) >= len(res.records)
