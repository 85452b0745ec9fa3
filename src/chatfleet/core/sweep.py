"""One sweep runner for the twin and the live sweep: which load runs next, at which index.

A sweep runs its grid in order, then, with refinement, each mode's knee bracket by the one
policy (`core.refine.next_load`: close an open bracket, then bisect it). Point `index` runs
with seed = base seed + index: the grid's loads take 0..len(grid)-1, refinement runs the
indices after them (and after every run already finished, when a live sweep resumes). A sweep
resumed with another grid gives a new load whose position a finished run holds the next free
index instead: two runs never share an index, hence never a seed or a `runs/NNN` folder.

`Sweep` holds that order and nothing else: a point runner (`PointRunner`: `run(load, index)`
returns the finished `SweepPoint`) does the work. The twin's runner is synchronous and
`Sweep.run` drives it; the live runner is a coroutine, and the live sweep drives `next` /
`record` the same way with `await` in between (bench/sweep.py), adding a wall-time budget for
refinement and Ctrl-C.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from chatfleet.core.documents.sweep import MODES, Load, SweepPoint
from chatfleet.core.refine import DEFAULT_POLICY, RefinePolicy, next_load

JobPhase = Literal["grid", "extend", "bisect"]


@dataclass(frozen=True, slots=True)
class Job:
    """A run to do: its index (seed = base seed + index), its load, and why it runs (a grid
    load, or a refinement phase)."""

    index: int
    load: Load
    phase: JobPhase

    @property
    def refining(self) -> bool:
        return self.phase != "grid"


class PointRunner(Protocol):
    """Runs one load: the finished point, built whole by the runner."""

    def run(self, load: Load, index: int) -> SweepPoint: ...


def _key(load: Load, seed: int) -> tuple[str, float, int]:
    return (load.mode, float(load.value), seed)


class Sweep:
    """The order of a sweep's runs, from the points recorded so far.

    `done` are points a resumed sweep already holds: a grid load whose (mode, load, seed) is
    among them is skipped (`skipped`), and they count for the knee brackets. `refine` turns on
    refinement, bounded by `policy`.
    """

    def __init__(self, loads: Sequence[Load], *, attainment: float, seed: int = 1,
                 refine: bool = False, policy: RefinePolicy = DEFAULT_POLICY,
                 done: Sequence[SweepPoint] = ()) -> None:
        self.grid = list(loads)
        self.attainment = attainment
        self.seed = seed
        self.refine = refine
        self.policy = policy
        self.points: list[SweepPoint] = list(done)
        finished = {_key(p.load, p.seed) for p in done}
        self.skipped: list[Job] = [Job(i, load, "grid") for i, load in enumerate(self.grid)
                                   if _key(load, seed + i) in finished]
        skip = {j.index for j in self.skipped}
        used = {p.run_index for p in done if p.run_index is not None}
        self._next_index = max(len(self.grid), max(used, default=-1) + 1)
        # a grid load keeps its position as its index unless a finished run of another load
        # holds it (a sweep resumed with another grid): then it takes the next free index, so
        # no run's files or seed are another's
        self._grid_jobs: list[Job] = []
        for i, load in enumerate(self.grid):
            if i in skip:
                continue
            if i in used:
                i, self._next_index = self._next_index, self._next_index + 1
            self._grid_jobs.append(Job(i, load, "grid"))
        self._modes = [m for m in reversed(MODES)  # closed loop first, then open
                       if any(load.mode == m for load in self.grid)]
        self._runs = {"extend": 0, "bisect": 0}

    def next(self) -> Job | None:
        """The next run, or None when the sweep is done."""
        if self._grid_jobs:
            return self._grid_jobs[0]
        if not self.refine:
            return None
        while self._modes:
            mode = self._modes[0]
            template = next(load for load in self.grid if load.mode == mode)
            nxt = next_load(self.points, template, self.attainment,
                            extended=self._runs["extend"], bisected=self._runs["bisect"],
                            policy=self.policy)
            if nxt is not None:
                return Job(self._next_index, nxt.load, nxt.phase)
            self._modes.pop(0)
            self._runs = {"extend": 0, "bisect": 0}
        return None

    def record(self, job: Job, point: SweepPoint) -> None:
        """`job`'s point, finished: the next `next` takes it into account."""
        self.points.append(point)
        if job.refining:
            self._runs[job.phase] += 1
            self._next_index = job.index + 1
        else:
            self._grid_jobs.remove(job)

    def run(self, runner: PointRunner,
            on_point: Callable[[SweepPoint], None] | None = None) -> list[SweepPoint]:
        """Every run, in order, through a synchronous runner; `on_point` after each."""
        while (job := self.next()) is not None:
            point = runner.run(job.load, job.index)
            self.record(job, point)
            if on_point is not None:
                on_point(point)
        return self.points
