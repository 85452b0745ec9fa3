"""`chatfleet sweep`: the pre-launch measurement, with the method automated.

Before every run: a new seed (base + run index), a cool-down under the temperature threshold
(bounded, recorded), a flush through the engine adapter (refusals retried, then recorded), and,
through the chat API, the prompt texts the run will send, built before its clock starts.
During it: every token's arrival, cached tokens from usage, the engine's metrics every second,
GPU telemetry every 100 ms, the client's own send and loop lag. After it: the point, appended to
runs.jsonl with fsync; the document rewritten; the knee, the throughput peak and the cap.

A run is invalid, and kept with its reason, when the flush did not take (refused, or the first
request of the run found a cached prefix), when the client fell behind (send-lag or loop-lag
p99 over the bound), when the GPU's median SM clock was under the floor, or when it was cut
short by Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from chatfleet import __version__
from chatfleet.bench.client import Clock, make_session
from chatfleet.bench.drive import DriveResult, Payload, completions_with_ids, drive
from chatfleet.bench.payload import AheadStats, ChatPayload
from chatfleet.bench.results import SweepDir
from chatfleet.bench.scrape import EngineScraper, engine_block_from
from chatfleet.bench.telemetry import TelemetrySampler, cool_down, make_source
from chatfleet.bench.text_pool import DEFAULT_WORKERS, TextPool
from chatfleet.core.defaults import COOLDOWN_MAX_S, DRAIN_S, DURATION_S, SEED, WARMUP_S
from chatfleet.core.documents.sweep import (
    ClientBlock,
    ClosedLoad,
    LiveRun,
    Load,
    PromptTexts,
    RunFiles,
    SweepDoc,
    SweepPoint,
    TokenCheck,
)
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.measure.knee import find_knee
from chatfleet.core.measure.percentiles import percentiles
from chatfleet.core.measure.point import summarize_point
from chatfleet.core.measure.validity import RunChecks, invalid_reasons
from chatfleet.core.refine import BISECT_MAX_RUNS, EXTEND_MAX_RUNS, RefinePolicy
from chatfleet.core.slo import SLO
from chatfleet.core.sweep import Sweep
from chatfleet.core.workload import (
    RequestSpec,
    Workload,
    WorkloadConfig,
    driver_for,
)
from chatfleet.core.workload.ahead import TurnsAhead, turns_to_build
from chatfleet.data.tokenizer import load_qwen_tokenizer
from chatfleet.engines import EngineAdapter, FlushVerdict, flush_and_verify, get_adapter
from chatfleet.engines.base import HTTP_TIMEOUT_S

FLUSH_TRIES = 3
FLUSH_RETRY_S = 2.0


@dataclass
class LiveSweepConfig:
    targets: list[str]
    engine: str
    model: str
    loads: list[Load]
    wcfg: WorkloadConfig
    out: Path
    slo: SLO = field(default_factory=SLO)
    duration_s: float = DURATION_S
    warmup_s: float = WARMUP_S
    drain_s: float = DRAIN_S
    flush: bool = True
    seed: int = SEED
    telemetry: str = "none"
    cooldown_temp_c: float | None = None
    cooldown_max_s: float = COOLDOWN_MAX_S
    clock_floor_mhz: float | None = None
    resume: bool = False
    refine: bool = False
    refine_max_runs: int = BISECT_MAX_RUNS  # bisection runs per bracket
    refine_extend_max_runs: int = EXTEND_MAX_RUNS  # doublings/halvings
    refine_max_users: int = 1024  # an open closed-loop bracket is never extended beyond it
    refine_budget_s: float | None = None  # wall time for all refinement runs together
    cap_margin: int = 0
    api: str = "chat"  # chat | completions-ids
    thinking: bool = False
    api_key: str | None = None
    max_send_lag_ms: float = 50.0
    max_loop_lag_ms: float = 10.0
    labels: dict[str, Any] = field(default_factory=dict)  # gpu, weights, kv_cache for reports
    save_records: bool = True
    prompt_workers: int = DEFAULT_WORKERS  # processes that build chat prompt texts

    def refine_policy(self) -> RefinePolicy:
        return RefinePolicy(extend_max_runs=self.refine_extend_max_runs,
                            bisect_max_runs=self.refine_max_runs,
                            max_concurrency=self.refine_max_users)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def p99(values: list[float]) -> float:
    """The p99 of the client's lags (core.measure.percentiles: linear, 0 for none)."""
    return percentiles(values, (99.0,))["p99"]


