"""The live side's clock without the host's stalls (chatfleet.jobs.parity)."""

from __future__ import annotations

import pytest

from chatfleet.core.records import RequestRecord
from chatfleet.jobs.parity import records_without_stalls, without_stalls

STALLS = [(1.0, 2.0), (3.0, 3.5)]  # model seconds in which the host held the engine up


def test_the_clock_stops_during_each_stall() -> None:
    assert without_stalls(0.5, STALLS) == 0.5
    assert without_stalls(1.5, STALLS) == 1.0  # inside a stall: its start
    assert without_stalls(2.5, STALLS) == 1.5
    assert without_stalls(3.25, STALLS) == 2.0
    assert without_stalls(10.0, STALLS) == 8.5


def test_a_request_waiting_through_a_stall_gets_the_ttft_it_would_have_had() -> None:
    rec = RequestRecord("r1", scheduled_time=0.5, send_time=0.5, first_token_time=2.5,
                        token_times=[2.5, 2.6, 3.7])
    (out,) = records_without_stalls([rec], STALLS)
    assert out.send_time == 0.5 and out.first_token_time == 1.5
    assert out.token_times == pytest.approx([1.5, 1.6, 2.2])
    assert rec.first_token_time == 2.5  # the record itself is left as it was
    assert records_without_stalls([rec], []) == [rec]
