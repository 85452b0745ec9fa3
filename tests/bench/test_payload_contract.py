"""The payload contract (bench/payload.py): what the drive and a sweep's run call, typed, with no
hook probed for; `Shaped` passes every hook on and cuts only the body; a live run is handed
everything it needs of its sweep once (`RunContext`) and runs without a `LiveSweep`."""

from __future__ import annotations

import asyncio
import inspect
import random
from pathlib import Path
from typing import Any

import pytest

from chatfleet.bench import chat_payload, drive, live_run, payload, sweep
from chatfleet.bench.chat_payload import ChatPayload
from chatfleet.bench.client import make_session
from chatfleet.bench.live_run import LivePoints, RunContext
from chatfleet.bench.payload import AheadStats, Body, IdsPayload, Payload, PlainPayload, Shaped
from chatfleet.bench.results import SweepDir
from chatfleet.bench.sweep_config import LiveSweepConfig
from chatfleet.core.documents.sweep import ClosedLoad, SweepPoint
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import LengthSpec, RequestSpec, Workload, WorkloadConfig, driver_for
from chatfleet.core.workload.ahead import TurnsAhead
from chatfleet.engines import get_adapter
from chatfleet.simserver.server import ServerConfig, serve_in_thread

HOOKS = sorted(name for name, member in vars(Payload).items()
               if inspect.isfunction(member) and not name.startswith("_"))


def test_the_contract_names_every_hook_the_drive_and_the_run_call() -> None:
    assert HOOKS == ["ahead_stats", "build_ahead", "close", "end_session", "on_answer",
                     "prefetch", "prepare", "reset"]
    # each implementation defines every hook itself or through PlainPayload's no-ops
    for impl in (PlainPayload, IdsPayload, ChatPayload, Shaped):
        assert all(callable(getattr(impl, hook, None)) for hook in HOOKS), impl


def test_nothing_probes_a_payload_for_its_hooks() -> None:
    """The drive, the run and the sweep call the hooks; none asks whether a payload has one."""
    for module in (drive, live_run, sweep, payload, chat_payload):
        src = inspect.getsource(module)
        for hook in HOOKS:
            assert f'"{hook}"' not in src, (module.__name__, hook)
        assert "hasattr(" not in src and "getattr(payload" not in src


class Spy:
    """A payload that notes every hook called on it, with its arguments; its bodies are
    `body`'s (a fixed one by default)."""

    def __init__(self, body: Payload | None = None) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.body = body

    def __call__(self, spec: RequestSpec) -> Body:
        if self.body is not None:
            return self.body(spec)
        return "/v1/completions", {"prompt": [1], "extra_field": True}

    def reset(self, seed: int) -> None:
        self.calls.append(("reset", (seed,)))

    async def build_ahead(self, ahead: TurnsAhead, per_stream: int | None,
                          system: Any = (), progress: Any = None) -> None:
        self.calls.append(("build_ahead", (per_stream, list(system))))

    def prefetch(self, spec: RequestSpec) -> None:
        self.calls.append(("prefetch", (spec.request_id,)))

    async def prepare(self, spec: RequestSpec) -> None:
        self.calls.append(("prepare", (spec.request_id,)))

    def on_answer(self, spec: RequestSpec, text: str) -> None:
        self.calls.append(("on_answer", (spec.request_id, text)))

    def end_session(self, session_id: str) -> None:
        self.calls.append(("end_session", (session_id,)))

    def ahead_stats(self) -> AheadStats | None:
        self.calls.append(("ahead_stats", ()))
        return AheadStats(built_ahead=3)

    def close(self) -> None:
        self.calls.append(("close", ()))


