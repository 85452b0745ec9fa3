"""One run of `chatfleet sweep`: the live point runner (`core.sweep`'s protocol, awaited).

Before the run's clock: a cool-down under the temperature threshold (bounded, recorded), a
flush of every target (refusals retried, then recorded), and the payload reset to the run's
seed with the prompt texts it will send built. During it: the drive, GPU telemetry and the
engine's metrics. After it: the run's records written and its point built whole, validity
included (`core.measure.validity`).

`LivePoints` is handed everything it needs of its sweep once, as a `RunContext`: the settings,
the engine's adapter and the HTTP session to its targets, the sweep's folder, the payload, the
clock's scale, the stop event, where its events go, and the points the sweep has finished. It
reads nothing else of the sweep and changes none of it: the sweep (bench/sweep.py) records the
point it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from chatfleet.bench.client import Clock
from chatfleet.bench.drive import DriveResult, drive
from chatfleet.bench.payload import Payload
from chatfleet.bench.results import SweepDir
from chatfleet.bench.scrape import EngineScraper, engine_block_from
from chatfleet.bench.sweep_config import LiveSweepConfig
from chatfleet.bench.telemetry import TelemetrySampler, cool_down, make_source
from chatfleet.core.documents.sweep import (
    ClientBlock,
    ClosedLoad,
    Cooldown,
    LiveRun,
    Load,
    PromptTexts,
    RunFiles,
    SweepPoint,
    TokenCheck,
)
from chatfleet.core.measure.percentiles import percentiles
from chatfleet.core.measure.point import summarize_point
from chatfleet.core.measure.validity import RunChecks, invalid_reasons
from chatfleet.core.workload import Workload, driver_for
from chatfleet.core.workload.ahead import TurnsAhead, turns_to_build
from chatfleet.engines import EngineAdapter, FlushVerdict, flush_and_verify

FLUSH_TRIES = 3
FLUSH_RETRY_S = 2.0

Event = Callable[[str, Mapping[str, Any]], None]  # (kind, info): what the CLI shows


@dataclass(frozen=True)
class RunContext:
    """What a live run is given by its sweep (the module docstring). `done` is the sweep's
    list of finished points, which grows as the sweep records them: a run reads it (how many
    turns its users will send) and never changes it."""

    cfg: LiveSweepConfig
    adapter: EngineAdapter
    session: aiohttp.ClientSession
    folder: SweepDir
    payload: Payload
    count_text: Callable[[str], int] | None  # None: the engine sends running usage
    time_scale: float  # the target's: model seconds per wall second
    stop: asyncio.Event  # set by Ctrl-C: the run's window ends early
    on_event: Event
    done: Sequence[SweepPoint]


@dataclass(frozen=True)
class Flushed:
    """Every target flushed (`ok`), or why not (`detail`); the verdicts of the engines whose
    answer proves nothing, for the point's `flush_check`."""

    ok: bool
    detail: str
    checks: list[dict[str, Any]]


async def flush_all(adapter: EngineAdapter, session: aiohttp.ClientSession,
                    targets: Sequence[str], model: str) -> Flushed:
    """Flush every target (refusals retried). Where the engine's answer proves nothing
    (vLLM's 200), the flush is proven from its prefix-cache counters around a re-sent probe
    (`engines.flush_and_verify`). A verdict of None (no counters, metrics lag) leaves the check
    to the run's first requests."""
    details: list[str] = []
    checks: list[dict[str, Any]] = []
    for url in targets:
        verdict: FlushVerdict | None = None
        for attempt in range(FLUSH_TRIES):
            if adapter.flush_needs_verification:
                res, verdict = await flush_and_verify(adapter, session, url, model)
                done = res.ok and verdict.verified is not False
            else:
                res = await adapter.flush(session, url)
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
    return Flushed(not details, "; ".join(details), checks)


def p99(values: list[float]) -> float:
    """The p99 of the client's lags (core.measure.percentiles: linear, 0 for none)."""
    return percentiles(values, (99.0,))["p99"]


