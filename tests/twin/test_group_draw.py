"""Prompt groups pinned per user or drawn per request (SGLang's generated-shared-prefix): what
the twin shows with more groups than users, and that the twin and the live sweep (against a
simserver, through the chat payload) give every session the same groups and lengths."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from chatfleet.bench.chat_payload import ChatPayload
from chatfleet.bench.payload import Body, Shaped
from chatfleet.bench.sweep import LiveSweep
from chatfleet.bench.sweep_config import LiveSweepConfig
from chatfleet.core.documents.sweep import ClosedLoad
from chatfleet.core.engine.scheduler import Scheduler
from chatfleet.core.workload import GroupDraw, LengthSpec, RequestSpec, WorkloadConfig
from chatfleet.simserver.server import ServerConfig, serve_in_thread
from chatfleet.twin.run import run_point
from tests.twin.conftest import engine

# 512-token prompts in a 12,288-token pool: 16 groups' prefixes (8k) fit beside 16 running
# requests, 32 (16k) and 64 (32k) do not
SMALL_POOL = engine("fp8", pool_tokens=12288)


def wcfg(groups: int, draw: GroupDraw, **kw: Any) -> WorkloadConfig:
    kw.setdefault("system_prompt_tokens", 512)
    kw.setdefault("lengths", LengthSpec("fixed", 64, 32))
    return WorkloadConfig(prompt_groups=groups, group_draw=draw, **kw)


def twin(groups: int, draw: GroupDraw) -> tuple[dict[str, Any], set[int]]:
    """A 16-user point and the groups its requests used."""
    used: set[int] = set()

    def route(spec: RequestSpec, scheds: list[Scheduler]) -> int:
        used.add(spec.group)
        return 0

    run = run_point(SMALL_POOL, wcfg(groups, draw), ClosedLoad(16),
                    duration_s=60.0, warmup_s=5.0, route=route)
    return run.point, used


def test_16_users_pinned_use_16_groups_drawn_per_request_they_use_all_and_miss_more() -> None:
    pinned = {g: twin(g, "user") for g in (16, 32, 64)}
    drawn = {g: twin(g, "request") for g in (16, 32, 64)}
    assert all(len(used) == 16 for _, used in pinned.values())
    assert len(drawn[32][1]) > 16 and len(drawn[64][1]) > 32
    # pinned, 32 and 64 groups are the same 16 prefixes: the same figures
    figures = {g: (p.cached_token_share, p.ttft_ms.p99) for g, (p, _) in pinned.items()}
    assert figures[16] == figures[32] == figures[64]
    # drawn per request, the prefixes outgrow the pool: fewer cached tokens, later first tokens
    share = [drawn[g][0].cached_token_share for g in (16, 32, 64)]
    assert share[0] > share[1] > share[2]
    assert share[2] < 0.6 * share[0]
    assert drawn[64][0].ttft_ms.p50 > 1.5 * drawn[16][0].ttft_ms.p50


Trace = dict[str, list[tuple[int, int, int, int]]]  # session -> (group, system, user, output)


def trace_of(spec: RequestSpec, into: Trace) -> None:
    into.setdefault(spec.session_id, []).append(
        (spec.group, spec.segments[0][0], spec.segments[-1][1], spec.max_new_tokens))


class Recorded(Shaped):
    """The sweep's shaped payload, each request and its body (before the cut) recorded as it
    is sent."""

    def __init__(self, shaped: Shaped) -> None:
        super().__init__(shaped.inner, shaped.adapter)
        self.trace: Trace = {}
        self.bodies: list[tuple[RequestSpec, dict[str, Any]]] = []

    def __call__(self, spec: RequestSpec) -> Body:
        trace_of(spec, self.trace)
        path, body = self.inner(spec)
        self.bodies.append((spec, body))
        return path, self.adapter.shape_payload(body)


class RecordingSweep(LiveSweep):
    """The live sweep, its chat payload's requests recorded as they are sent."""

    def _make_payload(self) -> Any:
        shaped = super()._make_payload()
        assert isinstance(shaped, Shaped) and isinstance(shaped.inner, ChatPayload)
        self.chat = shaped.inner
        self.recorded = Recorded(shaped)
        return self.recorded


@pytest.mark.timeout(120)
def test_the_twin_and_the_live_sweep_draw_the_same_groups_per_session(tmp_path: Path) -> None:
    cfg = wcfg(32, "request", system_prompt_tokens=128,
               lengths=LengthSpec("uniform", 32, 16, 0.5, "vllm"), turns=2)
    load = ClosedLoad(6)
    twin_trace: Trace = {}

    def route(spec: RequestSpec, scheds: list[Scheduler]) -> int:
        trace_of(spec, twin_trace)
        return 0

    run_point(engine("fp8"), cfg, load, duration_s=20.0, warmup_s=2.0, seed=7, route=route)
    with serve_in_thread(ServerConfig(spec=engine("fp8"), time_scale=20)) as srv:
        live = RecordingSweep(LiveSweepConfig(
            targets=srv.urls, engine="simserver", model="qwen3-8b", loads=[load], wcfg=cfg,
            out=tmp_path / "s", duration_s=20.0, warmup_s=2.0, drain_s=60.0, seed=7,
            telemetry="simserver", max_loop_lag_ms=100.0, max_send_lag_ms=200.0))
        doc = asyncio.run(live.run())
    assert doc.workload["group_draw"] == cfg.group_draw
    assert orjson.loads((tmp_path / "s" / "sweep.json").read_bytes())["workload"][
        "group_draw"] == cfg.group_draw
    live_trace = live.recorded.trace
    common = sorted(set(twin_trace) & set(live_trace))
    assert len(common) >= 12
    for sid in common:  # the turns both shells reached
        n = min(len(twin_trace[sid]), len(live_trace[sid]))
        assert twin_trace[sid][:n] == live_trace[sid][:n], sid
    assert len({t[0] for sid in common for t in live_trace[sid]}) > 6  # more than one per user
    # the chat payload sends each group's system prompt, byte-identical across sessions
    for spec, body in live.recorded.bodies:
        system = [m["content"] for m in body["messages"] if m["role"] == "system"]
        assert system == [live.chat.segment_text(spec.group + 1, 128)]
