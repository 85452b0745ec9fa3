"""Metrics math: expected values below are worked out by hand from docs/metrics.md's definitions."""

from __future__ import annotations

import math
from array import array
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chatfleet.core.documents.sweep import (
    ClientBlock,
    EngineBlock,
    Knee,
    SweepPoint,
    load_from_json,
)
from chatfleet.core.measure.itl import expand_chunks
from chatfleet.core.measure.knee import (
    bisect_next,
    find_knee,
    recommended_cap,
    sweep_document,
    throughput_peak,
)
from chatfleet.core.measure.percentiles import percentiles, percentiles_sorted, ranks_read
from chatfleet.core.measure.point import (
    arrivals_in_window,
    in_window,
    share_in_window,
    summarize_point,
)
from chatfleet.core.measure.request import (
    e2e,
    in_flight_max,
    itl_gaps,
    meets_slo,
    request_itl_stat,
    tpot,
    ttft,
)
from chatfleet.core.records import RequestRecord
from chatfleet.core.slo import ITL_STATS, SLO

# ------------------------------------------------------------------------------------------
# helpers


def rec(
    rid: str = "r",
    *,
    sched: float = 0.0,
    send: float | None = None,
    times: list[float] | None = None,
    outcome: str = "ok",
    output_tokens: int | None = None,
    prompt: int = 0,
    cached: int = 0,
    replica: str | None = None,
    first: float | None = None,
) -> RequestRecord:
    times = [] if times is None else times
    return RequestRecord(
        request_id=rid,
        replica=replica,
        scheduled_time=sched,
        send_time=sched if send is None else send,
        first_token_time=first if first is not None else (times[0] if times else None),
        token_times=times,
        prompt_tokens=prompt,
        cached_tokens=cached,
        output_tokens=len(times) if output_tokens is None else output_tokens,
        outcome=outcome,  # type: ignore[arg-type]
    )


def point(
    load: float,
    attainment: float,
    *,
    mode: str = "closed",
    valid: bool = True,
    tok_s: float = 0.0,
    in_flight: int | None = None,
) -> SweepPoint:
    key = "concurrency" if mode == "closed" else "rate_rps"
    p: dict[str, Any] = {
        "load": {"mode": mode, key: load},
        "valid": valid,
        "invalid_reason": None if valid else "clock under floor",
        "attainment": attainment,
        "output_tok_s": tok_s,
    }
    if mode == "closed":
        p["in_flight_max"] = int(load) if in_flight is None else in_flight
    return SweepPoint.from_json(p)


def summarize(records: list[RequestRecord], **kw: Any) -> dict[str, Any]:
    """The point as the file holds it (its JSON): the contract's keys and numbers."""
    args: dict[str, Any] = {
        "load": {"mode": "closed", "concurrency": 4},
        "window": (0.0, 10.0),
        "slo": SLO(),
        "mode": "closed",
        "seed": 7,
        "flushed": True,
    }
    args.update(kw)
    args["load"] = load_from_json(args["load"])
    for block, kind in (("engine", EngineBlock), ("client", ClientBlock)):
        if isinstance(args.get(block), dict):
            args[block] = kind.from_json(args[block], block)
    return summarize_point(records, **args).to_json()


# ------------------------------------------------------------------------------------------
# SLO


def test_slo_defaults_and_json() -> None:
    assert SLO().to_json() == {
        "ttft_ms": 1000.0,
        "tpot_ms": 100.0,
        "itl_stat": "mean",
        "attainment": 0.99,
    }
    assert SLO.from_json(SLO(itl_stat="p99").to_json()) == SLO(itl_stat="p99")


@pytest.mark.parametrize(
    "kw",
    [
        {"itl_stat": "p50"},
        {"ttft_ms": 0.0},
        {"tpot_ms": -1.0},
        {"attainment": 0.0},
        {"attainment": 1.5},
    ],
)
def test_slo_rejects_bad_values(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SLO(**kw)


# ------------------------------------------------------------------------------------------
# expand_chunks


def test_expand_chunks_splits_each_gap_evenly_over_its_tokens() -> None:
    # first chunk: 1 token at 1.0; a 3-token chunk 0.3 s later: 0.1 s each; 2 tokens 0.2 s later
    got = expand_chunks(None, [1.0, 1.3, 1.5], [1, 3, 2])
    assert got == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.4, 1.5])
    gaps = np.diff(got)
    assert gaps == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.1])  # never one 0.3 s sample per chunk


def test_expand_chunks_first_chunk_tokens_all_arrive_at_its_time() -> None:
    got = expand_chunks(None, [2.0, 2.4], [3, 2])
    assert got == pytest.approx([2.0, 2.0, 2.0, 2.2, 2.4])


def test_expand_chunks_continues_from_prev_time() -> None:
    assert expand_chunks(0.5, [1.0], [2]) == pytest.approx([0.75, 1.0])
    assert expand_chunks(0.5, [1.0, 1.0], [1, 2]) == pytest.approx([1.0, 1.0, 1.0])
    assert expand_chunks(None, [], []) == []


@pytest.mark.parametrize(
    ("prev", "times", "counts"),
    [
        (None, [1.0, 2.0], [1]),  # lengths differ
        (None, [1.0, 2.0], [1, 0]),  # a chunk without tokens
        (None, [2.0, 1.0], [1, 1]),  # time goes back
        (3.0, [2.0], [1]),  # before prev_time
        (None, [1.0, math.nan], [1, 1]),
        (None, [1.0], [1.5]),  # not an integer count
    ],
)
def test_expand_chunks_validates(prev: float | None, times: list[float], counts: list[Any]) -> None:
    with pytest.raises(ValueError):
        expand_chunks(prev, times, counts)


