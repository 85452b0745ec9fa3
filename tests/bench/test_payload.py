"""Chat prompts built off the event loop: the text pool's texts are the inline texts (exact
token counts, same seed same bytes), a prepared request builds nothing on the loop, and the
drive starts each build before the request's time and awaits it before the send."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from chatfleet.bench import chat_payload as payload_mod
from chatfleet.bench.chat_payload import ChatPayload, user_text_seed
from chatfleet.bench.client import Clock, make_session
from chatfleet.bench.drive import drive
from chatfleet.bench.payload import PlainPayload, Shaped
from chatfleet.bench.sweep import LiveSweep
from chatfleet.bench.sweep_config import LiveSweepConfig
from chatfleet.bench.text_pool import PARENT_CHECK_S, TextPool
from chatfleet.core.documents.sweep import ClosedLoad, OpenLoad
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.workload import (
    ClosedLoop,
    LengthSpec,
    OpenLoop,
    RequestSpec,
    Workload,
    WorkloadConfig,
    driver_for,
)
from chatfleet.core.workload.ahead import TurnsAhead
from chatfleet.data.exact_tokens import text_of_exact_tokens
from chatfleet.data.tokenizer import load_qwen_tokenizer
from chatfleet.simserver.server import ServerConfig, serve_in_thread
from tests.processes import alive, children

WCFG = WorkloadConfig(system_prompt_tokens=300, lengths=LengthSpec("uniform", 200, 8, 0.5),
                      turns=2)


def forbid_inline(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Make an inline build on this process fail loudly; the calls it saw."""
    calls: list[tuple[int, int]] = []

    def inline(tok: Any, n: int, seed: int, prefix: str = "") -> str:
        calls.append((seed, n))
        raise AssertionError(f"text of segment {seed} ({n} tokens) built on the event loop")

    monkeypatch.setattr(payload_mod, "text_of_exact_tokens", inline)
    return calls


@pytest.fixture(scope="module")
def pool() -> Any:
    with TextPool(load_qwen_tokenizer().directory, workers=1) as p:
        yield p


@pytest.mark.timeout(120)
def test_the_pools_texts_are_the_inline_texts_with_exact_counts(pool: TextPool) -> None:
    tok = load_qwen_tokenizer()
    cases = [(1, 1), (7, 64), (12345, 777), (2, 2043)]

    async def main() -> list[str]:
        return await asyncio.gather(*(pool.text(n, seed) for seed, n in cases))

    texts = asyncio.run(main())
    for (seed, n), text in zip(cases, texts, strict=True):
        assert text == text_of_exact_tokens(tok, n, seed=seed)
        assert len(tok.encode(text)) == n
    assert os.getpid() not in pool.worker_pids()


@pytest.mark.timeout(120)
def test_a_prepared_request_builds_no_text_on_the_event_loop(
        pool: TextPool, monkeypatch: pytest.MonkeyPatch) -> None:
    tok = load_qwen_tokenizer()
    payload = ChatPayload(tok, "m", pool=pool)
    payload.reset(seed=3)
    wl = Workload(WCFG, random.Random(3))
    driver = ClosedLoop(wl, users=2)
    first = driver.start()
    second = driver.on_done(first[0], 1.0)  # the same session's second turn
    system = wl.system_segment(0)
    expected_system = text_of_exact_tokens(tok, system[1], seed=system[0])
    expected_user = {spec.request_id: text_of_exact_tokens(
        tok, spec.segments[-1][1], seed=user_text_seed(3, spec.session_id, spec.turn))
        for spec in (*first, second)}
    calls = forbid_inline(monkeypatch)

    async def main() -> list[dict[str, Any]]:
        await payload.prebuild([system])
        bodies = []
        for spec in first:
            await payload.prepare(spec)
            bodies.append(payload(spec)[1])
        payload.on_answer(first[0], "an answer")
        await payload.prepare(second)
        bodies.append(payload(second)[1])
        return bodies

    bodies = asyncio.run(main())
    assert calls == []
    for spec, body in zip((*first, second), bodies, strict=True):
        msgs = body["messages"]
        assert msgs[0] == {"role": "system", "content": expected_system}
        assert msgs[-1] == {"role": "user", "content": expected_user[spec.request_id]}
        assert len(tok.encode(msgs[-1]["content"])) == spec.segments[-1][1]
    assert [m["role"] for m in bodies[-1]["messages"]] == ["system", "user", "assistant", "user"]
    assert bodies[-1]["messages"][1]["content"] == expected_user[first[0].request_id]
    assert bodies[-1]["messages"][2]["content"] == "an answer"
    # nothing was built ahead here: every request waited for its user message
    assert len(payload.ahead_stats().late) == 3


