"""The search for the fewest replicas, against an oracle whose answer is known: doubling
(or halving), bisection, verification on every segment, and what a failed verification
does."""

from __future__ import annotations

from array import array
from collections.abc import Callable

import pytest

from chatfleet.core.traffic.search import ReplicaSearch, Task
from chatfleet.core.traffic.tally import SegmentResult


def result(segment: int, replicas: int, passed: bool) -> SegmentResult:
    return SegmentResult(segment=segment, replicas=replicas, passed=passed, stopped_at=None,
                         why=None if passed else "shed", counted=10, offered=10, completed=10,
                         shed=0 if passed else 1, failed=0, met=10 if passed else 9,
                         ttft_s=array("d"), tpot_s=array("d"), peak_users=5, max_queue=0,
                         max_in_flight=1)


def drive(search: ReplicaSearch, meets: Callable[[int, int, int | None], bool]) -> list[Task]:
    """Answer every task the search asks for (in the order asked) until it is done."""
    asked: list[Task] = []
    while not search.done:
        tasks = search.wanted()
        assert tasks, "a search that is not done must ask for something"
        asked += tasks
        for t in tasks:
            search.give(t, result(t[1], t[0], meets(*t)))
    return asked


@pytest.mark.parametrize("start", [1, 3, 7, 13, 40, 100])
@pytest.mark.parametrize("needed", [1, 2, 13, 57])
def test_it_finds_the_fewest_replicas_from_any_first_guess(start: int, needed: int) -> None:
    s = ReplicaSearch(start=start, order=[2, 0, 1], max_replicas=1000)
    asked = drive(s, lambda r, seg, g: r >= needed)
    assert s.answer == needed and s.why_none is None
    # every segment replayed with every group at the answer, and the answer's results are them
    assert {(needed, seg, None) for seg in (0, 1, 2)} <= set(asked)
    assert {r.segment for r in s.at_answer()} == {0, 1, 2}
    # judgements on the critical (busiest) segments only, with their busiest groups
    assert all(t[1] in (2, 0) for t in asked if t[2] is not None)
    assert [m for r, m in s.judged if r == needed] == [True]
    assert any(r == needed - 1 and not m for r, m in s.judged) or needed == 1


def test_a_segment_that_fails_the_verification_joins_the_critical_ones() -> None:
    # the quiet segment 1 needs more than the busiest two: found at verification
    def meets(r: int, seg: int, groups: int | None) -> bool:
        return r >= (9 if seg == 1 else 6)

    s = ReplicaSearch(start=4, order=[0, 2, 1], max_replicas=100)
    drive(s, meets)
    assert s.answer == 9 and 1 in s.crit


def test_a_group_the_judgements_missed_widens_them() -> None:
    # with two groups judged the segments pass at 5, every group needs 8
    def meets(r: int, seg: int, groups: int | None) -> bool:
        return r >= (8 if groups is None or groups > 2 else 5)

    s = ReplicaSearch(start=5, order=[0, 1], max_replicas=100)
    drive(s, meets)
    assert s.answer == 8 and s.groups == 3


def test_no_fleet_up_to_the_limit_says_so() -> None:
    s = ReplicaSearch(start=3, order=[0], max_replicas=20)
    drive(s, lambda r, seg, g: False)
    assert s.answer is None and s.why_none is not None
    assert "no fleet of up to 20 replicas" in s.why_none and "shed" in s.why_none
    assert max(r for r, _ in s.judged) == 20


def test_without_verification_the_answer_rests_on_the_judgements() -> None:
    s = ReplicaSearch(start=10, order=[0, 1, 2], max_replicas=100, verify=False)
    asked = drive(s, lambda r, seg, g: r >= 12)
    assert s.answer == 12 and all(t[2] is not None for t in asked)