@st.composite
def chunk_streams(draw: st.DrawFn) -> tuple[float | None, list[float], list[int]]:
    n = draw(st.integers(1, 30))
    start = draw(st.floats(0.0, 1e4, allow_nan=False))
    steps = draw(st.lists(st.floats(0.0, 5.0, allow_nan=False), min_size=n, max_size=n))
    counts = draw(st.lists(st.integers(1, 16), min_size=n, max_size=n))
    prev = draw(st.one_of(st.none(), st.floats(0.0, 5.0, allow_nan=False)))
    times = list(np.cumsum(steps) + start)
    return (None if prev is None else start - prev), [float(t) for t in times], counts


@given(chunk_streams())
@settings(max_examples=200, deadline=None)
def test_expand_chunks_preserves_count_and_total_time(
    stream: tuple[float | None, list[float], list[int]],
) -> None:
    prev, times, counts = stream
    got = expand_chunks(prev, times, counts)
    assert len(got) == sum(counts)
    assert bool(np.all(np.diff(got) >= 0))
    # the last token of every chunk arrives exactly with its chunk
    ends = np.cumsum(counts) - 1
    assert [got[i] for i in ends] == times
    origin = times[0] if prev is None else prev
    assert got[0] >= origin
    # the gaps add up to the whole span: nothing lost, nothing invented
    assert math.fsum(np.diff([origin, *got])) == pytest.approx(times[-1] - origin, abs=1e-9)
    if prev is None:
        assert got[: counts[0]] == [times[0]] * counts[0]
    else:
        assert got[0] - prev == pytest.approx((times[0] - prev) / counts[0], abs=1e-9)


# ------------------------------------------------------------------------------------------
# per-request figures


def test_ttft_open_loop_from_schedule_closed_loop_from_send() -> None:
    # scheduled 10.0, sent 10.4 (client-side queueing), first token 11.2
    r = rec(sched=10.0, send=10.4, times=[11.2, 11.25])
    assert ttft(r, "open") == pytest.approx(1.2)
    assert ttft(r, "closed") == pytest.approx(0.8)
    assert not meets_slo(r, SLO(), "open")  # 1,200 ms > 1,000 ms
    assert meets_slo(r, SLO(), "closed")  # 800 ms
    assert e2e(r, "open") == pytest.approx(1.25)
    assert e2e(r, "closed") == pytest.approx(0.85)


def test_tpot_is_e2e_minus_ttft_over_output_tokens_minus_one() -> None:
    r = rec(send=0.0, times=[0.5, 0.6, 0.8, 1.4])
    # e2e 1.4, TTFT 0.5: (1.4 - 0.5) / (4 - 1) = 0.3
    assert tpot(r, "closed") == pytest.approx(0.3)
    # the same whatever the origin
    assert tpot(rec(sched=-3.0, send=0.0, times=[0.5, 0.6, 0.8, 1.4]), "open") == pytest.approx(0.3)
    # output tokens counted by usage, not by recorded times: (1.4 - 0.5) / 9 = 0.1
    assert tpot(rec(send=0.0, times=[0.5, 0.6, 0.8, 1.4], output_tokens=10), "closed") == (
        pytest.approx(0.1)
    )
    assert tpot(rec(send=0.0, times=[0.5]), "closed") is None
    assert tpot(rec(send=0.0, outcome="error"), "closed") is None


def test_itl_gaps_are_per_token_differences() -> None:
    r = rec(times=[1.0, 1.0, 1.25, 1.75])
    assert itl_gaps(r) == pytest.approx([0.0, 0.25, 0.5])
    assert itl_gaps(rec(times=[1.0])).size == 0
    arr = rec(times=[1.0, 1.5])
    arr.token_times = np.array([1.0, 1.5])  # type: ignore[assignment]  # arrays are allowed
    assert itl_gaps(arr) == pytest.approx([0.5])


def test_one_token_request_passes_the_per_token_part() -> None:
    r = rec(send=0.0, times=[0.9])
    for stat in ITL_STATS:
        assert meets_slo(r, SLO(itl_stat=stat), "closed")


def test_only_ok_requests_with_output_can_meet() -> None:
    assert not meets_slo(rec(send=0.0, times=[0.1, 0.15], outcome="timeout"), SLO(), "closed")
    assert not meets_slo(rec(send=0.0, outcome="shed"), SLO(), "closed")
    assert not meets_slo(rec(send=0.0, times=[]), SLO(), "closed")  # ok but no first token


def test_limits_are_inclusive() -> None:
    # TTFT exactly 1,000 ms and TPOT exactly 100 ms meet the target
    r = rec(sched=0.1, send=0.1, times=[1.1, 1.2, 1.3])
    assert meets_slo(r, SLO(), "closed")
    assert not meets_slo(rec(send=0.0, times=[1.001, 1.1]), SLO(), "closed")
    assert not meets_slo(rec(send=0.0, times=[0.5, 0.601]), SLO(), "closed")


def stalled_request() -> RequestRecord:
    # 11 tokens, 10 gaps: nine of 40 ms and one stall of 500 ms
    times = [0.2]
    for g in [0.04] * 5 + [0.5] + [0.04] * 4:
        times.append(times[-1] + g)
    return rec(send=0.0, times=times)


