"""Per-request figures: TTFT, e2e, TPOT, the per-request ITL statistic, the SLO verdict and the
requests in flight.

Two forms of the same arithmetic, kept side by side:

- **the reference definitions** (`ttft`, `e2e`, `tpot`, `itl_gaps`, `request_itl_stat`,
  `meets_slo`): one record at a time, in plain Python. They are the specification: read them
  to know what a figure means. Nothing in a sweep calls them;
- **the vectorised form** (`figures`): the same figures and verdicts for all of a point's
  records at once, in numpy, without per-token Python. `summarize_point` uses it.
  tests/core/test_metrics.py checks on random records that the two agree.

All times are seconds on one clock (model time).
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
from numpy.typing import NDArray

from chatfleet.core.documents.sweep import Mode, check_mode
from chatfleet.core.measure.percentiles import FloatArray, IntArray, ranks_read, segment_quantile
from chatfleet.core.records import RequestRecord
from chatfleet.core.slo import ITL_STATS, SLO, TOLERANCE_MS, ItlStat

# --------------------------------------------------------------------------------------------
# The reference definitions (scalar: one record at a time)

def origin(record: RequestRecord, mode: Mode) -> float:
    return float(record.scheduled_time if mode == "open" else record.send_time)


def first_token_time(record: RequestRecord) -> float | None:
    """The first output's arrival: `record.first_token_time`, else the first token time."""
    if record.first_token_time is not None:
        return float(record.first_token_time)
    if len(record.token_times) > 0:
        return float(record.token_times[0])
    return None


def output_token_count(record: RequestRecord) -> int:
    """Output tokens: `record.output_tokens`, or the number of token times when that is 0."""
    return record.output_tokens if record.output_tokens > 0 else len(record.token_times)


def ttft(record: RequestRecord, mode: Mode) -> float | None:
    """Time to first token in seconds: first output arrival minus the scheduled time (open loop,
    client-side queueing included) or the send time (closed loop). None without any output."""
    first = first_token_time(record)
    if first is None:
        return None
    return first - origin(record, check_mode(mode))


def e2e(record: RequestRecord, mode: Mode) -> float | None:
    """End-to-end latency in seconds: last token arrival minus the same origin as `ttft`."""
    last = record.last_token_time
    if last is None:
        return None
    return float(last) - origin(record, check_mode(mode))


def tpot(record: RequestRecord, mode: Mode) -> float | None:
    """Time per output token in seconds: TPOT = (e2e - TTFT) / (output tokens - 1).

    None for fewer than 2 output tokens or without any output.
    """
    n = output_token_count(record)
    first = ttft(record, mode)
    end = e2e(record, mode)
    if n < 2 or first is None or end is None:
        return None
    return (end - first) / (n - 1)


def itl_gaps(record: RequestRecord) -> FloatArray:
    """The request's per-token gaps in seconds: the differences of consecutive token times
    (first token included in the times, so n tokens give n - 1 gaps)."""
    times = np.asarray(record.token_times, dtype=np.float64)
    if times.size < 2:
        return np.zeros(0, dtype=np.float64)
    return np.diff(times)


def request_itl_stat(record: RequestRecord, stat: ItlStat, mode: Mode) -> float | None:
    """The per-request time-per-token statistic in seconds.

    `mean`: TPOT. `p99`: the 99th percentile (linear interpolation) of the request's own gaps.
    `max`: its largest gap. When the record holds fewer than two token times but counts at least
    two output tokens, `p99` and `max` fall back to TPOT. None when undefined (fewer than 2
    output tokens, or no output).
    """
    if stat not in ITL_STATS:
        raise ValueError(f"itl_stat must be one of {ITL_STATS}, not {stat!r}")
    mean = tpot(record, mode)
    if stat == "mean" or mean is None:
        return mean
    gaps = itl_gaps(record)
    if gaps.size == 0:
        return mean
    if stat == "max":
        return float(gaps.max())
    return float(np.percentile(gaps, 99.0))


