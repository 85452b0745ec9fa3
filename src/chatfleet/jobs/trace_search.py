"""The replays a trace plan runs, fed to the worker pool as the searches ask for them
(`TracePlanner`, a jobs.workers.Feed).

The plan's stages are a generator (`stages`) that adds searches (core/traffic/search.py:
the fewest replicas of one engine for one version of the trace) and single replays (a fleet
of a given size on one segment, counted in full: what a fleet does with traffic it cannot
serve, a card's clocks), then yields; the planner resumes it once everything it added is in.
Within a stage every search runs at once: their segment replays go to the next free worker.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.measure.percentiles import percentiles
from chatfleet.core.slo import SLO
from chatfleet.core.traffic.columns import Segment, busiest_first
from chatfleet.core.traffic.search import ReplicaSearch
from chatfleet.core.traffic.tally import SegmentResult
from chatfleet.jobs.plan_tasks import ReplayTask
from chatfleet.jobs.workers import Task
from chatfleet.twin.fleet import MEASURED_HOP_S, FleetConfig
from chatfleet.twin.trace_fleet import SegmentReplay

Progress = Callable[[str, int, int], None]
REPLAYS = "trace replays (segments of the trace on a fleet)"


@dataclass(frozen=True, slots=True)
class Engine:
    """What a replay runs: the engine, the gateway cap per replica and the prefill reserve
    (the gateway's config at each fleet size: a queue of one cap per replica)."""

    spec: EngineSpec
    cap: int
    prefill_reserve_s: float

    def fleet(self, replicas: int, ttft_budget_s: float) -> FleetConfig:
        return FleetConfig(replicas=replicas, cap=self.cap, queue_depth=self.cap * replicas,
                           ttft_budget_s=ttft_budget_s, hop_s=MEASURED_HOP_S,
                           prefill_reserve_s=min(self.prefill_reserve_s, ttft_budget_s))


@dataclass(slots=True)
class Search:
    name: str
    engine: Engine
    segments: Sequence[Segment]
    search: ReplicaSearch


@dataclass(slots=True)
class Single:
    """One replay counted in full (no search)."""

    name: str
    engine: Engine
    replicas: int
    segment: Segment
    gpu: bool = False
    result: SegmentResult | None = None


@dataclass(slots=True)
class TracePlanner:
    shared_prefix_tokens: int
    slo: SLO
    progress: Progress | None = None
    searches: dict[str, Search] = field(default_factory=dict)
    singles: dict[str, Single] = field(default_factory=dict)
    queue: deque[ReplayTask] = field(default_factory=deque)
    asked: int = 0
    answered: int = 0
    stages: Iterator[None] | None = None
    _started: set[str] = field(default_factory=set)

    # --- adding work ------------------------------------------------------------------------
    def search(self, name: str, engine: Engine, segments: Sequence[Segment], start: int,
               max_replicas: int, verify: bool = True) -> Search:
        s = Search(name, engine, segments,
                   ReplicaSearch(start=start, order=busiest_first(segments),
                                 max_replicas=max_replicas, verify=verify))
        self.searches[name] = s
        return s

    def single(self, name: str, engine: Engine, replicas: int, segment: Segment,
               gpu: bool = False, groups: int | None = None) -> Single:
        """One replay counted in full: every group of the fleet, or the busiest `groups`."""
        s = Single(name, engine, replicas, segment, gpu)
        self.singles[name] = s
        self._ask(ReplayTask(self._replay(engine, replicas, segment, groups, judge=False,
                                          gpu=gpu), (name, replicas, segment.index, groups)))
        return s

    def _replay(self, engine: Engine, replicas: int, segment: Segment, groups: int | None,
                judge: bool, gpu: bool = False) -> SegmentReplay:
        return SegmentReplay(engine.spec, engine.fleet(replicas, self.slo.ttft_ms / 1000.0),
                             segment, self.shared_prefix_tokens, self.slo, judge=judge, gpu=gpu,
                             top_groups=groups)

    def _ask(self, task: ReplayTask) -> None:
        self.queue.append(task)
        self.asked += 1
        self._tick()

    def _tick(self) -> None:
        if self.progress is not None:
            self.progress(REPLAYS, self.answered, max(self.asked, 1))

    # --- the feed ---------------------------------------------------------------------------
    def next_task(self) -> Task[SegmentResult] | None:
        self._fill()
        return self.queue.popleft() if self.queue else None

    def _fill(self) -> None:
        """Ask for what the searches want now; when all is in, run the next stage."""
        while True:
            for s in self.searches.values():
                for replicas, seg, groups in s.search.wanted():
                    self._ask(ReplayTask(self._replay(s.engine, replicas, s.segments[seg],
                                                      groups, judge=True),
                                         (s.name, replicas, seg, groups)))
            if self.queue or not self._idle() or self.stages is None:
                return
            try:
                next(self.stages)
            except StopIteration:
                self.stages = None

    def _idle(self) -> bool:
        """Nothing asked for is still out, and every search is done."""
        return (self.answered == self.asked and all(s.search.done
                                                    for s in self.searches.values()))

    def take(self, task: Task[SegmentResult], result: SegmentResult) -> None:
        assert isinstance(task, ReplayTask)
        name, replicas, seg, groups = task.key
        self.answered += 1
        self._tick()
        if name in self.singles and name not in self.searches:
            self.singles[name].result = result
        else:
            self.searches[name].search.give((replicas, seg, groups), result)

    def finished(self) -> bool:
        self._fill()
        return not self.queue and self._idle() and self.stages is None


def level(results: list[SegmentResult], segments: int, search: Search | None,
          scale: float, replicas: int | None, why_none: str | None = None) -> dict[str, Any]:
    """One traffic level's figures at its fleet (every segment's result summed)."""
    out: dict[str, Any] = {"time_scale": scale, "replicas": replicas, "why_none": why_none,
                           "verified": len(results) == segments,
                           "search": [] if search is None else
                           [[r, met] for r, met in search.search.judged]}
    if not results:
        return out
    offered = sum(r.offered for r in results)
    met = sum(r.met for r in results)
    shed = sum(r.shed for r in results)
    peak = max(r.peak_users for r in results)
    worst = min(results, key=lambda r: r.attainment)
    ttft = percentiles(np.concatenate([np.frombuffer(r.ttft_s) for r in results]), (50, 99),
                       scale=1000.0)
    tpot = percentiles(np.concatenate([np.frombuffer(r.tpot_s) for r in results]), (50, 99),
                       scale=1000.0)
    out.update(
        # every segment replayed, nothing shed and the target attainment met in each
        meets_target=len(results) == segments and all(r.passed for r in results),
        peak_users=peak,
        users_per_card=None if not replicas else math.ceil(peak / replicas),
        offered=offered, completed=sum(r.completed for r in results), shed=shed,
        failed=sum(r.failed for r in results), met=met,
        attainment=round(met / offered, 4) if offered else None,
        admitted_attainment=round(met / (offered - shed), 4) if offered > shed else None,
        worst_segment={"segment": worst.segment, "attainment": round(worst.attainment, 4)},
        ttft_ms={k: round(v, 1) for k, v in ttft.items() if k != "n"},
        tpot_ms={k: round(v, 1) for k, v in tpot.items() if k != "n"},
        max_queue=max(r.max_queue for r in results),
        max_in_flight=max(r.max_in_flight for r in results))
    return out
