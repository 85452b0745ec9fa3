"""Load for the fault and fairness checks, bounded in count and time: closed-loop clients
(`Clients`: each sends its next request as soon as the last one ended, after a short pause
when it was not served) or open-loop arrivals at a fixed rate (`Arrivals`), per gateway, on
an event loop in a thread of their own. Every request's end is recorded with its wall-clock
times (unix seconds, the replicas' traces' clock)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp

MAX_REQUEST_S = 60.0
MAX_OPEN = 400  # open loop: requests outstanding at once, at most (then arrivals are dropped)


@dataclass(frozen=True, slots=True)
class Result:
    gateway: int
    start: float
    end: float
    status: int | None
    outcome: str  # ok, shed (429 + Retry-After), error (a clear one), reset, lost
    detail: str = ""


def body(tokens: int) -> dict[str, Any]:
    return {"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": tokens, "ignore_eos": True, "stream": True}


def classify(status: int, headers: Any, text: str) -> tuple[str, str]:
    if status == 200:
        if 'data: {"error"' in text:
            return "error", "SSE error event"
        return ("ok", "") if text.endswith("data: [DONE]\n\n") else ("lost", "cut short")
    if status == 429:
        return ("shed", "") if "Retry-After" in headers else ("lost", "429 without Retry-After")
    if '"error"' in text:
        return "error", f"HTTP {status}"
    return "lost", f"HTTP {status} without an error body"


class Load:
    def __init__(self, urls: list[str], tokens: int) -> None:
        self.urls = urls
        self.tokens = tokens
        self.results: list[Result] = []
        self.active = [True] * len(urls)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> list[Result]:
        self._stop.set()
        self._thread.join(MAX_REQUEST_S + 30)
        return self.results

    def counts(self, gateway: int | None = None, start: float = 0.0,
               end: float = float("inf")) -> Counter[str]:
        return Counter(r.outcome for r in list(self.results)
                       if (gateway is None or r.gateway == gateway) and start <= r.end <= end)

    async def _one(self, session: aiohttp.ClientSession, i: int) -> str:
        t0 = time.time()
        try:
            async with session.post(self.urls[i] + "/v1/chat/completions",
                                    json=body(self.tokens)) as r:
                text = await r.text()
                outcome, detail = classify(r.status, r.headers, text)
                status: int | None = r.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            outcome, detail, status = "reset", type(exc).__name__, None
        self.results.append(Result(i, t0, time.time(), status, outcome, detail))
        return outcome

    async def _main(self) -> None:
        timeout = aiohttp.ClientTimeout(total=MAX_REQUEST_S)
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
            await self._run(session)

    async def _run(self, session: aiohttp.ClientSession) -> None:
        raise NotImplementedError


class Clients(Load):
    """`workers` closed-loop clients per gateway (or a count for each); after a request that
    was not served a client pauses `pause_s` (not its Retry-After: the point is to keep the
    fleet overloaded)."""

    def __init__(self, urls: list[str], workers: int | list[int], tokens: int = 32,
                 pause_s: float = 0.05) -> None:
        super().__init__(urls, tokens)
        self.workers = workers if isinstance(workers, list) else [workers] * len(urls)
        self.pause_s = pause_s

    async def _run(self, session: aiohttp.ClientSession) -> None:
        async def client(i: int) -> None:
            while not self._stop.is_set() and self.active[i]:
                if await self._one(session, i) != "ok":
                    await asyncio.sleep(self.pause_s)

        await asyncio.gather(*(client(i) for i in range(len(self.urls))
                               for _ in range(self.workers[i])))


class Arrivals(Load):
    """Open loop: requests arrive at each gateway as a Poisson process of `rates[i]` per
    second, whatever happens to the earlier ones."""

    def __init__(self, urls: list[str], rates: list[float], tokens: int = 32,
                 seed: int = 1) -> None:
        super().__init__(urls, tokens)
        self.rates = rates
        self.rng = random.Random(seed)
        self.dropped = 0

    async def _run(self, session: aiohttp.ClientSession) -> None:
        open_: set[asyncio.Task[str]] = set()

        async def arrivals(i: int) -> None:
            while not self._stop.is_set() and self.active[i]:
                await asyncio.sleep(self.rng.expovariate(self.rates[i]))
                if len(open_) >= MAX_OPEN:
                    self.dropped += 1
                    continue
                task = asyncio.create_task(self._one(session, i))
                open_.add(task)
                task.add_done_callback(open_.discard)

        await asyncio.gather(*(arrivals(i) for i in range(len(self.urls))))
        if open_:
            await asyncio.wait(list(open_), timeout=MAX_REQUEST_S)