def meets_slo(record: RequestRecord, slo: SLO, mode: Mode) -> bool:
    """Whether one request meets the target.

    It does when its outcome is ok, TTFT <= `slo.ttft_ms` (from the scheduled time in open
    loop, the send time in closed loop), and its per-request statistic (`slo.itl_stat`: mean =
    TPOT, p99 = 99th percentile of its own gaps, max = its largest gap) <= `slo.tpot_ms`. A
    request with fewer than 2 output tokens passes the per-token part. An ok request without any
    output has no TTFT and does not meet it.
    """
    if record.outcome != "ok":
        return False
    first = ttft(record, mode)
    if first is None or not first * 1000.0 <= slo.ttft_ms + TOLERANCE_MS:
        return False
    if output_token_count(record) < 2:
        return True
    stat = request_itl_stat(record, slo.itl_stat, mode)
    return stat is not None and stat * 1000.0 <= slo.tpot_ms + TOLERANCE_MS


# --------------------------------------------------------------------------------------------
# Requests in flight

def _in_flight_max_arrays(send: FloatArray, last: FloatArray, group: IntArray) -> int:
    if send.size == 0:
        return 0
    times = np.concatenate((send, np.maximum(last, send)))
    deltas = np.concatenate((np.ones(send.size, np.int64), np.full(send.size, -1, np.int64)))
    groups = np.concatenate((group, group))
    order = np.lexsort((deltas, times, groups))
    # Each group's deltas sum to 0, so one running sum restarts at 0 at every group boundary;
    # at equal times ends (-1) come before starts (+1).
    return int(np.cumsum(deltas[order]).max())


def _replica_groups(records: Sequence[RequestRecord]) -> IntArray:
    replicas = [r.replica for r in records]
    if len(set(replicas)) <= 1:
        return np.zeros(len(replicas), dtype=np.int64)
    ids: dict[str | None, int] = {}
    return np.fromiter((ids.setdefault(x, len(ids)) for x in replicas), np.int64, len(replicas))


def in_flight_max(records: Sequence[RequestRecord]) -> int:
    """The largest number of requests in flight at once, per replica, over the records.

    A request is in flight from its send time to its last token's arrival, [send, last): one
    that ends at the instant another is sent does not overlap it (a closed-loop user without
    think time counts once). Shed requests never ran and requests without any output have no
    known end: both are left out. Records are grouped by `replica` (None is one group) and the
    largest per-replica maximum is returned (with one replica, the plain maximum).
    """
    kept = [r for r in records if r.outcome != "shed" and r.last_token_time is not None]
    send = np.fromiter((r.send_time for r in kept), np.float64, len(kept))
    last = np.fromiter((cast(float, r.last_token_time) for r in kept), np.float64, len(kept))
    return _in_flight_max_arrays(send, last, _replica_groups(kept))


# --------------------------------------------------------------------------------------------
# The vectorised form (all of a point's records at once): what summarize_point computes with

# the percentiles of every per-token gap that a point reports (its itl_ms block, with the max)
ITL_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True, slots=True)
class Figures:
    """Per-request arrays over the window's requests (NaN where a figure is undefined)."""

    ok: NDArray[np.bool_]
    ttft_s: FloatArray
    e2e_s: FloatArray
    tpot_s: FloatArray
    nout: IntArray
    # every per-token gap of the ok requests, partitioned at ranks_read(n, ITL_PERCENTILES):
    # at those ranks (the last included) the values of a full sort, for percentiles_sorted
    gaps_ranked_s: FloatArray
    met: NDArray[np.bool_]
    in_flight_max: int


def _joined_times(token_lists: list[Sequence[float]], total: int) -> FloatArray:
    """The token times of the lists, one after the other, as a new writable array. The twin's
    records hold array('d') (one copy of their bytes); other sequences are read in one pass
    over their floats (np.concatenate would first discover each list's type and shape, element
    by element: twice the time for the same values)."""
    arrays = [t for t in token_lists if isinstance(t, array) and t.typecode == "d"]
    if len(arrays) == len(token_lists):
        return np.frombuffer(bytearray().join(arrays), np.float64)
    return np.fromiter(itertools.chain.from_iterable(token_lists), np.float64, total)