def test_itl_stat_mean_p99_max_verdicts() -> None:
    r = stalled_request()
    # mean: 0.86 s / 10 = 86 ms; p99 of its gaps: index 0.99 * 9 = 8.91 between 40 and 500 ms:
    # 40 + 0.91 * 460 = 458.6 ms; max 500 ms
    assert request_itl_stat(r, "mean", "closed") == pytest.approx(0.086)
    assert request_itl_stat(r, "p99", "closed") == pytest.approx(0.4586)
    assert request_itl_stat(r, "max", "closed") == pytest.approx(0.5)
    assert meets_slo(r, SLO(itl_stat="mean"), "closed")
    assert not meets_slo(r, SLO(itl_stat="p99"), "closed")
    assert not meets_slo(r, SLO(itl_stat="max"), "closed")


def test_itl_stat_p99_ignores_one_stall_among_many_gaps() -> None:
    # 201 gaps: 200 of 50 ms and one of 500 ms; p99 index 0.99 * 200 = 198 -> 50 ms exactly
    times = [0.1]
    for g in [0.05] * 100 + [0.5] + [0.05] * 100:
        times.append(times[-1] + g)
    r = rec(send=0.0, times=times)
    assert request_itl_stat(r, "p99", "closed") == pytest.approx(0.05)
    assert meets_slo(r, SLO(itl_stat="p99"), "closed")
    assert not meets_slo(r, SLO(itl_stat="max"), "closed")
    # and its summary agrees
    for stat, met in (("mean", 1), ("p99", 1), ("max", 0)):
        p = summarize([r], slo=SLO(itl_stat=stat))  # type: ignore[arg-type]
        assert p["requests"]["met_slo"] == met
        assert p["itl_stat"] == stat


def test_itl_stat_summary_agrees_with_hand_verdicts() -> None:
    r = stalled_request()
    for stat, met in (("mean", 1), ("p99", 0), ("max", 0)):
        p = summarize([r], slo=SLO(itl_stat=stat))  # type: ignore[arg-type]
        assert p["requests"]["met_slo"] == met


# ------------------------------------------------------------------------------------------
# percentiles


def test_percentiles_linear_interpolation_by_hand() -> None:
    # [10, 20, 30, 40]: p50 index 1.5 -> 25; p90 index 2.7 -> 37; p99 index 2.97 -> 39.7
    got = percentiles([40.0, 10.0, 30.0, 20.0])
    assert got == pytest.approx({"p50": 25.0, "p90": 37.0, "p99": 39.7, "n": 4})
    assert percentiles([0.1, 0.2], (50,), scale=1000.0) == pytest.approx({"p50": 150.0, "n": 2})
    assert percentiles([3.0], (0, 100)) == {"p0": 3.0, "p100": 3.0, "n": 1}
    assert percentiles([], (50, 99.9)) == {"p50": 0.0, "p99.9": 0.0, "n": 0}


def test_percentiles_rejects_nan_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentiles([1.0, math.nan])
    with pytest.raises(ValueError):
        percentiles([1.0], (101,))


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=300),
    st.lists(st.floats(0.0, 100.0), min_size=1, max_size=5),
)
@settings(max_examples=200, deadline=None)
def test_percentiles_match_numpy_linear(values: list[float], ps: list[float]) -> None:
    got = percentiles(values, ps)
    for p in ps:
        expected = float(np.percentile(values, p))
        assert got[f"p{p:g}"] == pytest.approx(expected, rel=1e-12, abs=1e-9)
    assert got["n"] == len(values)


# ------------------------------------------------------------------------------------------
# window membership


def test_window_membership_is_half_open_on_schedule_or_send() -> None:
    w = (10.0, 20.0)
    assert not in_window(rec(sched=9.99), w, "open")
    assert in_window(rec(sched=10.0), w, "open")
    assert in_window(rec(sched=19.99), w, "open")
    assert not in_window(rec(sched=20.0), w, "open")
    late_send = rec(sched=9.5, send=10.1)  # queued client-side across the window start
    assert not in_window(late_send, w, "open")
    assert in_window(late_send, w, "closed")


def test_summary_counts_only_window_requests() -> None:
    inside = [rec(f"in{i}", sched=10.0 + i, send=10.0 + i, times=[10.2 + i]) for i in range(10)]
    outside = [
        rec("warmup", sched=9.9, send=9.9, times=[10.1]),
        rec("after", sched=20.0, send=20.0, times=[20.1]),
        # scheduled inside, sent after the window: counts in open loop only
        rec("queued", sched=19.5, send=20.5, times=[20.6]),
    ]
    closed = summarize(inside + outside, window=(10.0, 20.0))
    assert closed["requests"]["offered"] == 10
    assert closed["duration_s"] == 10.0
    opened = summarize(
        inside + outside, window=(10.0, 20.0), mode="open", load={"mode": "open", "rate_rps": 1.0}
    )
    assert opened["requests"]["offered"] == 11
    # the queued request waited 1.1 s from its schedule: a miss in open loop
    assert opened["requests"]["met_slo"] == 10
    assert opened["ttft_ms"]["p99"] > 1000.0


# ------------------------------------------------------------------------------------------
# a whole point


