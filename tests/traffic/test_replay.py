"""The trace's driver (core/traffic/replay.TraceLoop) and a segment through the fleet twin
(twin/trace_fleet.SegmentReplay): lines at their times and never before the answer they
follow, retries only while a turn has no answer, prompts that reuse the history they hold,
judgements that stop at the first failure, and groups of replicas that agree with the whole
fleet."""

from __future__ import annotations

import random

import pytest

from chatfleet.core.engine.build import EngineSpec
from chatfleet.core.records import RequestRecord
from chatfleet.core.slo import SLO
from chatfleet.core.specs import builtin_model, get_gpu, precision
from chatfleet.core.traffic.columns import Segment, Trace
from chatfleet.core.traffic.replay import SYSTEM_SEGMENT, TraceLoop
from chatfleet.core.traffic.synthetic import DayShape, day_trace
from chatfleet.core.traffic.tally import ReplayTally, allowed_misses
from chatfleet.core.traffic.trace import TraceRow
from chatfleet.twin.fleet import FleetConfig
from chatfleet.twin.trace_fleet import SegmentReplay, open_per_second

SPEC = EngineSpec(get_gpu("l4"), builtin_model("qwen3-8b"), precision("fp8", "fp8"),
                  max_running_requests=8)


def segment(rows: list[TraceRow]) -> Segment:
    return Trace.build(enumerate(rows, start=1), "test").segments(3600.0, 0.0)[0]


def loop(rows: list[TraceRow], shared: int = 100) -> TraceLoop:
    return TraceLoop(segment(rows), shared, ReplayTally(SLO(), len(rows), abort=False))


def test_a_turn_follows_its_gap_but_never_comes_before_the_answer() -> None:
    lp = loop([TraceRow("a", 0, 0.0, 120, None, 10), TraceRow("a", 1, 10.0, 150, None, 10),
               TraceRow("a", 2, 12.0, 180, None, 10)])
    first = lp.next_arrival(0.0)
    assert first is not None and first.scheduled_time == 0.0 and lp.next_arrival(0.0) is None
    second = lp.on_done(first, now=3.0)  # answered within the 10 s the user then thought
    assert second is not None and second.scheduled_time == 10.0
    third = lp.on_done(second, now=15.0)  # the answer took longer than the 2 s gap
    assert third is not None and third.scheduled_time == 15.0
    assert lp.on_done(third, now=16.0) is None
    assert lp.opened == [0.0] and lp.closed == [16.0]


def test_a_retry_is_offered_only_while_its_turn_has_no_answer() -> None:
    rows = [TraceRow("a", 0, 0.0, 120, None, 10), TraceRow("a", 0, 1.0, 120, None, 10, None,
                                                            None, 1),
            TraceRow("a", 1, 30.0, 150, None, 10)]
    lp = loop(rows)
    first = lp.next_arrival(0.0)
    assert first is not None
    after_answer = lp.on_done(first, now=0.5)
    assert after_answer is not None and after_answer.turn == 1  # the retry is skipped
    assert after_answer.scheduled_time == 30.0
    lp = loop(rows)
    first = lp.next_arrival(0.0)
    assert first is not None
    retry = lp.on_shed(first, now=0.01)
    assert retry is not None and retry.turn == 0 and retry.scheduled_time == 1.0
    assert retry.segments == first.segments  # the same prompt
    assert retry.request_id != first.request_id


def test_prompts_reuse_the_history_they_hold() -> None:
    lp = loop([TraceRow("a", 0, 0.0, 150, None, 20),  # 100 shared + 50 of its own
               TraceRow("a", 1, 5.0, 150 + 20 + 30, None, 20),  # history and answer + 30
               TraceRow("a", 2, 9.0, 215, None, 20),  # holds the prompt, not the answer
               TraceRow("a", 3, 12.0, 40, None, 20)])  # shorter: a fresh start
    s0 = lp.next_arrival(0.0)
    assert s0 is not None and s0.segments[0] == (SYSTEM_SEGMENT, 100)
    assert [n for _, n in s0.segments] == [100, 50] and s0.first_ids is not None
    s1 = lp.on_done(s0, now=1.0)
    assert s1 is not None
    assert s1.segments[:2] == s0.segments and s1.segments[2] == s0.output_segments[0]
    assert s1.prompt_len == 200
    s2 = lp.on_done(s1, now=6.0)
    assert s2 is not None and s2.segments[:-1] == s1.segments and s2.prompt_len == 215
    s3 = lp.on_done(s2, now=10.0)
    assert s3 is not None and s3.segments == ((SYSTEM_SEGMENT, 40),) and s3.prompt_len == 40