def test_a_user_messages_text_is_named_by_the_run_seed_session_and_turn() -> None:
    seeds = {user_text_seed(run, session, turn)
             for run in (1, 2) for session in ("s1", "s2", "s1.1") for turn in (0, 1)}
    assert len(seeds) == 12
    assert user_text_seed(1, "s1", 0) == user_text_seed(1, "s1", 0)
    assert min(seeds) > 2**64  # never a system prompt's seed (its group's segment id)


def run_ahead(payload: ChatPayload, load: ClosedLoad | OpenLoad, seed: int,
              window_end: float, per_user: int | None) -> list[RequestSpec]:
    """Build a run's texts ahead, then send its requests as a closed loop would (users
    finishing in turn) or every open-loop session's turns; the specs sent."""
    wl = Workload(WCFG, random.Random(seed))
    driver = driver_for(load, wl)
    payload.reset(seed)
    ahead = TurnsAhead(WCFG, seed, load, window_end)

    async def main() -> list[RequestSpec]:
        await payload.build_ahead(ahead, per_user, [wl.system_segment(0)])
        sent: list[RequestSpec] = []
        if isinstance(driver, ClosedLoop):
            waiting = driver.start()
            for k in range(40):
                spec = waiting.pop(k % len(waiting))
                payload.prefetch(spec)
                await payload.prepare(spec)
                payload(spec)
                sent.append(spec)
                waiting.append(driver.on_done(spec, float(k)))
            return sent
        assert isinstance(driver, OpenLoop)
        spec = driver.next_arrival(0.0)
        while spec.scheduled_time < window_end:
            cur: RequestSpec | None = spec
            while cur is not None:
                payload.prefetch(cur)
                await payload.prepare(cur)
                payload(cur)
                sent.append(cur)
                cur = driver.on_done(cur, cur.scheduled_time)
            spec = driver.next_arrival(spec.scheduled_time)
        return sent

    return asyncio.run(main())