def mixed_window() -> list[RequestRecord]:
    records = []
    # seven ok requests sent at 0..6 s; TTFT 100..600 ms and one of 1,500 ms; 3 tokens each,
    # gaps of 50 ms then 100 ms
    for i, ttft_s in enumerate([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 1.5]):
        f = i + ttft_s
        records.append(
            rec(
                f"ok{i}",
                send=float(i),
                times=[f, f + 0.05, f + 0.15],
                prompt=1000,
                cached=500 if i < 3 else 0,
            )
        )
    records.append(rec("shed0", send=7.0, outcome="shed", prompt=1000))
    records.append(rec("shed1", send=7.5, outcome="shed", prompt=1000))
    # a timeout after two tokens 5 s apart: its tokens count as output, its gap is not an ITL
    records.append(rec("late", send=8.0, times=[8.3, 13.3], outcome="timeout", prompt=1000))
    return records


def test_point_counts_attainment_and_goodput() -> None:
    p = summarize(mixed_window())
    assert p["requests"] == {
        "offered": 10,
        "completed": 7,
        "met_slo": 6,
        "shed": 2,
        "failed": 1,
        "admitted": 8,
        "finished_in_window": 7,
    }
    assert p["attainment"] == pytest.approx(0.6)  # shed and failed count as misses
    assert p["admitted_attainment"] == pytest.approx(0.75)  # 6 of the 8 let in
    assert p["goodput_rps"] == pytest.approx(0.6)
    assert p["request_rps"] == pytest.approx(0.7)
    # tokens that arrived in [0, 10): 7 * 3, and the timeout's first (its second came at 13.3)
    assert p["output_tok_s"] == pytest.approx(2.2)
    assert p["cached_token_share"] == pytest.approx(1500 / 7000)
    assert p["thin"] is True


def waves(users: int = 4, period_s: float = 4.0, tokens: int = 10) -> list[RequestRecord]:
    """Closed-loop users that start together and move in waves: each sends at 0, 4, 8, 12,
    16 s (none at 20 s: the window ends), and its 10 tokens arrive 0.3 s + 0.4 s k after."""
    out = []
    for u in range(users):
        for w in range(5):
            send = w * period_s
            times = [send + 0.3 + 0.4 * k for k in range(tokens)]
            out.append(rec(f"u{u}w{w}", send=send, times=times))
    return out


def test_throughput_counts_the_tokens_that_arrive_in_the_window() -> None:
    """In waves the requests sent in a window do not carry the window's tokens: those of the
    wave sent at 8 s arrive in it too, and those sent in it end after it."""
    p = summarize(waves(), window=(10.0, 20.0), slo=SLO(tpot_ms=500.0))
    # per user: 5 tokens of the 8 s wave (10.3 .. 11.9), 10 of the 12 s and 10 of the 16 s
    assert p["output_tok_s"] == pytest.approx(4 * 25 / 10.0)
    # the truth: each user streams 10 tokens every 4 s
    assert p["output_tok_s"] == pytest.approx(4 * 10 / 4.0)
    # counted from the window's requests (sent at 12 and 16 s) it would be 4 * 20 / 10 = 8
    sent = [r for r in waves() if 10.0 <= r.send_time < 20.0]
    assert sum(r.output_tokens for r in sent) / 10.0 == pytest.approx(8.0)
    # requests are counted as tokens are: per user half of the 8 s wave's request, all of the
    # 12 s one and all of the 16 s one: 2.5 requests in 10 s, the truth of one every 4 s
    assert p["request_rps"] == pytest.approx(4 * 2.5 / 10.0)
    assert p["request_rps"] == pytest.approx(4 / 4.0)
    assert p["request_rps"] * 10 == pytest.approx(p["output_tok_s"])  # 10 tokens a request
    # whole requests by their last token (the 8, 12 and 16 s waves end at 11.9, 15.9 and
    # 19.9 s) would give 1.2, by their send time 0.8
    assert p["requests"]["finished_in_window"] == 12
    # every request meets this target: goodput is the same count
    assert p["goodput_rps"] == pytest.approx(1.0)
    # latency figures and attainment stay over the requests sent in the window
    assert p["requests"]["offered"] == p["requests"]["completed"] == 8
    assert p["ttft_ms"]["n"] == 8
    # 2.5 cycles of 4 s in the window: few, so the rates may move with its phase
    assert p["window_cycles"] == pytest.approx(2.5)
    assert p["few_cycles"] is True


def test_request_rate_and_goodput_move_with_the_windows_phase_as_tokens_do() -> None:
    """Over windows of 4.5 cycles at eight phases, the share count stays within 1 / cycles of
    the truth (one request every 4 s a user) and equals tok/s over the answer length, where
    whole requests by their last token swing by a whole wave (+-11%)."""
    records = waves(users=4, period_s=4.0, tokens=10) + [
        rec(f"u{u}w{w}", send=w * 4.0, times=[w * 4.0 + 0.3 + 0.4 * k for k in range(10)])
        for u in range(4) for w in range(5, 10)]
    rates, by_last = [], []
    for k in range(8):
        start = 8.0 + 0.5 * k
        p = summarize(records, window=(start, start + 18.0), slo=SLO(tpot_ms=500.0))
        assert p["window_cycles"] == pytest.approx(4.5, rel=1 / 4.5)
        assert abs(p["request_rps"] - 1.0) < 1.0 / p["window_cycles"]
        assert p["request_rps"] == pytest.approx(p["output_tok_s"] / 10)
        assert p["goodput_rps"] == pytest.approx(p["request_rps"])
        rates.append(p["request_rps"])
        by_last.append(p["requests"]["finished_in_window"] / 18.0)
    assert max(rates) - min(rates) < 0.05
    assert max(by_last) - min(by_last) > 0.2


