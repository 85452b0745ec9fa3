"""Throughput against the simserver's own trace: the output tokens the harness counts in the
window are the tokens the server sent in it (the trace's ground truth), its request rate and
goodput the trace's requests' shares of them, and every record carries the engine's response
id, which names its request in the trace."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from chatfleet.bench.client import Clock, make_session
from chatfleet.bench.drive import DriveResult, drive
from chatfleet.bench.payload import IdsPayload
from chatfleet.bench.results import SweepDir
from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.measure.point import summarize_point
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import ClosedLoop, LengthSpec, Workload, WorkloadConfig
from chatfleet.simserver.server import ServerConfig, serve_in_thread

SCALE = 10.0
WARMUP_S = 5.0
DURATION_S = 40.0
USERS = 16


def drive_traced(trace: Path) -> tuple[DriveResult, Clock]:
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
    # fixed lengths, every user starting at once: the load moves in waves
    wcfg = WorkloadConfig(system_prompt_tokens=256, lengths=LengthSpec("fixed", 512, 128))

    async def main(url: str) -> tuple[DriveResult, Clock]:
        clock = Clock(SCALE)
        async with make_session() as session:
            res = await drive([url], ClosedLoop(Workload(wcfg, random.Random(5)), USERS),
                              IdsPayload("qwen3-8b"),  # no rid: the server names it
                              window_end=WARMUP_S + DURATION_S, drain_s=60.0, clock=clock,
                              session=session)
        return res, clock

    with serve_in_thread(ServerConfig(spec=spec, time_scale=SCALE, trace=trace)) as srv:
        return asyncio.run(main(srv.urls[0]))


@pytest.mark.timeout(120)
def test_output_tok_s_matches_the_servers_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    res, clock = drive_traced(trace)
    rows = [orjson.loads(x) for x in trace.read_bytes().splitlines()]
    sent = [r for r in rows if r["type"] == "token"]
    window = (WARMUP_S, WARMUP_S + DURATION_S)
    point = summarize_point(res.records, load=ClosedLoad(USERS),
                            window=window, slo=SLO(), mode="closed", seed=5, flushed=False,
                            time_scale=SCALE)
    # ground truth: the tokens the server wrote in the window, on the client's model clock
    in_window = sum(1 for r in sent
                    if window[0] <= (r["actual_mono"] - clock.t0) * SCALE < window[1])
    truth = in_window / DURATION_S
    assert point.output_tok_s == pytest.approx(truth, rel=0.01)
    assert point.requests.finished_in_window > USERS

    # requests are counted as the trace's tokens are: each request's share of its tokens the
    # server wrote in the window; goodput over those that meet the target (judged here on the
    # client's times: TTFTs crowd the 1 s target, where the few ms between the server's write
    # and the client's read would move verdicts, which harness_accuracy.py measures)
    times: dict[str, list[float]] = {}
    for r in sent:
        times.setdefault(r["rid"], []).append((r["actual_mono"] - clock.t0) * SCALE)
    requests = goodput = 0.0
    for rec in res.records:
        t = sorted(times.get(rec.response_id or "", []))
        if rec.outcome != "ok" or not t:
            continue
        share = sum(1 for x in t if window[0] <= x < window[1]) / len(t)
        requests += share
        c = rec.token_times
        if (c[0] - rec.send_time <= SLO().ttft_ms / 1000
                and (c[-1] - c[0]) / (len(c) - 1) <= SLO().tpot_ms / 1000):
            goodput += share
    assert point.request_rps == pytest.approx(requests / DURATION_S, rel=0.01)
    assert point.goodput_rps == pytest.approx(goodput / DURATION_S, rel=0.01)
    assert 0 < point.goodput_rps < point.request_rps
    # every answer is 128 tokens: the two rates agree, where whole requests did not
    assert point.request_rps * 128 == pytest.approx(point.output_tok_s, rel=1e-9)
    assert point.window_cycles == pytest.approx(point.request_rps * DURATION_S / USERS)

    # every record names its request in the trace, with the same tokens
    per_rid = Counter(r["rid"] for r in sent)
    ok = [r for r in res.records if r.outcome == "ok"]
    assert ok and all(r.response_id for r in ok)
    assert len({r.response_id for r in ok}) == len(ok)
    assert all(per_rid[r.response_id] == r.output_tokens for r in ok)  # type: ignore[index]

    # the sweep's records file keeps it
    sweep_dir = SweepDir(tmp_path / "s")
    path = sweep_dir.write_records(0, res.records)
    stored = [orjson.loads(x) for x in path.read_bytes().splitlines()]
    assert [s["response_id"] for s in stored] == [r.response_id for r in res.records]


async def slow_stream(request: web.Request) -> web.StreamResponse:
    """A token every 20 ms, 1,000 of them: longer than any drain here."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for k in range(1, 1001):
        chunk = {"id": "cmpl-slow", "object": "text_completion",
                 "choices": [{"index": 0, "text": "x", "finish_reason": None}],
                 "usage": {"prompt_tokens": 4, "completion_tokens": k}}
        await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await asyncio.sleep(0.02)
    return resp


@pytest.mark.timeout(60)
def test_a_request_cut_off_at_the_drain_limit_keeps_its_tokens() -> None:
    async def main() -> DriveResult:
        app = web.Application()
        app.router.add_post("/v1/completions", slow_stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            wl = Workload(WorkloadConfig(system_prompt_tokens=0,
                                         lengths=LengthSpec("fixed", 4, 1000)),
                          random.Random(0))
            async with make_session() as session:
                return await drive([url], ClosedLoop(wl, 1), IdsPayload("m"),
                                   window_end=0.2, drain_s=0.3, clock=Clock(),
                                   session=session)
        finally:
            await runner.cleanup()

    res = asyncio.run(main())
    (rec,) = res.records
    assert rec.outcome == "timeout"
    assert rec.response_id == "cmpl-slow"
    assert 5 <= len(rec.token_times) == rec.output_tokens < 1000
    assert rec.first_token_time == rec.token_times[0]
    # its tokens count where they arrived
    point = summarize_point(res.records, load=ClosedLoad(1),
                            window=(0.0, 0.2), slo=SLO(), mode="closed", seed=0,
                            flushed=False)
    arrived = sum(1 for t in rec.token_times if t < 0.2)
    assert arrived > 0 and point.output_tok_s == pytest.approx(arrived / 0.2)
