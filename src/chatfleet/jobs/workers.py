"""A job's worker processes: `WorkerPool` runs a batch of tasks at once, one spawned process
per core, and gives their results in the batch's order, with every tick a task reports passed
on to the caller's progress as it happens.

A task is any picklable object with `run(tick) -> result` (it calls `tick()` as it goes). Each
must be its own computation (its own seeded simulation, no state shared with the others), so
that a batch gives in workers what it gives one task after another in this process, which is
what the pool does with fewer than two workers (one core) or a batch of one task.

The pool is started once for the whole job (`with WorkerPool(n) as pool`), so the workers'
imports overlap with whatever the job does first, and reused for every batch. Workers are
spawned, not forked (the command line's progress bar runs a thread that a fork would copy
mid-flight). Each worker talks to the job over its own pipe, so the job hands the next task to
whichever worker is free: a batch given longest first (`key`) keeps the last task short. On an
error, a Ctrl-C or a worker that dies, the job stops every worker before the error goes on:
no process outlives the job. A worker ignores SIGINT (a terminal's Ctrl-C reaches the whole
process group: the job alone answers it) and exits on its own when the job is gone.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
Tick = Callable[[], None]

PARENT_CHECK_S = 1.0
STOP_TIMEOUT_S = 5.0


class Task(Protocol[T_co]):
    def run(self, tick: Tick) -> T_co: ...


class Feed(Protocol[T]):
    """Tasks that depend on earlier results (a search): `next_task` gives one to run now, or
    None while none can start until a result is in; `take` hands a result back; `finished`
    says when nothing more will come."""

    def next_task(self) -> Task[T] | None: ...

    def take(self, task: Task[T], result: T) -> None: ...

    def finished(self) -> bool: ...


class WorkerError(RuntimeError):
    """A worker process died (killed, out of memory) or could not start: the job stopped."""


def _no_tick() -> None:
    pass


def _exit_with(parent: int) -> None:
    """Exit when the job that started this worker is gone (killed by SIGKILL, it closes
    nothing): a worker in the middle of an hour-long run would otherwise finish it first."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _sendable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling both ways, else a RuntimeError that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # any exception that does not pickle
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