def test_goodput_counts_the_shares_of_the_requests_that_meet_the_target() -> None:
    """A request sent before the window is judged as a window request is: here the 8 s wave
    (half of it in the window) misses the target, the later waves meet it."""
    records = waves()
    slow = [r for r in records if r.send_time == 8.0]
    for r in slow:
        r.first_token_time = None
        r.token_times = [t + 1.0 for t in r.token_times]  # TTFT 1.3 s: misses 1 s
    p = summarize(records, window=(10.0, 20.0), slo=SLO(tpot_ms=500.0))
    in_window = sum(share_in_window(r, (10.0, 20.0)) for r in slow)
    assert 0 < in_window < len(slow)
    assert p["request_rps"] == pytest.approx((8 + in_window) / 10.0)
    assert p["goodput_rps"] == pytest.approx(8 / 10.0)


def counts(records: list[RequestRecord], window: tuple[float, float]) -> tuple[int, int, float]:
    """(tokens, finished, the sum of the shares) of `arrivals_in_window`."""
    got = arrivals_in_window(records, window)
    return got.tokens, got.finished, sum(share for _, share in got.shares)


def test_arrivals_in_window_edges() -> None:
    r = rec("a", send=0.0, times=[9.0, 10.0, 10.5, 20.0])
    # [start, end): 10.0 in, 20.0 out; half of the request's tokens
    assert counts([r], (10.0, 20.0)) == (2, 0, 0.5)
    assert share_in_window(r, (10.0, 20.0)) == 0.5
    assert counts([r], (0.0, 20.5)) == (4, 1, 1.0)
    # a record without token times counts its tokens at its first token
    bare = rec("b", send=0.0, first=12.0, output_tokens=5)
    assert counts([bare], (10.0, 20.0)) == (5, 1, 1.0)
    assert counts([bare], (13.0, 20.0)) == (0, 0, 0.0)
    # a failed request's tokens count as output, never as a request
    failed = rec("c", send=0.0, times=[11.0, 12.0], outcome="timeout")
    assert counts([failed], (10.0, 20.0)) == (2, 0, 0.0)
    assert counts([], (0.0, 1.0)) == (0, 0, 0.0)
    # an ok request without any output counts for nothing
    empty = rec("d", send=0.0, times=[])
    assert share_in_window(empty, (0.0, 1.0)) == 0.0


def test_point_percentiles_in_ms_with_counts() -> None:
    p = summarize(mixed_window())
    # TTFT of the completed: 100..600, 1500 ms. p50 = 400; p90 index 5.4 -> 600 + 0.4 * 900;
    # p99 index 5.94 -> 600 + 0.94 * 900
    assert p["ttft_ms"] == pytest.approx({"p50": 400.0, "p90": 960.0, "p99": 1446.0, "n": 7})
    # 14 gaps: seven of 50 ms, seven of 100 ms; p50 index 6.5 -> 75 ms. The timeout's 5 s gap
    # is not pooled.
    assert p["itl_ms"] == pytest.approx(
        {"p50": 75.0, "p90": 100.0, "p99": 100.0, "max": 100.0, "n": 14}
    )
    assert p["tpot_ms"] == pytest.approx({"p50": 75.0, "p99": 75.0, "n": 7})
    # e2e = TTFT + 150 ms
    assert p["e2e_ms"] == pytest.approx({"p50": 550.0, "p99": 1596.0, "n": 7})


def test_point_has_every_contract_key() -> None:
    p = summarize(mixed_window())
    contract = {
        "load": {"mode", "concurrency"},
        "seed": None,
        "flushed": None,
        "valid": None,
        "invalid_reason": None,
        "duration_s": None,
        "requests": {"offered", "completed", "met_slo", "shed", "failed"},
        "output_tok_s": None,
        "request_rps": None,
        "goodput_rps": None,
        "attainment": None,
        "ttft_ms": {"p50", "p90", "p99"},
        "itl_ms": {"p50", "p90", "p99", "max"},
        "tpot_ms": {"p50", "p99"},
        "e2e_ms": {"p50", "p99"},
        "cached_token_share": None,
        "engine": {"max_running", "max_queue", "peak_token_usage"},
        "gpu": {"sm_clock_mhz", "temp_c", "thermal_slowdown_share"},
        "client": {"send_lag_ms_p99", "loop_lag_ms_p99"},
    }
    for key, sub in contract.items():
        assert key in p, key
        if sub is not None:
            assert sub <= set(p[key]), key
    assert p["load"] == {"mode": "closed", "concurrency": 4}
    assert (p["seed"], p["flushed"], p["valid"], p["invalid_reason"]) == (7, True, True, None)
    assert p["engine"] == {"max_running": 0, "max_queue": 0, "peak_token_usage": 0.0}
    assert p["gpu"]["sm_clock_mhz"] == {"p50": 0, "min": 0}
    assert "time_scale" not in p