Event = Callable[[str, Mapping[str, Any]], None]


class LiveSweep:
    """`chatfleet sweep`: `core.sweep.Sweep` (the grid, then the one refinement policy) over
    the live point runner (`LivePoints`), each point appended to runs.jsonl and the document
    rewritten as it finishes. Events for the CLI: run, point, skip, refine, refine_budget,
    cooldown."""

    def __init__(self, cfg: LiveSweepConfig, on_event: Event | None = None) -> None:
        self.cfg = cfg
        self.adapter: EngineAdapter = get_adapter(cfg.engine)
        self.dir = SweepDir(cfg.out)
        self.on_event: Event = on_event or (lambda kind, info: None)
        self.stop = asyncio.Event()
        self.time_scale = 1.0
        self.target: dict[str, Any] = {}
        self.points: list[SweepPoint] = []
        self.doc: SweepDoc | None = None
        self._payload: Payload | None = None

    # --- set-up ---------------------------------------------------------------------------
    def workload_block(self) -> dict[str, Any]:
        c = self.cfg
        return {**c.wcfg.to_json(), "duration_s": c.duration_s, "warmup_s": c.warmup_s,
                "seed": c.seed, "api": c.api, "thinking": c.thinking,
                "ignore_eos": self.adapter.accepts_ignore_eos}

    async def describe_target(self, session: aiohttp.ClientSession) -> None:
        c = self.cfg
        infos = []
        for url in c.targets:
            await check_reachable(session, url)
            infos.append(await self.adapter.server_info(session, url))
        info = infos[0] if infos else {}
        self.time_scale = float(info.get("time_scale") or 1.0)
        self.target = {
            "engine": c.engine, "model": c.model, "urls": c.targets,
            "engine_info": info, "chatfleet_version": __version__, "chatfleet_commit":
            git_commit(), **c.labels,
        }

    def payload(self) -> Payload:
        if self._payload is not None:
            return self._payload
        self._payload = self._make_payload()
        return self._payload

    def _make_payload(self) -> Payload:
        inner: Payload
        if self.cfg.api == "completions-ids":
            inner = completions_with_ids(self.cfg.model, self.adapter.accepts_ignore_eos)
        else:
            tok = load_qwen_tokenizer()
            pool = TextPool(tok.directory, self.cfg.prompt_workers)
            pool.start()  # before any clock: the workers load the tokenizer
            inner = ChatPayload(tok, self.cfg.model,
                                ignore_eos=self.adapter.accepts_ignore_eos,
                                thinking=self.cfg.thinking,
                                continuous_usage=self.adapter.accepts_continuous_usage,
                                system_groups=self.cfg.wcfg.prompt_groups, pool=pool)
        return Shaped(inner, self.adapter)

    def count_text(self) -> Callable[[str], int] | None:
        """Where the engine sends no running usage, count each chunk with the tokenizer."""
        if self.adapter.accepts_continuous_usage:
            return None
        tok = load_qwen_tokenizer()
        return lambda text: len(tok.encode(text))

    # --- one run ---------------------------------------------------------------------------
    async def flush_all(self, session: aiohttp.ClientSession
                        ) -> tuple[bool, str, list[dict[str, Any]]]:
        """Flush every target (refusals retried). Where the engine's answer proves nothing
        (vLLM's 200), the flush is proven from its prefix-cache counters around a re-sent probe
        (`engines.flush_and_verify`); the verdicts come back for the point's `flush_check`.
        A verdict of None (no counters, metrics lag) leaves the check to the run's first
        requests."""
        details: list[str] = []
        checks: list[dict[str, Any]] = []
        for url in self.cfg.targets:
            verdict: FlushVerdict | None = None
            for attempt in range(FLUSH_TRIES):
                if self.adapter.flush_needs_verification:
                    res, verdict = await flush_and_verify(self.adapter, session, url,
                                                          self.cfg.model)
                    done = res.ok and verdict.verified is not False
                else:
                    res = await self.adapter.flush(session, url)
                    done = res.ok
                if done:
                    break
                if attempt + 1 < FLUSH_TRIES:
                    await asyncio.sleep(FLUSH_RETRY_S)
            if verdict is not None:
                checks.append({"url": url, "attempts": attempt + 1, **verdict.as_dict()})
            if not res.ok:
                details.append(f"{url}: {res.detail}")
            elif verdict is not None and verdict.verified is False:
                details.append(f"{url}: {verdict.detail}")
        return (not details), "; ".join(details), checks

    def point_runner(self, session: aiohttp.ClientSession) -> LivePoints:
        return LivePoints(self, session)

    # --- the sweep ---------------------------------------------------------------------------
    def _record(self, point: SweepPoint) -> None:
        self.dir.append_run(point)
        self.points.append(point)
        self.doc = self.dir.write_doc(self.target, self.workload_block(), self.cfg.slo,
                                      self.points, self.cfg.cap_margin)
        self.on_event("point", {"index": point.run_index, "point": point})

    async def run(self) -> SweepDoc:
        try:
            return await self._run()
        finally:
            close = getattr(self._payload, "close", None)
            if close is not None:
                close()  # the prompt text workers

    async def _run(self) -> SweepDoc:
        c = self.cfg
        async with make_session() as session:
            await self.describe_target(session)
            meta = {"target": self.target, "target_url": c.targets,
                    "workload": self.workload_block(), "slo": c.slo.to_json()}
            self.points = self.dir.start(meta, c.resume)
            sweep = Sweep(c.loads, attainment=c.slo.attainment, seed=c.seed, refine=c.refine,
                          policy=c.refine_policy(), done=self.points)
            for job in sweep.skipped:
                self.on_event("skip", {"index": job.index, "load": job.load})
            await self._drive(sweep, self.point_runner(session))
            if self.doc is None:
                self.doc = self.dir.write_doc(self.target, self.workload_block(), c.slo,
                                              self.points, c.cap_margin)
        return self.doc

    async def _drive(self, sweep: Sweep, runner: LivePoints) -> None:
        """`sweep`'s runs in order until it is done or Ctrl-C stops it; refinement starts no
        run after `refine_budget_s` of wall time spent refining."""
        c = self.cfg
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while not self.stop.is_set() and (job := sweep.next()) is not None:
            if job.refining:
                if deadline is None and c.refine_budget_s is not None:
                    deadline = loop.time() + c.refine_budget_s
                if deadline is not None and loop.time() >= deadline:
                    self.on_event("refine_budget", {"budget_s": c.refine_budget_s,
                                                    "load": job.load})
                    return
                self.on_event("refine", {"load": job.load, "phase": job.phase,
                                         "knee": find_knee(sweep.points, job.load.mode,
                                                           c.slo.attainment)})
            point = await runner.run(job.load, job.index)
            sweep.record(job, point)
            self._record(point)


