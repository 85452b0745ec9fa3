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

This module is the sweep: its target described, its folder, the payload made once, the runs in
order (`core.sweep.Sweep`) and each point recorded. One run is bench/live_run.py's
`LivePoints`, handed what it needs as a `RunContext`; the sweep's settings are
bench/sweep_config.py's `LiveSweepConfig`.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from chatfleet import __version__
from chatfleet.bench.chat_payload import ChatPayload
from chatfleet.bench.client import make_session
from chatfleet.bench.live_run import Event, LivePoints, RunContext
from chatfleet.bench.payload import IdsPayload, Payload, Shaped
from chatfleet.bench.results import SweepDir
from chatfleet.bench.sweep_config import LiveSweepConfig
from chatfleet.bench.text_pool import TextPool
from chatfleet.core.documents.sweep import SweepDoc, SweepPoint
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.measure.knee import find_knee
from chatfleet.core.sweep import Sweep
from chatfleet.data.tokenizer import load_qwen_tokenizer
from chatfleet.engines import EngineAdapter, get_adapter
from chatfleet.engines.base import HTTP_TIMEOUT_S


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


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
        """The sweep's payload, made at its first run: before any clock (loading a tokenizer
        and starting the text pool's workers take time), and not at all when no run is left."""
        if self._payload is None:
            self._payload = self._make_payload()
        return self._payload

    def _make_payload(self) -> Payload:
        inner: Payload
        if self.cfg.api == "completions-ids":
            inner = IdsPayload(self.cfg.model, self.adapter.accepts_ignore_eos)
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

    def point_runner(self, session: aiohttp.ClientSession) -> LivePoints:
        """The runner of this sweep's runs, handed what a run needs once (`RunContext`)."""
        return LivePoints(RunContext(
            cfg=self.cfg, adapter=self.adapter, session=session, folder=self.dir,
            payload=self.payload(), count_text=self.count_text(),
            time_scale=self.time_scale, stop=self.stop, on_event=self.on_event,
            done=self.points))

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
            if self._payload is not None:
                self._payload.close()  # the prompt text workers

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
            await self._drive(sweep, session)
            if self.doc is None:
                self.doc = self.dir.write_doc(self.target, self.workload_block(), c.slo,
                                              self.points, c.cap_margin)
        return self.doc

    async def _drive(self, sweep: Sweep, session: aiohttp.ClientSession) -> None:
        """`sweep`'s runs in order until it is done or Ctrl-C stops it; refinement starts no
        run after `refine_budget_s` of wall time spent refining."""
        c = self.cfg
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        runner: LivePoints | None = None
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
            runner = runner or self.point_runner(session)
            point = await runner.run(job.load, job.index)
            sweep.record(job, point)
            self._record(point)


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
