"""Exact-token texts built in worker processes, off the harness's event loop.

A prompt's text of exactly n Qwen3 tokens (`data.exact_tokens.text_of_exact_tokens`: seeded
filler words, then the tokenizer's count check) takes milliseconds to build: about 1 ms for 256
tokens and 5-10 ms for 1,024-2,048 on this machine. Built on the event loop, that time is loop
lag for every stream the harness reads, and it arrives with every request. A `TextPool` builds
the texts in `workers` spawned processes, each with the tokenizer loaded once, so the loop only
awaits a future and unpickles a string. The text is the same function of (n, seed) as inline,
checked the same way: same seed, same bytes. A chat sweep builds a run's texts before its
clock starts (bench/payload.py), so the workers are busy while nothing is being timed.

Spawned, not forked: the harness runs threads (NVML reads, aiohttp's resolver) that a fork would
copy mid-flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import os
import threading
import time
from concurrent.futures.process import BrokenProcessPool

from chatfleet.data.exact_tokens import text_of_exact_tokens
from chatfleet.data.tokenizer import load_qwen_tokenizer

DEFAULT_WORKERS = 2
START_TIMEOUT_S = 120.0

_tok = None  # the worker's tokenizer, loaded by _init


PARENT_CHECK_S = 1.0


def _exit_with(parent: int) -> None:
    """Exit when the process that started this worker is gone. A worker holds both ends of
    its call queue's pipe, so a parent killed by SIGKILL never shows it an end of file: it
    would wait, with its tokenizer loaded, until the machine restarts."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _init(directory: str | None, parent: int) -> None:
    global _tok
    threading.Thread(target=_exit_with, args=(parent,), daemon=True,
                     name="parent-watch").start()
    _tok = load_qwen_tokenizer(directory)
    _tok.filler_words  # noqa: B018 (built once per worker, before the first text)


def _build(n: int, seed: int) -> str:
    assert _tok is not None, "the pool's initializer did not run"
    return text_of_exact_tokens(_tok, n, seed=seed)


def _pid() -> int:
    return os.getpid()


class TextPoolError(RuntimeError):
    """A worker died or could not start."""


class TextPool:
    """`workers` processes that build exact-token texts. `start()` blocks until every worker
    has loaded the tokenizer (call it before a run's clock starts); `text(n, seed)` awaits one
    text; `close()` stops the workers."""

    def __init__(self, tokenizer_dir: str | os.PathLike[str] | None = None,
                 workers: int = DEFAULT_WORKERS) -> None:
        if workers < 1:
            raise ValueError(f"a text pool needs at least one worker, not {workers}")
        self.tokenizer_dir = None if tokenizer_dir is None else os.fspath(tokenizer_dir)
        self.workers = workers
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None

    @property
    def started(self) -> bool:
        return self._executor is not None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        if self._executor is not None:
            return
        ex = concurrent.futures.ProcessPoolExecutor(
            max_workers=self.workers, mp_context=multiprocessing.get_context("spawn"),
            initializer=_init, initargs=(self.tokenizer_dir, os.getpid()))
        # one call per worker at once: the executor spawns a process for each call that finds
        # no idle worker, and each runs the initializer before it answers
        calls = [ex.submit(_build, 1, 0) for _ in range(self.workers)]
        try:
            for c in calls:
                c.result(timeout=timeout_s)
        except (BrokenProcessPool, concurrent.futures.TimeoutError, OSError) as exc:
            ex.shutdown(wait=False, cancel_futures=True)
            raise TextPoolError(f"the prompt text workers did not start: {exc!r}") from exc
        self._executor = ex

    def worker_pids(self) -> set[int]:
        """The workers' process ids (a check that the texts are built elsewhere)."""
        if self._executor is None:
            return set()
        return {self._executor.submit(_pid).result(timeout=30) for _ in range(self.workers * 4)}

    async def text(self, n: int, seed: int) -> str:
        """Text of exactly n tokens for `seed`, built in a worker (ValueError as inline)."""
        if self._executor is None:
            self.start()
        assert self._executor is not None
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, _build, n, seed)
        except BrokenProcessPool as exc:
            raise TextPoolError(f"a prompt text worker died: {exc}") from exc

    def close(self) -> None:
        if self._executor is not None:
            ex, self._executor = self._executor, None
            ex.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> TextPool:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
