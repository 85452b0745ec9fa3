"""One segment of a trace through the fleet twin (`SegmentReplay`, a task a worker process
runs): R replicas of an engine behind the gateway's own admission and routing
(twin/fleet.run_fleet_trace), in groups of k replicas (core/traffic/groups.py), the segment's
lines offered as its users sent them (core/traffic/replay.TraceLoop), each counted line
judged against the target (core/traffic/tally).

A judging replay runs the groups with the most work in the segment first (`top_groups` of
them, or all) and stops at the first counted line that fails the fleet (a shed, or a miss past
what the target attainment allows): a fleet too small is known as soon as it fails, which is
what makes the search for the fewest replicas affordable on a day of traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
from numpy.typing import NDArray

from chatfleet.core.defaults import TWIN_DRAIN_S
from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.slo import SLO
from chatfleet.core.traffic.columns import Segment, subset
from chatfleet.core.traffic.groups import GROUP_REPLICAS, ReplicaGroups
from chatfleet.core.traffic.replay import TraceLoop
from chatfleet.core.traffic.tally import ReplayAborted, ReplayTally, SegmentResult
from chatfleet.twin.fleet import FleetConfig, run_fleet_trace
from chatfleet.twin.run import gpu_block

# the replicas of the busiest group whose step logs a replay keeps, for the card's clocks
# and power (the fleet is symmetric: the doubled-traffic hour's slice is two replicas too)
SAMPLED_REPLICAS = 2


@dataclass(frozen=True, slots=True)
class SegmentReplay:
    """Replay `segment` on `fleet.replicas` replicas of `spec` (its queue: one cap per
    replica). `judge`: stop at the first failure (a search's question: does this fleet meet
    the target here?); else count every line (what a fleet does with traffic it cannot
    serve). `top_groups`: replay only the groups with the most answer tokens to make (None:
    every group). `gpu`: read the busiest group's sampled replicas' clocks and power over the
    counted window (for a thermal verdict)."""

    spec: EngineSpec
    fleet: FleetConfig
    segment: Segment
    shared_prefix_tokens: int
    slo: SLO
    judge: bool = True
    gpu: bool = False
    top_groups: int | None = None
    group_size: int = GROUP_REPLICAS
    drain_s: float = TWIN_DRAIN_S
    label: str = field(default="", compare=False)

    def groups(self) -> tuple[ReplicaGroups, list[tuple[int, list[int]]]]:
        """The fleet's groups and, busiest first (by the answer tokens of their counted
        lines), the sessions of each that has any."""
        seg = self.segment
        groups = ReplicaGroups(self.fleet.replicas, self.group_size)
        of = groups.of_sessions(seg.session_names)
        work = np.add.reduceat(np.where(seg.counted, seg.output, 0), seg.offsets[:-1]) \
            if seg.offsets.size > 1 else np.zeros(0, np.int64)
        members: dict[int, list[int]] = {}
        load: dict[int, int] = {}
        for j, g in enumerate(of):
            members.setdefault(g, []).append(j)
            load[g] = load.get(g, 0) + int(work[j])
        order = sorted(members, key=lambda g: (-load[g], g))
        if self.top_groups is not None:
            order = order[: self.top_groups]
        return groups, [(g, members[g]) for g in order]

    def run(self) -> SegmentResult:
        seg = self.segment
        groups, chosen = self.groups()
        per_session = np.add.reduceat(seg.counted.astype(np.int64), seg.offsets[:-1])
        counted = sum(int(per_session[sessions].sum()) for _, sessions in chosen)
        tally = ReplayTally(self.slo, counted, abort=self.judge)
        last_counted = float(seg.time[seg.counted].max())
        open_s = np.zeros(math.ceil(last_counted - seg.start) + 1, np.int64)
        stopped_at: float | None = None
        why: str | None = None
        gpu = None
        max_queue = max_in_flight = 0
        for n, (g, sessions) in enumerate(chosen):
            part = subset(seg, sessions)
            names = [f"twin-{i}" for i in groups.members(g)]
            fleet = replace(self.fleet, replicas=len(names),
                            queue_depth=self.fleet.cap * len(names))
            driver = TraceLoop(part, self.shared_prefix_tokens, tally)
            try:
                run = run_fleet_trace(self.spec, fleet, driver,
                                      shared_prefix_tokens=self.shared_prefix_tokens,
                                      until=float(part.time.max()) + self.drain_s,
                                      keep_logs=SAMPLED_REPLICAS if n == 0 and self.gpu else 0,
                                      replica_names=names)
            except ReplayAborted as stop:
                stopped_at, why = stop.at, stop.why
                break
            max_queue = max(max_queue, run.max_queue)
            max_in_flight = max(max_in_flight, max(run.max_in_flight))
            open_s += open_per_second(driver.opened, driver.closed, seg.start, open_s.size)
            if n == 0 and self.gpu:
                gpu = gpu_block(self.spec, run.scheds[:SAMPLED_REPLICAS], seg.start,
                                max(last_counted, seg.start + 1.0))
        if stopped_at is None and (tally.shed or tally.missed > tally.allowance):
            why = (f"{tally.shed} turns shed" if tally.shed else
                   f"{tally.missed} of {tally.offered} turns missed the target (at most "
                   f"{tally.allowance} may)")
        return SegmentResult(
            segment=seg.index, replicas=self.fleet.replicas,
            passed=stopped_at is None and why is None, stopped_at=stopped_at, why=why,
            counted=counted, offered=tally.offered, completed=tally.completed,
            shed=tally.shed, failed=tally.failed, met=tally.met, ttft_s=tally.ttft_s,
            tpot_s=tally.tpot_s, peak_users=int(open_s.max()) if open_s.size else 0,
            max_queue=max_queue, max_in_flight=max_in_flight, gpu=gpu,
            groups=len(chosen), all_groups=self.top_groups is None)


def open_per_second(opened: list[float], closed: list[float], start: float,
                    seconds: int) -> NDArray[np.int64]:
    """The most sessions open at once in each second from `start` on: a session is open from
    its first line's arrival until its last line's answer (or 429), thinking between turns
    included (one that goes on past the segment: until its end)."""
    out = np.zeros(seconds, np.int64)
    if not opened:
        return out
    times = np.concatenate((np.asarray(opened), np.asarray(closed)))
    deltas = np.concatenate((np.ones(len(opened), np.int64),
                             np.full(len(closed), -1, np.int64)))
    order = np.lexsort((deltas, times))  # at one instant, ends before starts
    t, level = times[order], np.cumsum(deltas[order])
    # the level each second starts with: after the events up to its first instant
    edges = start + np.arange(seconds, dtype=np.float64)
    before = np.searchsorted(t, edges, side="right") - 1
    out[:] = np.where(before >= 0, level[np.maximum(before, 0)], 0)
    inside = (t >= start) & (t < start + seconds)
    np.maximum.at(out, (t[inside] - start).astype(np.int64), level[inside])
    return out