@pytest.mark.timeout(120)
def test_texts_built_before_the_clock_leave_no_request_waiting(
        pool: TextPool, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = ChatPayload(load_qwen_tokenizer(), "m", pool=pool)
    calls = forbid_inline(monkeypatch)
    sent = run_ahead(payload, ClosedLoad(4), seed=5, window_end=60.0, per_user=12)
    stats = payload.ahead_stats()
    assert calls == [] and len(sent) == 40
    assert stats.late == []  # 10 turns a user, all 12 built ahead
    assert stats.built_ahead == 4 * 12 + 1 and stats.ahead_s > 0
    # the open loop: every session of the window, built before the clock
    sent = run_ahead(payload, OpenLoad(rate_rps=2.0), seed=6, window_end=5.0, per_user=None)
    assert calls == [] and len(sent) > 4 and payload.ahead_stats().late == []
    assert payload.ahead_stats().built_in_run == 0


@pytest.mark.timeout(120)
def test_each_send_starts_the_builds_of_its_users_next_turns(pool: TextPool) -> None:
    """Built ahead short of the run (the first point of a sweep knows no rate), the
    lookahead starts each text turns before it is needed."""
    payload = ChatPayload(load_qwen_tokenizer(), "m", pool=pool, lookahead=3)
    wl = Workload(WCFG, random.Random(8))
    driver = ClosedLoop(wl, users=2)
    payload.reset(8)
    ahead = TurnsAhead(WCFG, 8, ClosedLoad(2), 60.0)

    async def main() -> None:
        # the lookahead's own: 4 turns a user, and the system prompt
        await payload.build_ahead(ahead, 0, [wl.system_segment(0)])
        assert payload.ahead_stats().built_ahead == 2 * 4 + 1
        spec = driver.start()[0]
        for k in range(6):
            payload.prefetch(spec)
            later = ahead.following(spec, 3)
            assert len(later) == 3
            for turn in later:  # built, or building, before the next send
                key = (user_text_seed(8, turn.session_id, turn.turn), turn.user_tokens)
                assert key in payload._text or key in payload._pending, (k, turn)
            await payload.prepare(spec)
            spec = driver.on_done(spec, float(k))

    asyncio.run(main())
    # sends 1..5 each started one more turn (the first send's third was built ahead)
    assert payload.ahead_stats().built_in_run == 5


class SlowPrepare(PlainPayload):
    """A payload whose texts take 50 ms to build, off the loop: logs when each request's build
    was asked for and when it was ready."""

    def __init__(self) -> None:
        self.asked: dict[str, float] = {}
        self.ready: dict[str, float] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def prefetch(self, spec: RequestSpec) -> None:
        if spec.request_id not in self.tasks:
            self.asked[spec.request_id] = time.monotonic()
            self.tasks[spec.request_id] = asyncio.ensure_future(self._build(spec))

    async def _build(self, spec: RequestSpec) -> None:
        await asyncio.sleep(0.05)
        self.ready[spec.request_id] = time.monotonic()

    async def prepare(self, spec: RequestSpec) -> None:
        self.prefetch(spec)
        await self.tasks[spec.request_id]

    def __call__(self, spec: RequestSpec) -> tuple[str, dict[str, Any]]:
        assert spec.request_id in self.ready, "sent before its texts were built"
        return "/v1/completions", {"rid": spec.request_id, "max_tokens": 2, "stream": True}


async def answer(request: web.Request) -> web.StreamResponse:
    body = orjson.loads(await request.read())
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for k in (1, 2):
        chunk = {"id": body["rid"], "object": "text_completion",
                 "choices": [{"index": 0, "text": "x", "finish_reason": None}],
                 "usage": {"prompt_tokens": 4, "completion_tokens": k}}
        await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def drive_slow(driver: ClosedLoop | OpenLoop, payload: SlowPrepare,
                     window_end: float) -> tuple[Any, Clock]:
    app = web.Application()
    app.router.add_post("/v1/completions", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        clock = Clock()
        async with make_session() as session:
            res = await drive([url], driver, payload, window_end=window_end, drain_s=5.0,
                              clock=clock, session=session)
        return res, clock
    finally:
        await runner.cleanup()


@pytest.mark.timeout(60)
def test_the_drive_awaits_each_requests_texts_before_it_sends() -> None:
    payload = SlowPrepare()
    wl = Workload(WorkloadConfig(system_prompt_tokens=0, lengths=LengthSpec("fixed", 4, 2),
                                 think_time_s=0.2, think_dist="fixed", turns=3),
                  random.Random(0))
    res, clock = asyncio.run(drive_slow(ClosedLoop(wl, users=2), payload, window_end=1.5))
    ok = [r for r in res.records if r.outcome == "ok"]
    assert len(ok) >= 6
    for r in ok:
        ready = (payload.ready[r.request_id] - clock.t0) * clock.scale
        assert r.send_time >= ready
    # with 200 ms of think time the 50 ms build is hidden: the next turns leave on time
    later = [lag for t, lag in res.send_lag if t > 0.1]
    assert later and max(later) < 40.0


@pytest.mark.timeout(60)
def test_an_open_loop_arrival_is_prefetched_before_its_time() -> None:
    payload = SlowPrepare()
    wl = Workload(WorkloadConfig(system_prompt_tokens=0, lengths=LengthSpec("fixed", 4, 2)),
                  random.Random(1))
    res, clock = asyncio.run(drive_slow(OpenLoop(wl, rate=5.0), payload, window_end=2.0))
    assert len(res.records) >= 3
    for r in res.records:
        asked = (payload.asked[r.request_id] - clock.t0) * clock.scale
        assert asked <= r.scheduled_time + 0.005  # asked for when the arrival was drawn


@pytest.mark.timeout(180)
def test_a_chat_sweep_builds_its_prompts_in_the_pool(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls = forbid_inline(monkeypatch)
    spec = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"))
    with serve_in_thread(ServerConfig(spec=spec, time_scale=20)) as srv:
        cfg = LiveSweepConfig(
            targets=srv.urls, engine="simserver", model="qwen3-8b",
            loads=[ClosedLoad(4), ClosedLoad(4)], wcfg=WCFG, out=tmp_path / "s",
            duration_s=6.0, warmup_s=1.0, drain_s=30.0, api="chat", telemetry="none",
            prompt_workers=1, max_loop_lag_ms=100.0, max_send_lag_ms=200.0)
        sweep = LiveSweep(cfg)
        doc = asyncio.run(sweep.run())
    first, second = doc.points
    assert calls == []
    for point in (first, second):
        assert point.requests.completed > 4 and point.requests.failed == 0
        assert point.live is not None and point.live.token_check is not None
        assert point.live.token_check.mismatched == 0
    # the texts were built before each run's clock: the first run knew no rate, so its users'
    # first turns (the lookahead's 3 and the one being sent) and the system prompt; the second
    # as many turns as the first run's users sent, and more
    texts = [p.live.prompt_texts for p in (first, second)]  # type: ignore[union-attr]
    assert texts[0] is not None and texts[1] is not None
    assert texts[0].built_ahead == 4 * 4 + 1
    sent = (first.request_rps * 7.0) / 4  # a user's turns in the 7 s before the window's end
    assert texts[1].built_ahead > 4 * max(4, sent)
    assert texts[1].built_ahead > texts[0].built_ahead
    assert 0 <= texts[1].late <= texts[1].run_late
    # the simserver counted the prompts the harness meant: system + user segments, exact
    records = [orjson.loads(x) for x in (tmp_path / "s" / "runs" / "000" /
                                         "records.jsonl").read_bytes().splitlines()]
    assert records and all(r["prompt_tokens"] > WCFG.system_prompt_tokens for r in records)
    # the workers stop with the sweep
    shaped = sweep._payload
    assert isinstance(shaped, Shaped) and isinstance(shaped.inner, ChatPayload)
    assert shaped.inner.pool is None


@pytest.mark.timeout(120)
def test_a_pools_workers_exit_when_their_harness_is_killed() -> None:
    """A sweep killed by SIGKILL cannot close its pool: its workers, which hold both ends of
    their call queue's pipe and so never read an end of file, stayed alive with the tokenizer
    loaded (137 MiB each, two per killed sweep). They watch their parent instead."""
    code = ("import sys\n"
            "from chatfleet.bench.text_pool import TextPool\n"
            "pool = TextPool(workers=2)\n"
            "pool.start()\n"
            "print('started', flush=True)\n"
            "sys.stdin.read()\n")
    harness = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert harness.stdout is not None
        assert harness.stdout.readline().strip() == "started"
        pids = children(harness.pid)
        assert len(pids) >= 2 and all(alive(p) for p in pids), pids
    finally:
        harness.kill()
        harness.wait(timeout=30)
    deadline = time.monotonic() + 10 * PARENT_CHECK_S + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), pids
