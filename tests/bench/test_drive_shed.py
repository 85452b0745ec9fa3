"""drive() against a server that sheds: retries of shed closed-loop requests (Retry-After,
attempt ids `<id>#k`), the session header, and the limits on retrying."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict

from chatfleet.bench.client import Clock, make_session, retry_after_s
from chatfleet.bench.drive import DriveResult, drive
from chatfleet.bench.payload import IdsPayload
from chatfleet.core.workload import ClosedLoop, LengthSpec, OpenLoop, Workload, WorkloadConfig


@dataclass
class Seen:
    rid: str
    t: float  # time.monotonic() when the server got it
    session: str | None


@dataclass
class Shedder:
    """Answers POST /v1/completions: 429 for the requests `shed` picks, a short stream else."""

    retry_after: str | None = "1"
    retry_after_ms: str | None = "200"
    shed_all: bool = False  # every attempt, not only the first
    seen: list[Seen] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        rid = str(body["rid"])
        self.seen.append(Seen(rid, time.monotonic(), request.headers.get("X-Session-ID")))
        if self.shed_all or "#" not in rid:
            hdrs = {}
            if self.retry_after is not None:
                hdrs["Retry-After"] = self.retry_after
            if self.retry_after_ms is not None:
                hdrs["retry-after-ms"] = self.retry_after_ms
            return web.json_response({"error": {"message": "overloaded"}}, status=429,
                                     headers=hdrs)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = 3
        for k in range(1, n + 1):
            chunk = {"id": rid, "object": "text_completion",
                     "choices": [{"index": 0, "text": "x",
                                  "finish_reason": "length" if k == n else None}],
                     "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": k}}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await asyncio.sleep(0.005)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def workload(turns: int = 1, think_s: float = 0.0) -> Workload:
    cfg = WorkloadConfig(system_prompt_tokens=16, lengths=LengthSpec("fixed", 8, 3),
                         turns=turns, think_time_s=think_s, think_dist="fixed")
    return Workload(cfg, random.Random(0))


async def run(srv: Shedder, driver_of: Any, window_end: float, scale: float = 1.0,
              **kw: Any) -> tuple[DriveResult, float]:
    app = web.Application()
    app.router.add_post("/v1/completions", srv.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        port = runner.addresses[0][1]
        url = f"http://127.0.0.1:{port}"
        clock = Clock(scale=scale)
        async with make_session() as session:
            res = await drive([url], driver_of, IdsPayload("m", send_rid=True),
                              window_end=window_end, drain_s=5.0 * scale, clock=clock,
                              session=session, **kw)
        return res, clock.t0
    finally:
        await runner.cleanup()


def by_id(res: DriveResult) -> dict[str, Any]:
    return {r.request_id: r for r in res.records}


@pytest.mark.timeout(60)
def test_a_shed_closed_loop_request_is_retried_after_retry_after_ms() -> None:
    srv = Shedder()
    t = time.monotonic()
    res, _ = asyncio.run(run(srv, ClosedLoop(workload(), users=2), window_end=1.0,
                             retry_shed=True))
    assert time.monotonic() - t < 10
    recs = by_id(res)
    firsts = [rid for rid in recs if "#" not in rid]
    retries = [rid for rid in recs if rid.endswith("#1")]
    assert len(firsts) >= 2 and len(retries) >= 2
    assert all(recs[rid].outcome == "shed" for rid in firsts)
    assert all("429" in (recs[rid].error or "") for rid in firsts)
    assert not [rid for rid in recs if "#2" in rid]  # the first retry was answered
    for rid in retries:
        base = recs[rid.split("#")[0]]
        retry = recs[rid]
        assert retry.outcome == "ok", retry.error
        assert retry.output_tokens == 3
        assert retry.session_id == base.session_id and retry.turn == base.turn
        # retry-after-ms (0.2 s) wins over Retry-After (1 s)
        assert 0.15 <= retry.send_time - base.send_time < 0.6
        assert retry.scheduled_time == pytest.approx(base.send_time + 0.2, abs=0.1)
    shed = [o for o in res.outcomes if o.record.outcome == "shed"]
    assert shed and all(o.retry_after_s == pytest.approx(0.2) for o in shed)
    # the engine sees a distinct rid for every attempt
    rids = [s.rid for s in srv.seen]
    assert len(rids) == len(set(rids)) == len(res.records)
    # nothing was sent after the window end
    assert max(r.scheduled_time for r in res.records) < 1.0
    # the users moved on to their next requests after the retries
    assert any(int(rid[1:]) > 2 for rid in firsts)


@pytest.mark.timeout(60)
def test_retry_waits_are_wall_seconds_under_a_time_scale() -> None:
    srv = Shedder()
    scale = 10.0
    res, t0 = asyncio.run(run(srv, ClosedLoop(workload(), users=1), window_end=8.0,
                              scale=scale, retry_shed=True))
    recs = by_id(res)
    seen = {s.rid: s.t for s in srv.seen}
    retries = [rid for rid in recs if rid.endswith("#1")]
    assert retries
    for rid in retries:
        base = rid.split("#")[0]
        # 0.2 s of wall time between the attempts, 2.0 s of model time
        assert 0.15 <= seen[rid] - seen[base] < 0.6
        assert recs[rid].send_time - recs[base].send_time == pytest.approx(2.0, abs=0.8)
    assert max(seen.values()) - t0 < 8.0 / scale + 0.3


@pytest.mark.timeout(60)
def test_retry_after_seconds_without_ms() -> None:
    srv = Shedder(retry_after="0.3", retry_after_ms=None)
    res, _ = asyncio.run(run(srv, ClosedLoop(workload(), users=1), window_end=1.0,
                             retry_shed=True))
    recs = by_id(res)
    (first, *_) = [rid for rid in recs if rid.endswith("#1")]
    assert recs[first].outcome == "ok"
    assert 0.25 <= recs[first].send_time - recs[first.split("#")[0]].send_time < 0.7


@pytest.mark.timeout(60)
def test_session_header_carries_the_session_id() -> None:
    srv = Shedder()
    res, _ = asyncio.run(run(srv, ClosedLoop(workload(turns=2), users=2), window_end=1.0,
                             retry_shed=True, session_header="X-Session-ID",
                             headers={"X-Other": "1"}))
    recs = by_id(res)
    assert srv.seen
    for s in srv.seen:
        assert s.session == recs[s.rid].session_id
        assert s.session is not None and s.session.startswith("s")
    # without it, no header
    srv2 = Shedder()
    asyncio.run(run(srv2, ClosedLoop(workload(), users=1), window_end=0.5))
    assert srv2.seen and all(s.session is None for s in srv2.seen)


@pytest.mark.timeout(60)
def test_no_retry_without_retry_shed() -> None:
    srv = Shedder()
    res, _ = asyncio.run(run(srv, ClosedLoop(workload(think_s=0.1), users=2),
                             window_end=0.6))
    assert res.records
    assert all("#" not in r.request_id for r in res.records)
    assert all(r.outcome == "shed" for r in res.records)
    assert all(o.retry_after_s == pytest.approx(0.2) for o in res.outcomes)


@pytest.mark.timeout(60)
def test_no_retry_past_the_window_end() -> None:
    # Retry-After 1 s, no ms header: every retry would fall after the 0.6 s window
    srv = Shedder(retry_after="1", retry_after_ms=None)
    t = time.monotonic()
    res, _ = asyncio.run(run(srv, ClosedLoop(workload(think_s=0.2), users=2),
                             window_end=0.6, retry_shed=True))
    assert time.monotonic() - t < 3
    assert res.records
    assert all("#" not in r.request_id for r in res.records)
    assert all(o.retry_after_s == 1.0 for o in res.outcomes)
    # each user stopped after its shed, as in the twin: one record per user
    assert sorted(r.request_id for r in res.records) == ["r1", "r2"]


@pytest.mark.timeout(60)
def test_retries_stop_after_max_retries() -> None:
    srv = Shedder(retry_after_ms="50", shed_all=True)
    res, _ = asyncio.run(run(srv, ClosedLoop(workload(think_s=0.3), users=1),
                             window_end=1.0, retry_shed=True, max_retries=2))
    ids = [r.request_id for r in res.records]
    assert ids == ["r1", "r1#1", "r1#2"]  # then the user stops
    assert all(r.outcome == "shed" for r in res.records)


@pytest.mark.timeout(60)
def test_a_shed_open_loop_session_ends() -> None:
    srv = Shedder()
    res, _ = asyncio.run(run(srv, OpenLoop(workload(turns=3), rate=20.0), window_end=0.5,
                             retry_shed=True))
    assert res.records
    assert all("#" not in r.request_id for r in res.records)
    assert all(r.turn == 0 for r in res.records)  # no later turns after a shed


def test_retry_after_header_parsing() -> None:
    def parse(**h: str) -> float | None:
        return retry_after_s(CIMultiDict({k.replace("_", "-"): v for k, v in h.items()}),
                             now=1_000_000_000.0)

    assert parse(retry_after="1", retry_after_ms="200") == pytest.approx(0.2)
    assert parse(Retry_After="2") == 2.0
    assert parse(retry_after="1.5") == 1.5
    assert parse(retry_after="3", retry_after_ms="soon") == 3.0
    assert parse(retry_after="3", retry_after_ms="-5") == 3.0
    assert parse(retry_after="later") is None
    assert parse(retry_after="-1") is None
    assert parse() is None
    # an HTTP date: seconds from now
    assert parse(retry_after="Sun, 09 Sep 2001 01:46:50 GMT") == pytest.approx(10.0)
    assert parse(retry_after="Sun, 09 Sep 2001 01:46:00 GMT") == 0.0