def _serve(conn: Connection, parent: int, preload: tuple[str, ...]) -> None:
    """A worker: import `preload`, then run each task the job sends, until the job stops it
    (SIGTERM) or is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent,), daemon=True, name="job-watch").start()

    def tick() -> None:
        conn.send(("tick",))

    try:
        for name in preload:
            importlib.import_module(name)
        while True:
            task = conn.recv()
            try:
                result = task.run(tick)
            except Exception as exc:  # every task error goes to the job
                conn.send(("error", _sendable(exc), traceback.format_exc()))
            else:
                conn.send(("done", result))
    except (EOFError, BrokenPipeError):
        pass  # the job is gone
    except Exception as exc:  # a preload that fails
        conn.send(("error", _sendable(exc), traceback.format_exc()))


def default_workers(num_tasks: int) -> int:
    """One worker per core, up to one per task."""
    return max(1, min(num_tasks, os.cpu_count() or 1))


class WorkerPool:
    """`workers` spawned processes, started on entry and stopped on exit, whether the job ends
    well or not. With fewer than two, no process starts and every batch runs in this
    process."""

    def __init__(self, workers: int, *, preload: Iterable[str] = ()) -> None:
        self.workers = workers
        self.preload = tuple(preload)
        self._procs: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._broken = False

    @property
    def parallel(self) -> bool:
        return self.workers >= 2

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def __enter__(self) -> WorkerPool:
        if not self.parallel:
            return self
        ctx = multiprocessing.get_context("spawn")
        try:
            for i in range(self.workers):
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(theirs, os.getpid(), self.preload),
                                   name=f"chatfleet-worker-{i}", daemon=True)
                try:
                    proc.start()
                finally:
                    theirs.close()
                self._conns.append(mine)
                self._procs.append(proc)
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self._stop()

    def run(self, tasks: Sequence[Task[T]], tick: Tick | None = None,
            key: Callable[[Any], Any] | None = None) -> list[T]:
        """Each task's result, in the order given. The tasks start in descending `key` (the
        longest likely first), each on the next free worker; `tick` runs here, in this thread,
        for every tick of every task."""
        tick = tick or _no_tick
        if not self.parallel or len(tasks) < 2:
            return [t.run(tick) for t in tasks]
        if self._broken or not self._procs:
            raise WorkerError("the worker pool is stopped (an earlier batch failed)")
        self._broken = True  # until the batch ends well: a failed batch leaves workers busy
        order = deque(sorted(range(len(tasks)), key=lambda i: key(tasks[i]), reverse=True)
                      if key is not None else range(len(tasks)))
        results: dict[int, T] = {}
        busy: dict[int, int] = {}  # worker -> the task it runs

        def hand_out(worker: int) -> None:
            if order:
                busy[worker] = order.popleft()
                self._conns[worker].send(tasks[busy[worker]])

        def done(worker: int, result: Any) -> None:
            results[busy.pop(worker)] = result
            hand_out(worker)

        for w in range(len(self._procs)):
            hand_out(w)
        while len(results) < len(tasks):
            self._receive(tick, done)
        self._broken = False
        return [results[i] for i in range(len(tasks))]

    def feed(self, feed: Feed[T], tick: Tick | None = None) -> None:
        """Run a feed's tasks until it is finished, each on the next free worker as soon as
        the feed has it (with one worker, one after another here)."""
        tick = tick or _no_tick
        if not self.parallel:
            while not feed.finished():
                task = feed.next_task()
                if task is None:
                    raise RuntimeError("the feed has no task to run and is not finished")
                feed.take(task, task.run(tick))
            return
        if self._broken or not self._procs:
            raise WorkerError("the worker pool is stopped (an earlier batch failed)")
        self._broken = True
        busy: dict[int, Task[T]] = {}

        def done(worker: int, result: Any) -> None:
            feed.take(busy.pop(worker), result)

        while True:
            for w in range(len(self._procs)):
                if w not in busy:
                    task = feed.next_task()
                    if task is None:
                        break
                    busy[w] = task
                    self._conns[w].send(task)
            if not busy:
                if feed.finished():
                    break
                raise RuntimeError("the feed has no task to run and is not finished")
            self._receive(tick, done)
        self._broken = False

    def _receive(self, tick: Tick, done: Callable[[int, Any], None]) -> None:
        """Wait for the workers, then take what they sent: ticks (`tick`), finished tasks
        (`done(worker, result)`) and raised exceptions (raised here, with the worker's
        traceback as a note); a worker that is gone raises WorkerError."""
        sentinels = {p.sentinel: w for w, p in enumerate(self._procs)}
        ready = wait([*self._conns, *sentinels])
        for w, conn in enumerate(self._conns):
            while conn in ready and conn.poll():
                try:
                    msg = conn.recv()
                except (EOFError, OSError):  # the worker's end closed: it is gone
                    raise self._died(w) from None
                if msg[0] == "tick":
                    tick()
                elif msg[0] == "done":
                    done(w, msg[1])
                else:
                    exc: BaseException = msg[1]
                    exc.add_note(f"in worker process {self._procs[w].pid}:\n{msg[2]}")
                    raise exc
        for sentinel, w in sentinels.items():
            if sentinel in ready and not self._conns[w].poll():
                raise self._died(w)

    def _died(self, worker: int) -> WorkerError:
        proc = self._procs[worker]
        proc.join(STOP_TIMEOUT_S)
        return WorkerError(f"a worker process died ({exit_status(proc.exitcode)}): out of "
                           "memory, or killed; the job stopped")

    def _stop(self) -> None:
        """Terminate every worker and wait for it. Between batches a worker holds nothing
        (every result is in), and SIGTERM ends it at once, where a Python exit with the twin
        loaded takes 0.13 s of the job's end; during a batch it is the one way to stop it."""
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            proc.join(STOP_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []


def exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"
