"""core.sweep: the one sweep runner of the twin and the live sweep (which load runs next, at
which index), driven here by a synthetic point runner."""

from __future__ import annotations

from dataclasses import dataclass, field

from chatfleet.core.documents.sweep import (
    ClosedLoad,
    LiveRun,
    Load,
    OpenLoad,
    SweepPoint,
)
from chatfleet.core.refine import RefinePolicy
from chatfleet.core.sweep import Job, PointRunner, Sweep


@dataclass
class Synthetic:
    """Meets the target up to `users` users (or `rate` rps); records what it was asked."""

    users: int = 45
    rate: float = 1.3
    seed: int = 1
    asked: list[tuple[float, int]] = field(default_factory=list)

    def run(self, load: Load, index: int) -> SweepPoint:
        self.asked.append((load.value, index))
        limit = self.users if load.mode == "closed" else self.rate
        return SweepPoint(load=load, seed=self.seed + index, valid=True,
                          attainment=1.0 if load.value <= limit else 0.0,
                          live=LiveRun(run_index=index))


def test_the_grid_runs_in_order_with_seed_base_plus_index() -> None:
    runner: PointRunner = Synthetic()
    points = Sweep([ClosedLoad(1), ClosedLoad(8), OpenLoad(0.5)], attainment=0.99).run(runner)
    assert [(p.load.value, p.seed) for p in points] == [(1, 1), (8, 2), (0.5, 3)]


def test_refinement_follows_the_grid_closed_loop_first_then_open() -> None:
    runner = Synthetic()
    grid: list[Load] = [OpenLoad(8.0, "poisson"), ClosedLoad(1), ClosedLoad(16)]
    seen: list[SweepPoint] = []
    points = Sweep(grid, attainment=0.99, refine=True).run(runner, seen.append)
    assert seen == points
    modes = [p.load.mode for p in points]
    first_open = modes.index("open", 1)  # the grid's open load is point 0
    assert set(modes[3:first_open]) == {"closed"} and set(modes[first_open:]) == {"open"}
    closed = [p.load.value for p in points if p.load.mode == "closed"]
    assert closed[:4] == [1, 16, 32, 64]  # the open bracket closed, then bisected
    assert {45, 46} <= set(closed)
    # refinement takes the indices after the grid, one each, in the order run
    assert [i for _, i in runner.asked] == list(range(len(points)))
    assert all(isinstance(p.load, OpenLoad) and p.load.arrival == "poisson"
               for p in points if p.load.mode == "open")


def test_without_refine_only_the_grid_runs() -> None:
    points = Sweep([ClosedLoad(1), ClosedLoad(64)], attainment=0.99).run(Synthetic())
    assert [p.load.value for p in points] == [1, 64]


def test_a_resumed_sweep_skips_finished_runs_and_numbers_after_them() -> None:
    grid: list[Load] = [ClosedLoad(1), ClosedLoad(2), ClosedLoad(4)]
    first = Synthetic()
    done = [first.run(grid[0], 0), first.run(grid[2], 2)]
    sweep = Sweep(grid, attainment=0.99, seed=1, refine=True,
                  policy=RefinePolicy(extend_max_runs=1), done=done)
    assert sweep.skipped == [Job(0, grid[0], "grid"), Job(2, grid[2], "grid")]
    runner = Synthetic()
    points = sweep.run(runner)
    assert runner.asked[0] == (2, 1)  # the one grid load left, at its own index
    assert runner.asked[1] == (8, 3)  # refinement after every index already used
    assert points[:2] == done and len(points) == 4


def test_a_finished_run_of_another_seed_is_not_skipped() -> None:
    stale = Synthetic(seed=100).run(ClosedLoad(1), 0)
    sweep = Sweep([ClosedLoad(1)], attainment=0.99, seed=1, done=[stale])
    # its index is the stale run's: the new run takes the next one (its own seed and files)
    assert sweep.skipped == [] and sweep.next() == Job(1, ClosedLoad(1), "grid")


def test_a_sweep_resumed_with_another_grid_numbers_its_loads_after_the_finished_runs() -> None:
    # the device script's way: 1, 4 and 16 users, then a later call adds 32 and 64 (--resume)
    first = Synthetic()
    done = Sweep([ClosedLoad(1), ClosedLoad(4), ClosedLoad(16)], attainment=0.99).run(first)
    sweep = Sweep([ClosedLoad(32), ClosedLoad(64)], attainment=0.99, seed=1, done=done)
    assert sweep.skipped == []
    runner = Synthetic()
    points = sweep.run(runner)
    assert runner.asked == [(32, 3), (64, 4)]
    indices = [p.live.run_index for p in points if p.live is not None]
    seeds = [p.seed for p in points]
    assert indices == [0, 1, 2, 3, 4] and seeds == [1, 2, 3, 4, 5]


def test_resuming_with_a_grid_that_keeps_the_finished_loads_in_place_skips_them() -> None:
    grid: list[Load] = [ClosedLoad(1), ClosedLoad(4), ClosedLoad(16)]
    done = Sweep(grid[:2], attainment=0.99).run(Synthetic())
    sweep = Sweep(grid, attainment=0.99, seed=1, done=done)
    assert [j.index for j in sweep.skipped] == [0, 1]
    assert sweep.next() == Job(2, ClosedLoad(16), "grid")