def figures(members: Sequence[RequestRecord], slo: SLO, mode: Mode) -> Figures:
    """Vectorised per-request figures and verdicts: the same arithmetic as `ttft`, `e2e`,
    `tpot`, `request_itl_stat`, `meets_slo` and `in_flight_max`, without per-token Python."""
    n = len(members)
    outcome = np.array([r.outcome for r in members], dtype=object)
    ok = outcome == "ok"
    shed = outcome == "shed"
    send = np.fromiter((r.send_time for r in members), np.float64, n)
    if mode == "open":
        t_origin = np.fromiter((r.scheduled_time for r in members), np.float64, n)
    else:
        t_origin = send
    # float dtype turns None into NaN
    first_field = np.array([r.first_token_time for r in members], dtype=np.float64)
    out_field = np.fromiter((r.output_tokens for r in members), np.int64, n)
    token_lists = [r.token_times for r in members]
    lens = np.fromiter((len(t) for t in token_lists), np.int64, n)

    # Token times of the ok requests first, then of the others: the ok requests' gaps are one
    # contiguous prefix of the differences, with no copy. Big temporaries are kept to a minimum
    # (each fresh 4 MB array costs page faults comparable to the arithmetic on it).
    has_times = lens > 0
    order = np.concatenate((np.flatnonzero(has_times & ok), np.flatnonzero(has_times & ~ok)))
    n_ok_seg = int(np.count_nonzero(has_times & ok))
    first = first_field.copy()
    last = first_field.copy()
    gaps = np.zeros(0, dtype=np.float64)  # ok requests' gaps, NaN between two requests
    seg_starts = np.zeros(0, dtype=np.int64)
    if order.size:
        seg_lens = lens[order]
        joined = _joined_times([token_lists[i] for i in order.tolist()], int(seg_lens.sum()))
        ends = np.cumsum(seg_lens)
        starts = ends - seg_lens
        first[order] = np.where(np.isnan(first_field[order]), joined[starts], first_field[order])
        last[order] = joined[ends - 1]
        if n_ok_seg:
            ok_end = int(ends[n_ok_seg - 1])
            # the differences in place, over the joined times already read: one big array
            # fewer (numpy gives the result of a copy when the operands overlap)
            gaps = joined[: ok_end - 1]
            np.subtract(joined[1:ok_end], gaps, out=gaps)
            gaps[ends[: n_ok_seg - 1] - 1] = np.nan  # from one request's last token to the next
            seg_starts = starts[:n_ok_seg]
    n_gaps = int(np.sum(lens[ok] - 1, where=lens[ok] > 0))

    nout = np.where(out_field > 0, out_field, lens)
    ttft_s = first - t_origin
    e2e_s = last - t_origin
    multi_tok = nout >= 2
    tpot_s = np.full(n, np.nan)
    np.divide(e2e_s - ttft_s, (nout - 1).astype(np.float64), out=tpot_s, where=multi_tok)

    if slo.itl_stat == "mean":
        stat_s = tpot_s
    else:
        stat_s = tpot_s.copy()  # the fallback where fewer than two token times are held
        ok_segs = order[:n_ok_seg]
        multi = lens[ok_segs] >= 2
        if np.any(multi):
            if slo.itl_stat == "max":
                # fmax skips the NaN boundaries (and the NaN of single-token requests between)
                per_req = np.fmax.reduceat(gaps, seg_starts[multi])
            else:
                per_req = segment_quantile(gaps, seg_starts[multi], lens[ok_segs][multi] - 1, 0.99)
            stat_s[ok_segs[multi]] = per_req
    with np.errstate(invalid="ignore"):
        ttft_ok = ttft_s * 1000.0 <= slo.ttft_ms + TOLERANCE_MS
        stat_ok = stat_s * 1000.0 <= slo.tpot_ms + TOLERANCE_MS
    met = ok & ttft_ok & (~multi_tok | stat_ok)

    # in place; the NaN boundaries order last, as in a sort. A partition at the ranks the
    # percentiles read is a quarter of a sort's time over a point's million gaps
    if n_gaps:
        gaps.partition(ranks_read(n_gaps, ITL_PERCENTILES))
    running = ~shed & ~np.isnan(last)
    flight = _in_flight_max_arrays(send[running], last[running], _replica_groups(members)[running])
    return Figures(
        ok=ok,
        ttft_s=ttft_s,
        e2e_s=e2e_s,
        tpot_s=tpot_s,
        nout=nout,
        gaps_ranked_s=gaps[:n_gaps],
        met=met,
        in_flight_max=flight,
    )