class LivePoints:
    """The live point runner: one run against the sweep's targets, its point built whole."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx

    async def run(self, load: Load, index: int) -> SweepPoint:
        ctx, c = self.ctx, self.ctx.cfg
        seed = c.seed + index
        rundir = ctx.folder.run_dir(index)
        source = make_source(c.telemetry, c.targets[0])
        cooldown = None
        if c.cooldown_temp_c is not None:
            ctx.on_event("cooldown", {"index": index})
            cooldown = await cool_down(source, c.cooldown_temp_c, c.cooldown_max_s)
        unflushed: list[str] = []
        flushed = Flushed(False, "", [])
        if c.flush:
            flushed = await flush_all(ctx.adapter, ctx.session, c.targets, c.model)
            if not flushed.ok:
                unflushed.append(flushed.detail)
        workload = Workload(c.wcfg, random.Random(seed))
        driver = driver_for(load, workload)
        payload = ctx.payload
        payload.reset(seed)
        window_end = c.warmup_s + c.duration_s
        await self.build_ahead(workload, load, seed, index, window_end)
        headers = {"Authorization": f"Bearer {c.api_key}"} if c.api_key else None
        ctx.on_event("run", {"index": index, "load": load, "seed": seed})
        with frozen_heap():
            clock = Clock(ctx.time_scale)
            async with TelemetrySampler(source, clock=clock,
                                        path=rundir / "telemetry.jsonl") as tele, \
                    EngineScraper(ctx.adapter, ctx.session, c.targets, clock=clock,
                                  path=rundir / "engine.jsonl") as scraper:
                res: DriveResult = await drive(c.targets, driver, payload,
                                               window_end=window_end, drain_s=c.drain_s,
                                               clock=clock, session=ctx.session,
                                               headers=headers, stop=ctx.stop,
                                               count_text=ctx.count_text)
        took = c.flush and flushed.ok and self.first_found_nothing(res, unflushed)
        win_send, win_loop = res.window_lags(c.warmup_s, window_end)
        send_p99, loop_p99 = p99(win_send), p99(win_loop)
        gpu = tele.summary(c.warmup_s, window_end)
        reasons = invalid_reasons(RunChecks(
            unflushed=unflushed, send_lag_ms_p99=send_p99, loop_lag_ms_p99=loop_p99,
            max_send_lag_ms=c.max_send_lag_ms, max_loop_lag_ms=c.max_loop_lag_ms, gpu=gpu,
            clock_floor_mhz=c.clock_floor_mhz, interrupted=res.interrupted))
        if c.save_records:
            ctx.folder.write_records(index, res.records)
        return summarize_point(
            res.records, load=load, window=(c.warmup_s, window_end), slo=c.slo, seed=seed,
            flushed=took, invalid_reasons=reasons,
            engine=engine_block_from(scraper.samples, c.warmup_s, window_end),
            gpu=gpu,
            client=ClientBlock(
                send_lag_ms_p99=round(send_p99, 3), loop_lag_ms_p99=round(loop_p99, 3),
                send_lag_ms_max=round(max(win_send, default=0.0), 3),
                loop_lag_ms_max=round(max(win_loop, default=0.0), 3),
                run_send_lag_ms_p99=round(p99(res.send_lag_ms), 3),
                bounds_ms=(c.max_send_lag_ms, c.max_loop_lag_ms)),
            time_scale=ctx.time_scale,
            live=self.live_run(index, res, flushed, cooldown, (c.warmup_s, window_end)))

    def first_found_nothing(self, res: DriveResult, unflushed: list[str]) -> bool:
        """The flush took only if the first request each target saw found nothing cached
        (where the engine reports cached tokens at all); each that did is added to
        `unflushed`."""
        reported = {id(o.record) for o in res.outcomes if o.cached_reported}
        took = True
        for url in self.ctx.cfg.targets:
            first = min((r for r in res.records if r.replica == url and r.outcome == "ok"),
                        key=lambda r: r.send_time, default=None)
            if first is not None and id(first) in reported and first.cached_tokens > 0:
                unflushed.append(f"the first request on {url} found "
                                 f"{first.cached_tokens} cached tokens")
                took = False
        return took

    def live_run(self, index: int, res: DriveResult, flushed: Flushed,
                 cooldown: Cooldown | None, window: tuple[float, float]) -> LiveRun:
        """The point's live block: the answers' lengths against those asked for, the flush
        and cool-down, the run's files, its wall time and its prompt texts."""
        ctx, c = self.ctx, self.ctx.cfg
        checked = ctx.adapter.accepts_ignore_eos
        asked = [(o.asked_tokens, o.record.output_tokens) for o in res.outcomes
                 if o.record.outcome == "ok" and o.asked_tokens]
        mismatched = [(a, g) for a, g in asked if a != g]
        return LiveRun(
            run_index=index,
            token_check=TokenCheck(
                checked=len(asked) if checked else 0,
                mismatched=len(mismatched) if checked else 0,
                examples=tuple(mismatched[:5]) if checked else (),
                note=None if checked else
                f"{c.engine} takes no ignore_eos: answer lengths are the engine's own"),
            flush_check=tuple(flushed.checks) or None,
            cooldown=cooldown,
            clock_floor_mhz=c.clock_floor_mhz,
            files=RunFiles(telemetry=f"runs/{index:03d}/telemetry.jsonl",
                           engine=f"runs/{index:03d}/engine.jsonl",
                           records=f"runs/{index:03d}/records.jsonl" if c.save_records
                           else None),
            wall_s=round(res.wall_s, 2),
            prompt_texts=prompt_texts(ctx.payload, window))

    async def build_ahead(self, workload: Workload, load: Load, seed: int, index: int,
                          window_end: float) -> None:
        """Before the run's clock starts, the payload builds the texts the run will send
        (a chat payload: bench/chat_payload.py): the shared system prompts, every open-loop
        session of the window, and each closed-loop user's turns as many as the sweep's
        finished points say it will send (`turns_to_build`; the lookahead's few without one)."""
        ctx, c = self.ctx, self.ctx.cfg
        ahead = TurnsAhead(c.wcfg, seed, load, window_end)
        per_user = turns_to_build(load, window_end, ctx.done)
        if per_user is None and isinstance(load, ClosedLoad):
            per_user = 0  # the lookahead's turns only
        system = ([workload.system_segment(g) for g in range(c.wcfg.prompt_groups)]
                  if c.wcfg.system_prompt_tokens else [])

        def progress(done: int, total: int) -> None:
            ctx.on_event("texts", {"index": index, "done": done, "total": total})

        await ctx.payload.build_ahead(ahead, per_user, system, progress)


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
    """A chat payload's texts of the run just driven (None for one that builds none)."""
    stats = payload.ahead_stats()
    if stats is None:
        return None
    return PromptTexts(built_ahead=stats.built_ahead, ahead_s=round(stats.ahead_s, 3),
                       built_in_run=stats.built_in_run,
                       late=sum(1 for t in stats.late if window[0] <= t < window[1]),
                       run_late=len(stats.late))