class LivePoints:
    """The live point runner (`core.sweep`'s protocol, awaited): one run against the sweep's
    targets, its point built whole, validity included (`core.measure.validity`)."""

    def __init__(self, sweep: LiveSweep, session: aiohttp.ClientSession) -> None:
        self.sweep = sweep
        self.session = session

    async def run(self, load: Load, index: int) -> SweepPoint:
        sw, c, session = self.sweep, self.sweep.cfg, self.session
        seed = c.seed + index
        rundir = sw.dir.run_dir(index)
        source = make_source(c.telemetry, c.targets[0])
        cooldown = None
        if c.cooldown_temp_c is not None:
            sw.on_event("cooldown", {"index": index})
            cooldown = await cool_down(source, c.cooldown_temp_c, c.cooldown_max_s)
        unflushed: list[str] = []
        flushed = False
        flush_check: list[dict[str, Any]] = []
        if c.flush:
            flushed, detail, flush_check = await sw.flush_all(session)
            if not flushed:
                unflushed.append(detail)
        workload = Workload(c.wcfg, random.Random(seed))
        driver = driver_for(load, workload)
        payload = sw.payload()  # before the clock starts: loading a tokenizer takes time
        reset = getattr(payload, "reset", None)
        if reset is not None:
            reset(seed)
        window_end = c.warmup_s + c.duration_s
        await self.build_ahead(payload, workload, load, seed, index, window_end)
        headers = {"Authorization": f"Bearer {c.api_key}"} if c.api_key else None
        sw.on_event("run", {"index": index, "load": load, "seed": seed})
        with frozen_heap():
            clock = Clock(sw.time_scale)
            async with TelemetrySampler(source, clock=clock,
                                        path=rundir / "telemetry.jsonl") as tele, \
                    EngineScraper(sw.adapter, session, c.targets, clock=clock,
                                  path=rundir / "engine.jsonl") as scraper:
                res: DriveResult = await drive(c.targets, driver, payload,
                                               window_end=window_end, drain_s=c.drain_s,
                                               clock=clock, session=session, headers=headers,
                                               stop=sw.stop, count_text=sw.count_text())
        records = res.records
        # the flush took only if the first request each target saw found nothing cached
        # (where the engine reports cached tokens at all)
        reported = {id(o.record) for o in res.outcomes if o.cached_reported}
        if c.flush and flushed:
            for url in c.targets:
                first = min((r for r in records if r.replica == url and r.outcome == "ok"),
                            key=lambda r: r.send_time, default=None)
                if first is not None and id(first) in reported and first.cached_tokens > 0:
                    unflushed.append(f"the first request on {url} found "
                                     f"{first.cached_tokens} cached tokens")
                    flushed = False
        win_send, win_loop = res.window_lags(c.warmup_s, window_end)
        send_p99, loop_p99 = p99(win_send), p99(win_loop)
        gpu = tele.summary(c.warmup_s, window_end)
        reasons = invalid_reasons(RunChecks(
            unflushed=unflushed, send_lag_ms_p99=send_p99, loop_lag_ms_p99=loop_p99,
            max_send_lag_ms=c.max_send_lag_ms, max_loop_lag_ms=c.max_loop_lag_ms, gpu=gpu,
            clock_floor_mhz=c.clock_floor_mhz, interrupted=res.interrupted))
        if c.save_records:
            sw.dir.write_records(index, records)
        checked = sw.adapter.accepts_ignore_eos
        asked = [(o.asked_tokens, o.record.output_tokens) for o in res.outcomes
                 if o.record.outcome == "ok" and o.asked_tokens]
        mismatched = [(a, g) for a, g in asked if a != g]
        live = LiveRun(
            run_index=index,
            token_check=TokenCheck(
                checked=len(asked) if checked else 0,
                mismatched=len(mismatched) if checked else 0,
                examples=tuple(mismatched[:5]) if checked else (),
                note=None if checked else
                f"{c.engine} takes no ignore_eos: answer lengths are the engine's own"),
            flush_check=tuple(flush_check) or None,
            cooldown=cooldown,
            clock_floor_mhz=c.clock_floor_mhz,
            files=RunFiles(telemetry=f"runs/{index:03d}/telemetry.jsonl",
                           engine=f"runs/{index:03d}/engine.jsonl",
                           records=f"runs/{index:03d}/records.jsonl" if c.save_records
                           else None),
            wall_s=round(res.wall_s, 2),
            prompt_texts=prompt_texts(payload, (c.warmup_s, window_end)))
        return summarize_point(
            records, load=load, window=(c.warmup_s, window_end), slo=c.slo, seed=seed,
            flushed=flushed if c.flush else False, invalid_reasons=reasons,
            engine=engine_block_from(scraper.samples, c.warmup_s, window_end),
            gpu=gpu,
            client=ClientBlock(
                send_lag_ms_p99=round(send_p99, 3), loop_lag_ms_p99=round(loop_p99, 3),
                send_lag_ms_max=round(max(win_send, default=0.0), 3),
                loop_lag_ms_max=round(max(win_loop, default=0.0), 3),
                run_send_lag_ms_p99=round(p99(res.send_lag_ms), 3),
                bounds_ms=(c.max_send_lag_ms, c.max_loop_lag_ms)),
            time_scale=sw.time_scale, live=live)

    async def build_ahead(self, payload: Payload, workload: Workload, load: Load, seed: int,
                          index: int, window_end: float) -> None:
        """Before the run's clock starts, a chat payload builds the texts the run will send
        (bench/payload.py): the shared system prompts, every open-loop session of the window,
        and each closed-loop user's turns as many as the sweep's finished points say it will
        send (`turns_to_build`; the lookahead's few without one)."""
        build = getattr(payload, "build_ahead", None)
        if build is None:
            return
        sw, c = self.sweep, self.sweep.cfg
        ahead = TurnsAhead(c.wcfg, seed, load, window_end)
        per_user = turns_to_build(load, window_end, sw.points)
        if per_user is None and isinstance(load, ClosedLoad):
            per_user = 0  # the lookahead's turns only
        system = ([workload.system_segment(g) for g in range(c.wcfg.prompt_groups)]
                  if c.wcfg.system_prompt_tokens else [])

        def progress(done: int, total: int) -> None:
            sw.on_event("texts", {"index": index, "done": done, "total": total})

        await build(ahead, per_user, system, progress)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """While a run's clock runs, the objects made before it (the prompt texts' keys, the
    sessions' plans, the sweep's own) are left out of the cyclic collector's full passes: one
    over them held the loop for 60 ms in a 256-user run. They return to it after the run."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def prompt_texts(payload: Payload, window: tuple[float, float]) -> PromptTexts | None:
    """A chat payload's texts of the run just driven (None for token ids)."""
    stats_of = getattr(payload, "ahead_stats", None)
    if stats_of is None:
        return None
    stats: AheadStats = stats_of()
    return PromptTexts(built_ahead=stats.built_ahead, ahead_s=round(stats.ahead_s, 3),
                       built_in_run=stats.built_in_run,
                       late=sum(1 for t in stats.late if window[0] <= t < window[1]),
                       run_late=len(stats.late))


