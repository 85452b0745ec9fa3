"""The search for the fewest replicas that serve a trace (`ReplicaSearch`): pure, driven by
the results of segment replays it asks for.

A fleet of R replicas *meets* the trace when, in every segment (an hour of it), nothing is
shed and the share of the counted turns that meet the latency target is at least the target
attainment: the P99 user in every hour, not over the day (a day's quiet hours would
otherwise hide a busy hour's misses). More replicas never serve a segment worse, so the
fewest is found by search:

1. judge R on the critical segments (at first the busiest two: `critical`), each on the
   groups of replicas with the most work in it (`groups`, core/traffic/groups.py), each
   replay stopping at the first turn that fails it;
2. from the first guess, double R until a fleet meets them (or halve it until one fails),
   then bisect between the largest that failed and the smallest that met;
3. verify the answer on every segment with every group: if a segment fails there, it joins
   the critical ones (one already critical: one more group is judged in each) and the search
   goes on upward from there (steps of 1, 2, 4, ... replicas, then bisection).

So most replays are of the busiest groups in the busiest hours, and a fleet too small costs
the minutes until it fails; the whole trace is replayed at the answer (its figures are the
answer's figures).
Without `verify` the answer is judged on the critical segments only (the error band's edges,
a precision that is not recommended: the answer says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from chatfleet.core.traffic.tally import SegmentResult

Task = tuple[int, int, int | None]  # (replicas, segment, groups judged; None: all of them)


@dataclass(slots=True)
class ReplicaSearch:
    start: int  # the first guess
    order: Sequence[int]  # the segments, busiest first
    max_replicas: int
    critical: int = 2
    groups: int = 2  # the groups with the most work in a segment that a judgement replays
    verify: bool = True
    results: dict[Task, SegmentResult] = field(default_factory=dict)
    requested: set[Task] = field(default_factory=set)
    crit: list[int] = field(init=False)
    lo: int = 0  # the most replicas known to fail (0: none yet)
    hi: int | None = None  # the fewest known to meet the critical segments
    current: int | None = field(init=False)
    verifying: bool = False
    answer: int | None = None
    why_none: str | None = None
    done: bool = False
    gallop: int = 0  # after a failed verification: the next step up (1, 2, 4, ...)
    judged: list[tuple[int, bool]] = field(default_factory=list)  # (replicas, met) in order

    def __post_init__(self) -> None:
        if not self.order:
            raise ValueError("a search needs at least one segment")
        self.crit = list(self.order[: max(1, self.critical)])
        self.current = max(1, min(self.start, self.max_replicas))

    # --- what to run ----------------------------------------------------------------------
    def wanted(self) -> list[Task]:
        """The replays the search needs now and has not asked for yet (it asks once)."""
        if self.done or self.current is None:
            return []
        out = [t for t in self._tasks(self.current)
               if t not in self.results and t not in self.requested]
        self.requested.update(out)
        return out

    def _tasks(self, r: int) -> list[Task]:
        if self.verifying:
            return [(r, s, None) for s in self.order]
        return [(r, s, self.groups) for s in self.crit]

    def give(self, task: Task, result: SegmentResult) -> None:
        """A replay's result (any the search asked for, in any order)."""
        self.results[task] = result
        self.requested.discard(task)
        self._advance()

    # --- the rules ------------------------------------------------------------------------
    def _advance(self) -> None:
        while not self.done and self.current is not None:
            r = self.current
            got = [self.results.get(t) for t in self._tasks(r)]
            if self.verifying:
                failed = [s for s, res in zip(self.order, got, strict=True)
                          if res is not None and not res.passed]
                if failed:
                    if any(s in self.crit for s in failed):
                        self.groups += 1  # the busiest groups were not the ones that failed
                    self.crit.extend(s for s in failed if s not in self.crit)
                    self.verifying = False
                    self.lo, self.hi, self.gallop = r, None, 1  # then steps of 2, 4, ...
                    self._next(r + 1)
                    continue
                if all(res is not None for res in got):
                    self.answer, self.done = r, True
                return
            if any(res is not None and not res.passed for res in got):
                self._failed(r)
            elif all(res is not None for res in got):
                self._met(r)
            else:
                return

    def _failed(self, r: int) -> None:
        self.judged.append((r, False))
        self.lo = max(self.lo, r)
        if self.hi is not None:
            self._bisect()
            return
        if r >= self.max_replicas:
            self.done = True
            worst = self.failure(r)
            self.why_none = (f"no fleet of up to {self.max_replicas} replicas meets the target"
                             + (f": {worst}" if worst else ""))
            return
        if self.gallop:
            self.gallop *= 2
            self._next(min(self.max_replicas, r + self.gallop))
        else:
            self._next(min(self.max_replicas, 2 * r))

    def _met(self, r: int) -> None:
        self.judged.append((r, True))
        self.hi = r if self.hi is None else min(self.hi, r)
        if self.lo == 0 and r > 1:
            self._next(r // 2)  # halving until a fleet fails
            return
        self._bisect()

    def _bisect(self) -> None:
        assert self.hi is not None
        if self.hi - self.lo <= 1:
            self._verify()
            return
        self._next((self.lo + self.hi) // 2)

    def _verify(self) -> None:
        assert self.hi is not None
        self.current = self.hi
        if not self.verify:
            self.answer, self.done = self.hi, True
            return
        self.verifying = True

    def _next(self, r: int) -> None:
        """Judge `r` next (at once, where its results are in from before)."""
        self.current = r

    def failure(self, r: int) -> str | None:
        """Why R replicas failed (the first failed segment's reason)."""
        for task, res in self.results.items():
            if task[0] == r and not res.passed:
                return f"segment {task[1]}: {res.why}"
        return None

    def at_answer(self) -> list[SegmentResult]:
        """Every segment's result at the answer with every group (once verified), else the
        critical segments' judged groups."""
        if self.answer is None:
            return []
        full = [self.results.get((self.answer, s, None)) for s in self.order]
        if all(res is not None for res in full):
            return [res for res in full if res is not None]
        return [res for t, res in self.results.items()
                if t[0] == self.answer and t[2] == self.groups]