def test_point_blocks_invalidity_and_time_scale_are_recorded() -> None:
    p = summarize(
        mixed_window(),
        invalid_reasons=["median SM clock 465 MHz under floor 1200"],
        engine={"max_running": 12, "max_queue": 3, "peak_token_usage": 0.93},
        client={"send_lag_ms_p99": 2.5},
        time_scale=10.0,
    )
    assert p["valid"] is False
    assert p["invalid_reason"].startswith("median SM clock")
    assert p["engine"] == {"max_running": 12, "max_queue": 3, "peak_token_usage": 0.93}
    assert p["client"] == {"send_lag_ms_p99": 2.5, "loop_lag_ms_p99": 0.0}
    assert p["time_scale"] == 10.0


def test_point_rejects_inconsistent_arguments() -> None:
    with pytest.raises(ValueError):
        summarize([], window=(5.0, 5.0))
    with pytest.raises(ValueError):
        summarize([], load={"mode": "open", "rate_rps": 1.0})  # mode is closed
    with pytest.raises(ValueError):
        summarize([], load={"mode": "closed"})


def test_empty_window_gives_zeros() -> None:
    p = summarize([])
    assert p["requests"]["offered"] == 0
    assert p["attainment"] == 0.0
    assert p["admitted_attainment"] == 0.0
    assert p["ttft_ms"] == {"p50": 0.0, "p90": 0.0, "p99": 0.0, "n": 0}
    assert p["itl_ms"]["max"] == 0.0
    assert p["in_flight_max"] == 0


def test_thin_below_200_requests() -> None:
    def many(n: int) -> list[RequestRecord]:
        return [rec(f"r{i}", send=i * 0.01, times=[i * 0.01 + 0.1]) for i in range(n)]

    assert summarize(many(199))["thin"] is True
    assert summarize(many(200))["thin"] is False


def test_summary_leaves_record_arrays_untouched() -> None:
    records = mixed_window()
    for r in records:
        r.token_times = np.asarray(r.token_times, dtype=np.float64)  # type: ignore[assignment]
    before = [np.array(r.token_times, copy=True) for r in records]
    summarize(records, slo=SLO(itl_stat="p99"))
    for r, b in zip(records, before, strict=True):
        assert np.array_equal(np.asarray(r.token_times), b)


# ------------------------------------------------------------------------------------------
# in flight


def test_in_flight_counts_overlaps_from_send_to_last_token() -> None:
    records = [
        rec("a", send=0.0, times=[0.5, 1.0]),
        rec("b", send=0.5, times=[1.5, 2.0]),
        rec("c", send=1.0, times=[2.0, 3.0]),  # sent the instant a ends: b and c overlap only
        rec("shed", send=0.6, outcome="shed"),
        rec("no-output", send=0.6, outcome="error"),
    ]
    assert in_flight_max(records) == 2


def test_in_flight_of_closed_loop_users_without_think_time_is_the_user_count() -> None:
    records = []
    for user in range(3):
        t = user * 0.01
        for turn in range(5):
            end = t + 0.7 + 0.1 * user
            records.append(rec(f"u{user}t{turn}", send=t, times=[t + 0.2, end]))
            t = end  # the next request leaves as the last token arrives
    assert in_flight_max(records) == 3
    assert summarize(records, window=(0.0, 100.0))["in_flight_max"] == 3


def test_in_flight_is_per_replica() -> None:
    records = [
        rec("a", send=0.0, times=[1.0], replica="r0"),
        rec("b", send=0.0, times=[1.0], replica="r0"),
        rec("c", send=0.0, times=[1.0], replica="r1"),
    ]
    assert in_flight_max(records) == 2


# ------------------------------------------------------------------------------------------
# the vectorised summary agrees with the per-request definitions


def held(times: list[float], kind: str) -> Any:
    if kind == "ndarray":
        return np.asarray(times)
    return array("d", times) if kind == "array" else times


@st.composite
def records_strategy(draw: st.DrawFn) -> list[RequestRecord]:
    out = []
    # how the records hold their times: the twin's array('d') (read as one buffer), lists
    # and numpy arrays (read float by float), or a mix
    kinds = ("list", "ndarray", "array")
    kind = draw(st.sampled_from((*kinds, "mixed")))
    for i in range(draw(st.integers(0, 25))):
        send = draw(st.floats(0.0, 10.0))
        sched = send - draw(st.floats(0.0, 1.0))
        n = draw(st.integers(0, 40))
        first = send + draw(st.floats(0.0, 2.0))
        gaps = draw(st.lists(st.floats(0.0, 0.3), min_size=max(n - 1, 0), max_size=max(n - 1, 0)))
        times = [first, *(first + np.cumsum(gaps)).tolist()] if n else []
        r = RequestRecord(
            request_id=str(i),
            replica=draw(st.sampled_from([None, "r0", "r1"])),
            scheduled_time=sched,
            send_time=send,
            first_token_time=draw(st.sampled_from([None, times[0]])) if times else None,
            token_times=held(times, draw(st.sampled_from(kinds)) if kind == "mixed" else kind),
            prompt_tokens=100,
            cached_tokens=draw(st.integers(0, 100)),
            output_tokens=draw(st.sampled_from([n, 0, n + 3])),
            outcome=draw(st.sampled_from(["ok", "ok", "ok", "shed", "error", "timeout"])),
        )
        out.append(r)
    return out