class Shaped:
    """A payload builder whose bodies are cut to what the engine accepts (a strict OpenAI
    server answers 422 to any other field)."""

    def __init__(self, inner: Payload, adapter: EngineAdapter) -> None:
        self.inner = inner
        self.adapter = adapter
        for hook in ("on_answer", "end_session", "reset", "prefetch", "prepare", "prebuild",
                     "build_ahead", "ahead_stats", "close"):
            if hasattr(inner, hook):
                setattr(self, hook, getattr(inner, hook))

    def __call__(self, spec: RequestSpec) -> tuple[str, dict[str, Any]]:
        path, body = self.inner(spec)
        return path, self.adapter.shape_payload(body)


async def check_reachable(session: aiohttp.ClientSession, url: str) -> None:
    """A target that does not answer HTTP (refused, unknown host, silent), or answers that it
    has no /v1/models (not an OpenAI-compatible server: a wrong port or path), is bad input:
    one line before the sweep starts, not a sweep of failed requests. Any other answer will do
    (a server still loading its model may answer 500 or 503 there)."""
    try:
        async with session.get(url + "/v1/models",
                               timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)) as resp:
            await resp.read()
            status = resp.status
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        why = str(exc) or type(exc).__name__
        raise ChatfleetError(f"cannot reach --target {url}: {why} (is the engine up and "
                             "listening there?)") from None
    if status == 404:
        raise ChatfleetError(f"--target {url} answers 404 for /v1/models: not an "
                             "OpenAI-compatible server (give the engine's base URL, without "
                             "/v1)")


def request_stop(sweep: LiveSweep) -> None:
    """Ctrl-C: finish the current run's record, then stop."""
    with contextlib.suppress(RuntimeError):
        sweep.stop.set()