def test_misses_allowed_keep_the_target_share() -> None:
    assert allowed_misses(SLO(), 100) == 1 and allowed_misses(SLO(), 99) == 0
    assert allowed_misses(SLO(attainment=0.9), 25) == 2


def test_the_tally_counts_only_the_counted_lines() -> None:
    tally = ReplayTally(SLO(), counted_total=2, abort=False)
    ok = RequestRecord("t0", first_token_time=0.2, token_times=[0.2, 0.25, 0.3],
                       output_tokens=3, scheduled_time=0.0, send_time=0.0)
    tally.add(ok, counted=False)
    assert tally.offered == 0
    tally.add(ok, counted=True)
    tally.add(RequestRecord("t1", outcome="shed"), counted=True)
    assert (tally.offered, tally.met, tally.shed, tally.missed) == (2, 1, 1, 1)


def day(sessions: int, span_s: float) -> Segment:
    shape = DayShape(sessions=sessions, span_s=span_s, peak_hour=0.3, turns=3.0, think_s=10.0,
                     answer_tokens=64, user_tokens=64, system_tokens=256)
    rows = list(day_trace(shape, random.Random(3)))
    return Trace.build(enumerate(rows, start=1), "day").segments(3600.0, 0.0)[0]


def replay(seg: Segment, replicas: int, cap: int = 8, judge: bool = False,
           group_size: int = 8) -> SegmentReplay:
    fleet = FleetConfig(replicas=replicas, cap=cap, queue_depth=cap * replicas,
                        prefill_reserve_s=0.3, hop_s=0.002)
    return SegmentReplay(SPEC, fleet, seg, 256, SLO(), judge=judge, group_size=group_size)


def test_a_fleet_that_serves_the_segment_counts_every_line() -> None:
    seg = day(200, 900.0)
    res = replay(seg, 3).run()
    assert res.passed and res.why is None and res.stopped_at is None
    assert res.offered == res.counted == seg.num_counted
    assert res.completed == res.offered and res.shed == 0 and res.met >= 0.99 * res.offered
    assert 0 < res.peak_users <= seg.num_sessions
    assert len(res.ttft_s) == res.completed and max(res.ttft_s) < 1.0


def test_a_judgement_stops_at_the_first_shed() -> None:
    seg = day(200, 900.0)
    judged = replay(seg, 1, cap=1, judge=True).run()
    assert not judged.passed and judged.stopped_at is not None
    assert judged.why is not None and "shed" in judged.why
    assert judged.offered < seg.num_counted  # it stopped there
    counted = replay(seg, 1, cap=1).run()  # the same fleet, counted in full
    assert not counted.passed and counted.offered == seg.num_counted and counted.shed > 0


@pytest.mark.parametrize("replicas", [3, 6])
def test_groups_of_replicas_agree_with_the_whole_fleet(replicas: int) -> None:
    seg = day(400, 900.0)
    whole = replay(seg, replicas, group_size=replicas).run()
    grouped = replay(seg, replicas, group_size=2).run()
    assert whole.passed and grouped.passed
    assert grouped.groups == (replicas + 1) // 2 and whole.groups == 1
    assert grouped.offered == whole.offered and grouped.shed == whole.shed == 0
    assert abs(grouped.met - whole.met) <= 0.01 * whole.offered
    assert abs(grouped.peak_users - whole.peak_users) <= 0.1 * whole.peak_users


def test_open_sessions_per_second() -> None:
    # two sessions: [0.5, 2.5) and [1.0, 4.0); seconds from 0
    assert open_per_second([0.5, 1.0], [2.5, 4.0], 0.0, 5).tolist() == [1, 2, 2, 1, 0]