def test_shaped_passes_every_hook_on_and_cuts_only_the_body() -> None:
    spy = Spy()
    shaped: Payload = Shaped(spy, get_adapter("openai"))
    wcfg = WorkloadConfig(system_prompt_tokens=0, lengths=LengthSpec("fixed", 4, 2))
    spec = driver_for(ClosedLoad(1), Workload(wcfg, random.Random(0))).start()[0]
    assert spec is not None
    ahead = TurnsAhead(wcfg, 0, ClosedLoad(1), 10.0)

    async def every_hook() -> None:
        shaped.reset(5)
        await shaped.build_ahead(ahead, 2, [(1, 8)])
        shaped.prefetch(spec)
        await shaped.prepare(spec)
        shaped.on_answer(spec, "text")
        shaped.end_session(spec.session_id)
        assert shaped.ahead_stats() == AheadStats(built_ahead=3)
        shaped.close()

    asyncio.run(every_hook())
    assert [name for name, _ in spy.calls] == [
        "reset", "build_ahead", "prefetch", "prepare", "on_answer", "end_session",
        "ahead_stats", "close"]
    assert sorted(name for name, _ in spy.calls) == HOOKS
    assert spy.calls[1] == ("build_ahead", (2, [(1, 8)]))
    assert spy.calls[4] == ("on_answer", (spec.request_id, "text"))
    path, body = shaped(spec)  # a plain OpenAI server takes no field of its own
    assert path == "/v1/completions" and body == {"prompt": [1]}


def test_the_token_id_payload_builds_nothing_and_keeps_nothing() -> None:
    wcfg = WorkloadConfig(system_prompt_tokens=16, lengths=LengthSpec("fixed", 4, 2))
    spec = driver_for(ClosedLoad(1), Workload(wcfg, random.Random(0))).start()[0]
    assert spec is not None
    ids = IdsPayload("m", send_rid=True)
    ids.reset(3)
    ids.on_answer(spec, "x")
    assert ids.ahead_stats() is None
    path, body = ids(spec)
    assert path == "/v1/completions" and body["rid"] == spec.request_id
    assert body["prompt"] == spec.prompt_ids().tolist() and len(body["prompt"]) == 16 + 4
    assert body["min_tokens"] == body["max_tokens"] == 2 and body["ignore_eos"] is True
    assert "rid" not in IdsPayload("m")(spec)[1]


@pytest.mark.timeout(120)
def test_a_live_run_needs_nothing_of_its_sweep_but_its_context(tmp_path: Path) -> None:
    """LivePoints run by hand from a RunContext, with no LiveSweep: the point, the run's
    files, and the events and payload hooks of one run, in order."""
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
    wcfg = WorkloadConfig(system_prompt_tokens=64, lengths=LengthSpec("fixed", 32, 8))
    events: list[str] = []
    spy = Spy(IdsPayload("qwen3-8b"))
    with serve_in_thread(ServerConfig(spec=spec, time_scale=20)) as srv:
        cfg = LiveSweepConfig(targets=srv.urls, engine="simserver", model="qwen3-8b",
                              loads=[ClosedLoad(2)], wcfg=wcfg, out=tmp_path, duration_s=4.0,
                              warmup_s=1.0, drain_s=30.0, seed=11, api="completions-ids",
                              max_loop_lag_ms=100.0, max_send_lag_ms=200.0)
        folder = SweepDir(tmp_path)
        folder.start({"target": {}}, False)

        async def one_run() -> SweepPoint:
            async with make_session() as session:
                ctx = RunContext(cfg=cfg, adapter=get_adapter("simserver"), session=session,
                                 folder=folder, payload=spy, count_text=None,
                                 time_scale=20.0, stop=asyncio.Event(),
                                 on_event=lambda kind, info: events.append(kind), done=[])
                return await LivePoints(ctx).run(ClosedLoad(2), 3)

        point = asyncio.run(one_run())
    assert point.seed == 11 + 3 and point.live is not None and point.live.run_index == 3
    assert point.flushed and point.requests.completed > 2 and point.requests.failed == 0
    assert (tmp_path / "runs" / "003" / "records.jsonl").exists()
    assert events == ["run"]
    names = [name for name, _ in spy.calls]
    assert names[:2] == ["reset", "build_ahead"] and spy.calls[0] == ("reset", (14,))
    assert spy.calls[1] == ("build_ahead", (0, [(1, 64)]))  # no finished point: lookahead
    assert names[-1] == "ahead_stats" and "close" not in names  # the sweep closes it
    assert point.live.prompt_texts is not None and point.live.prompt_texts.built_ahead == 3