@given(
    records_strategy(), st.sampled_from(["mean", "p99", "max"]), st.sampled_from(["open", "closed"])
)
@settings(max_examples=300, deadline=None)
def test_summary_matches_per_request_definitions(
    records: list[RequestRecord], stat: str, mode: str
) -> None:
    slo = SLO(ttft_ms=800.0, tpot_ms=120.0, itl_stat=stat)  # type: ignore[arg-type]
    load = {"mode": mode, "concurrency" if mode == "closed" else "rate_rps": 1}
    p = summarize(records, slo=slo, mode=mode, load=load, window=(0.0, 10.0))
    members = [r for r in records if in_window(r, (0.0, 10.0), mode)]  # type: ignore[arg-type]
    met = sum(meets_slo(r, slo, mode) for r in members)  # type: ignore[arg-type]
    assert p["requests"]["met_slo"] == met
    ok = [r for r in members if r.outcome == "ok"]
    ttfts = [ttft(r, mode) for r in ok]  # type: ignore[arg-type]
    expected = percentiles([t for t in ttfts if t is not None], (50, 90, 99), scale=1000.0)
    assert p["ttft_ms"] == pytest.approx(expected)
    pooled = np.concatenate([itl_gaps(r) for r in ok]) if ok else np.zeros(0)
    assert p["itl_ms"]["n"] == pooled.size
    if pooled.size:
        assert p["itl_ms"]["max"] == pytest.approx(pooled.max() * 1000.0)
        for q in (50, 90, 99):
            assert p["itl_ms"][f"p{q}"] == pytest.approx(np.percentile(pooled, q) * 1000.0)
    tpots = [tpot(r, mode) for r in ok]  # type: ignore[arg-type]
    assert p["tpot_ms"]["n"] == sum(t is not None for t in tpots)
    assert p["in_flight_max"] == in_flight_max(members)


@given(
    st.lists(st.sampled_from([0.0, 0.01, 0.02, 0.5])
             | st.floats(0, 10, allow_nan=False), max_size=60),
    st.integers(0, 10),
    st.lists(st.floats(0, 100), min_size=1, max_size=4),
)
def test_a_partition_at_the_ranks_read_gives_the_percentiles_of_a_sort(
    values: list[float], num_nan: int, ps: list[float]
) -> None:
    # the figures partition every gap at these ranks instead of sorting them; the NaN that
    # separate requests order last, as in a sort, and are never among the n values
    arr = np.array(values + [math.nan] * num_nan)
    n = len(values)
    part = arr.copy()
    if n:
        part.partition(ranks_read(n, ps))
    full = np.sort(arr)
    assert percentiles_sorted(part[:n], ps, 1000.0) == percentiles_sorted(full[:n], ps, 1000.0)
    if n:
        assert part[n - 1] == full[n - 1] == max(values)


# ------------------------------------------------------------------------------------------
# knee


def test_knee_is_highest_load_meeting_with_all_lower_loads() -> None:
    pts = [point(c, a) for c, a in [(1, 1.0), (2, 0.995), (4, 0.99), (8, 0.97), (16, 0.5)]]
    assert find_knee(pts, "closed", 0.99) == Knee(4, 8)


def test_knee_dip_at_a_middle_load_stops_it() -> None:
    # 2 fails; 4 and 8 pass again but do not count
    pts = [point(c, a) for c, a in [(8, 1.0), (1, 1.0), (4, 1.0), (2, 0.98)]]
    assert find_knee(pts, "closed", 0.99) == Knee(1, 2)


def test_knee_ignores_invalid_points() -> None:
    pts = [
        point(1, 1.0),
        point(2, 1.0),
        point(4, 0.5, valid=False),
        point(8, 0.995),
        point(16, 0.9),
        point(32, 1.0, valid=False),
    ]
    assert find_knee(pts, "closed", 0.99) == Knee(8, 16)


def test_knee_without_passing_or_failing_loads() -> None:
    assert find_knee([point(2, 0.9), point(4, 0.8)], "closed", 0.99) == Knee(None, 2)
    assert find_knee([point(2, 1.0), point(4, 1.0)], "closed", 0.99) == Knee(4, None)
    assert find_knee([], "closed", 0.99) == Knee(None, None)


def test_knee_per_mode_and_repeats() -> None:
    pts = [
        point(1.0, 1.0, mode="open"),
        point(2.0, 0.995, mode="open"),
        point(4.0, 0.2, mode="open"),
        point(16, 0.1),  # closed: not part of the rate knee
        point(2.0, 0.98, mode="open"),  # a repeat of 2 rps that fails
    ]
    assert find_knee(pts, "open", 0.99) == Knee(1.0, 2.0)
    assert find_knee(pts, "closed", 0.99) == Knee(None, 16)


@given(
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10),
    st.floats(0.5, 1.0),
    st.integers(0, 9),
    st.floats(0.0, 1.0),
)
def test_knee_properties(
    attainments: list[float], target: float, which: int, better: float
) -> None:
    loads = [2**i for i in range(len(attainments))]
    pts = [point(c, a) for c, a in zip(loads, attainments, strict=True)]
    knee = find_knee(pts, "closed", target)
    meets, fails = knee.meets, knee.fails
    if meets is not None:
        assert all(a >= target for c, a in zip(loads, attainments, strict=True) if c <= meets)
    if fails is not None:
        assert attainments[loads.index(fails)] < target
        assert fails == min(c for c, a in zip(loads, attainments, strict=True) if a < target)
        assert meets is None or loads.index(fails) == loads.index(meets) + 1
    else:
        assert meets == loads[-1]
    # improving one point never lowers the knee; a stricter target never raises it
    improved = list(attainments)
    i = which % len(improved)
    improved[i] = max(improved[i], better)
    knee2 = find_knee([point(c, a) for c, a in zip(loads, improved, strict=True)], "closed", target)
    assert (knee2.meets or 0) >= (meets or 0)
    stricter = find_knee(pts, "closed", min(1.0, target + 0.05))
    assert (stricter.meets or 0) <= (meets or 0)


