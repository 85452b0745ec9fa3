"""The engine's Prometheus /metrics, scraped every second during a run.

`async with EngineScraper(adapter, session, urls, clock=clock) as s:` reads every target's
/metrics once per interval in the background, each read bounded by a timeout; a read that fails
is counted, never raised. Each record is

    {"t": model time, "url", "running", "queue", "token_usage", "cache_hit_rate",
     "prefix_cache_queries", "prefix_cache_hits", "prompt_tokens", "generation_tokens",
     "preemptions", "pool_tokens"}

with the figures read through the engine adapter's metric names (None where the engine does not
publish one). SGLang and the simserver publish a hit-rate gauge; for vLLM the rate is the delta
of prefix_cache_hits over the delta of prefix_cache_queries since the previous scrape of that
target (None when nothing was queried in between).

Scraped gauges lag (SGLang refreshes its own every 40 decode steps) and a 1 s scrape misses
short peaks: `summary` reports what was seen, and the sweep says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import aiohttp
import orjson

from chatfleet.bench.client import Clock
from chatfleet.core.documents.sweep import EngineBlock
from chatfleet.core.errors import ChatfleetError
from chatfleet.engines import EngineAdapter, get_adapter
from chatfleet.engines.prom import (
    Metrics,
    Sample,
    fetch_metrics,
    parse_prometheus,
)

__all__ = [
    "EngineScraper",
    "Metrics",
    "MetricsScraper",
    "Sample",
    "engine_block_from",
    "fetch_metrics",
    "parse_prometheus",
]


class EngineScraper:
    def __init__(self, adapter: EngineAdapter | str,
                 session: aiohttp.ClientSession | None, targets: str | Sequence[str], *,
                 interval_s: float = 1.0, clock: Clock | None = None,
                 path: str | Path | None = None, timeout_s: float = 5.0,
                 max_records: int = 500_000) -> None:
        if interval_s <= 0:
            raise ChatfleetError("the scrape interval must be positive")
        self.adapter = get_adapter(adapter) if isinstance(adapter, str) else adapter
        self.urls = [targets] if isinstance(targets, str) else list(targets)
        if not self.urls:
            raise ValueError("no target to scrape")
        self.interval_s = interval_s
        self.clock = clock or Clock()
        self.path = Path(path) if path is not None else None
        self.timeout_s = min(timeout_s, max(interval_s * 5, 1.0))
        self.max_records = max_records
        self.records: list[dict[str, Any]] = []
        self.failures = 0
        self.dropped = 0
        self.last_error: str | None = None
        self._session = session
        self._own_session = session is None
        self._prev: dict[str, dict[str, Any]] = {}
        # only what read_metrics reads: parsing a whole page (hundreds of histogram lines on
        # vLLM) each second would stall the event loop that times every token
        self._names = self.adapter.scraped_metric_names()
        self._task: asyncio.Task[None] | None = None
        self._file: IO[bytes] | None = None

    @property
    def samples(self) -> list[dict[str, Any]]:
        return self.records

    async def __aenter__(self) -> EngineScraper:
        if self._session is None:
            self._session = aiohttp.ClientSession()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "ab")  # noqa: SIM115 (closed in __aexit__)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="scrape")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def _run(self) -> None:
        if not getattr(self.adapter, "has_metrics", True):
            return  # the engine serves no /metrics: nothing to scrape
        next_at = time.monotonic()
        while True:
            await self.scrape_once()
            next_at += self.interval_s
            now = time.monotonic()
            if next_at < now:
                next_at = now
            await asyncio.sleep(next_at - now)

    async def scrape_once(self) -> list[dict[str, Any]]:
        """Scrape every target once (concurrently); the records of the reads that worked."""
        got = await asyncio.gather(*(self._scrape(url) for url in self.urls))
        rows = [r for r in got if r is not None]
        if self._file is not None and rows:
            self._file.write(b"".join(orjson.dumps(r) + b"\n" for r in rows))
            self._file.flush()
        return rows

    async def _scrape(self, url: str) -> dict[str, Any] | None:
        assert self._session is not None
        try:
            m = await fetch_metrics(self._session, url, self.timeout_s, self._names)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # counted, never fatal
            self.failures += 1
            self.last_error = f"{url}: {exc}"[:300]
            return None
        row = record_from(self.adapter, m, self._prev.get(url))
        row = {"t": round(self.clock.now(), 6), "url": url, **row}
        self._prev[url] = row
        if len(self.records) < self.max_records:
            self.records.append(row)
        else:
            self.dropped += 1
        return row

    def summary(self, start: float | None = None, end: float | None = None) -> EngineBlock:
        return replace(engine_block_from(self.records, start, end), failures=self.failures,
                       last_error=self.last_error)


MetricsScraper = EngineScraper


def record_from(adapter: EngineAdapter, m: Metrics,
                prev: Mapping[str, Any] | None) -> dict[str, Any]:
    """One scrape's figures; the hit rate from counter deltas where there is no gauge."""
    row: dict[str, Any] = dict(adapter.read_metrics(m))
    if row.get("cache_hit_rate") is None and prev is not None:
        q0, h0 = prev.get("prefix_cache_queries"), prev.get("prefix_cache_hits")
        q1, h1 = row.get("prefix_cache_queries"), row.get("prefix_cache_hits")
        if (q0 is not None and h0 is not None and q1 is not None and h1 is not None
                and q1 > q0 and h1 >= h0):
            row["cache_hit_rate"] = round((h1 - h0) / (q1 - q0), 6)
    return row


def engine_block_from(records: Sequence[Mapping[str, Any]], start: float | None = None,
                      end: float | None = None) -> EngineBlock:
    """The contract's engine block from scraped records with start <= t <= end: the largest
    running batch, the longest queue and the highest token usage seen at a scrape (over all
    targets). None where no scrape holds the figure."""
    sel = [r for r in records
           if (start is None or r["t"] >= start) and (end is None or r["t"] <= end)]

    def top(key: str) -> float | None:
        vals = [float(r[key]) for r in sel if r.get(key) is not None]
        return max(vals) if vals else None

    running, queue, usage = top("running"), top("queue"), top("token_usage")
    return EngineBlock(max_running=int(running) if running is not None else None,
                       max_queue=int(queue) if queue is not None else None,
                       peak_token_usage=usage, scrapes=len(sel), source="metrics")
