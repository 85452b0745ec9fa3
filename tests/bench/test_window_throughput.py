"""Throughput against the simserver's own trace: the output tokens the harness counts in the
window are the tokens the server sent in it (the trace's ground truth), and every record
carries the engine's response id, which names its request in the trace."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import orjson
import pytest

from chatfleet.bench.client import Clock, make_session
from chatfleet.bench.drive import DriveResult, completions_with_ids, drive
from chatfleet.bench.results import SweepDir
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.metrics import SLO, summarize_point
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
                              completions_with_ids("qwen3-8b"),  # no rid: the server names it
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
    point = summarize_point(res.records, load={"mode": "closed", "concurrency": USERS},
                            window=window, slo=SLO(), mode="closed", seed=5, flushed=False,
                            time_scale=SCALE)
    # ground truth: the tokens the server wrote in the window, on the client's model clock
    in_window = sum(1 for r in sent
                    if window[0] <= (r["actual_mono"] - clock.t0) * SCALE < window[1])
    truth = in_window / DURATION_S
    assert point["output_tok_s"] == pytest.approx(truth, rel=0.01)
    assert point["requests"]["finished_in_window"] > USERS

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