# ------------------------------------------------------------------------------------------
# cap, peak, document, bisection


def grid_points() -> list[SweepPoint]:
    return [
        point(1, 1.0, tok_s=20.0),
        point(2, 1.0, tok_s=38.0),
        point(4, 1.0, tok_s=70.0),
        point(8, 0.995, tok_s=120.0, in_flight=7),  # think time: 7 of 8 users in flight
        point(16, 0.7, tok_s=180.0),
        point(32, 0.1, tok_s=150.0),
        point(64, 0.0, tok_s=400.0, valid=False),
        point(3.0, 1.0, mode="open", tok_s=90.0),
        point(6.0, 0.5, mode="open", tok_s=200.0),
    ]


def test_recommended_cap_reads_in_flight_at_the_knee_minus_margin() -> None:
    pts = grid_points()
    knee = find_knee(pts, "closed", 0.99)
    assert knee == Knee(8, 16)
    assert recommended_cap(pts, knee) == 7  # in flight at meets, not the user count
    assert recommended_cap(pts, knee, 1) == 4  # one grid step down: the point at 4
    assert recommended_cap(pts, knee, 2) == 2
    assert recommended_cap(pts, knee, 10) == 1  # never past the lowest tested load
    assert recommended_cap(pts, Knee(None, 1)) is None
    with pytest.raises(ValueError):
        recommended_cap(pts, knee, -1)


def test_recommended_cap_steps_skip_invalid_points_and_never_go_below_one() -> None:
    pts = [point(1, 1.0, in_flight=0), point(2, 1.0), point(4, 0.1, valid=False), point(8, 1.0)]
    knee = find_knee(pts, "closed", 0.99)
    assert knee == Knee(8, None)
    assert recommended_cap(pts, knee, 1) == 2  # 4 was invalid: one step down from 8 is 2
    assert recommended_cap(pts, knee, 2) == 1  # in_flight_max 0 reads as 1


def test_throughput_peak_over_valid_closed_points() -> None:
    pts = grid_points()
    # 64 is invalid and 6 rps is open loop: the closed peak is 16 users, beyond the knee
    assert throughput_peak(pts).to_json() == {"load": 16, "output_tok_s": 180.0, "mode": "closed"}
    only_open = [p for p in pts if p.load.mode == "open"]
    assert throughput_peak(only_open).to_json() == {"load": 6.0, "output_tok_s": 200.0,
                                                    "mode": "open"}
    assert throughput_peak([]).load is None


def test_sweep_document() -> None:
    pts = grid_points()
    doc = sweep_document(
        {"engine": "sglang", "model": "Qwen/Qwen3-8B"},
        {"system_prompt_tokens": 2048},
        SLO(),
        pts,
        1,
    ).to_json()
    assert doc["schema"] == "chatfleet.sweep/1"
    assert doc["slo"] == SLO().to_json()
    assert doc["knee"] == {"meets": 8, "fails": 16}
    assert doc["knee_rate"] == {"meets": 3.0, "fails": 6.0}
    assert doc["throughput_peak"]["load"] == 16
    assert doc["recommended_cap"] == 4
    assert len(doc["points"]) == len(pts)  # the invalid point stays
    assert doc["points"][6]["invalid_reason"] == "clock under floor"
    assert doc["target"]["engine"] == "sglang"
    assert doc["workload"] == {"system_prompt_tokens": 2048}


def test_bisect_next_closed() -> None:
    assert bisect_next(Knee(8, 16), [1, 2, 4, 8, 16], "closed") == 12
    assert bisect_next(Knee(4, 8), [4, 6, 8], "closed") == 5  # 6 tested (invalid)
    assert bisect_next(Knee(4, 5), [4, 5], "closed") is None  # one user wide
    assert bisect_next(Knee(None, 4), [4], "closed") == 2
    assert bisect_next(Knee(None, 1), [1], "closed") is None
    assert bisect_next(Knee(8, None), [8], "closed") is None


def test_bisect_next_open() -> None:
    assert bisect_next(Knee(1.0, 2.0), [1.0, 2.0], "open") == pytest.approx(1.5)
    assert bisect_next(Knee(2.0, 2.2), [2.0, 2.2], "open") is None  # 10%
    assert bisect_next(Knee(2.0, 2.3), [2.0, 2.3], "open") == pytest.approx(2.15)
    assert bisect_next(Knee(1.0, 2.0), [1.0, 1.5, 2.0], "open") == pytest.approx(1.25)
    assert bisect_next(Knee(None, 2.0), [2.0], "open") is None


def test_bisection_converges_on_a_step_knee() -> None:
    # the server meets the target up to 11 users: refining (8, 16) ends at (11, 12)
    tested = [1, 2, 4, 8, 16]
    for _ in range(10):
        pts = [point(c, 1.0 if c <= 11 else 0.5) for c in tested]
        knee = find_knee(pts, "closed", 0.99)
        nxt = bisect_next(knee, tested, "closed")
        if nxt is None:
            break
        tested.append(int(nxt))
    assert knee == Knee(11, 12)
