"""Metrics math: per-token ITL, SLO verdicts, percentiles, goodput, the knee and the sweep document.

Definitions (docs/metrics.md states them for users). All times in a `RequestRecord` are seconds
on one clock (model time); figures in a sweep point are milliseconds (`*_ms`), seconds
(`duration_s`) or per second (`*_rps`, `output_tok_s`).

- Per-token ITL: when one stream chunk carries k tokens, its gap is split evenly over the k
  tokens, never one sample per chunk (`expand_chunks`).
- TTFT counts from the scheduled time in open loop (client-side queueing included) and from the
  send time in closed loop; both times are kept in the record.
- A request meets the target when TTFT <= 1,000 ms and its time per output token <= 100 ms.
  "100 ms per token for the P99 user" means: 99% of users see a first token within 1 s and a mean
  time per output token (TPOT = (e2e - TTFT) / (output tokens - 1)) within 100 ms. The per-request
  statistic is configurable (`mean` by default; `p99` of the request's own gaps, `max`) and always
  named in the results. The pooled P99 of all gaps (P99 ITL) is reported beside it.
- The measurement window: requests scheduled (open loop) or sent (closed loop) in
  [start, end) belong to it: the latency percentiles, attainment and goodput are over them.
  Throughput is counted by arrival instead: output tok/s = output tokens that arrived in
  [start, end), from any request (sent before the window or in it, whatever its outcome), per
  second of the window; request rate = requests that finished (last token, outcome ok) in
  [start, end), per second. Counting the tokens of the requests sent in the window would count
  a wave's tokens that arrive after the window and miss those of a wave sent before it: closed
  loops that start together move in waves. Goodput = the window's requests that meet the
  target, per second of the window. Attainment = their share of all requests of the window
  (shed and failed count as misses); admitted attainment = their share of the admitted ones.
  Every percentile is reported with the number of values behind it (`n`); a point with fewer
  than 200 requests is thin.
- The knee is a bracket, one per load mode: `meets` is the highest tested load that meets the
  target attainment together with every lower load, and `fails` the next tested load above it.
  Refinement bisects the bracket until it is one user (or 10% of the rate) wide. The recommended
  gateway cap is the in-flight count at the closed-loop knee's `meets` point, lowered by
  `cap_margin` steps of the grid. Throughput's peak is reported, never used for the limit.
- Invalid points stay in the results with their reason and are left out of the knee, the
  throughput peak and the cap.

Percentiles use linear interpolation between closest ranks (numpy's default `linear` method, as
SGLang's bench_serving and `vllm bench serve` use). Verdicts compare against the limits with a
tolerance of 1 ns (1e-6 ms) so that float rounding of a difference of times never flips a request
that sits exactly on a limit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
from numpy.typing import NDArray

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.records import RequestRecord

Mode = Literal["open", "closed"]
ItlStat = Literal["mean", "p99", "max"]

MODES: tuple[Mode, ...] = ("open", "closed")
ITL_STATS: tuple[ItlStat, ...] = ("mean", "p99", "max")
SCHEMA = "chatfleet.sweep/1"

# A point with fewer requests in its window than this is marked thin.
THIN_REQUESTS = 200
# Tolerance of every SLO comparison, in milliseconds (1 ns).
TOLERANCE_MS = 1e-6
# Tolerance of the attainment comparison in the knee.
_ATTAINMENT_TOL = 1e-12
# Refinement of the open-loop knee stops when the bracket is at most this share of the rate.
RATE_BRACKET_SHARE = 0.10

_FAILED_OUTCOMES = frozenset({"error", "timeout", "cancelled"})

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


def _zero_engine() -> dict[str, Any]:
    return {"max_running": 0, "max_queue": 0, "peak_token_usage": 0.0}


def _zero_gpu() -> dict[str, Any]:
    return {
        "sm_clock_mhz": {"p50": 0, "min": 0},
        "temp_c": {"max": 0},
        "thermal_slowdown_share": 0.0,
    }


def _zero_client() -> dict[str, Any]:
    return {"send_lag_ms_p99": 0.0, "loop_lag_ms_p99": 0.0}


def _check_mode(mode: str) -> Mode:
    if mode not in MODES:
        raise ValueError(f"mode must be 'open' or 'closed', not {mode!r}")
    return mode


# --------------------------------------------------------------------------------------------
# SLO


@dataclass(frozen=True, slots=True)
class SLO:
    """The latency target.

    A request meets it when TTFT <= `ttft_ms` and its per-request time-per-token statistic
    <= `tpot_ms`. `itl_stat` names that statistic: `mean` is TPOT = (e2e - TTFT) /
    (output tokens - 1); `p99` is the 99th percentile of the request's own inter-token gaps;
    `max` its largest gap. `attainment` is the share of the window's requests that must meet it
    (0.99: the P99 user).
    """

    ttft_ms: float = 1000.0
    tpot_ms: float = 100.0
    itl_stat: ItlStat = "mean"
    attainment: float = 0.99

    def __post_init__(self) -> None:
        if self.itl_stat not in ITL_STATS:
            raise ChatfleetError(f"itl_stat must be one of {ITL_STATS}, not {self.itl_stat!r}")
        if not (self.ttft_ms > 0 and math.isfinite(self.ttft_ms)):
            raise ChatfleetError(f"ttft_ms must be a positive number, not {self.ttft_ms!r}")
        if not (self.tpot_ms > 0 and math.isfinite(self.tpot_ms)):
            raise ChatfleetError(f"tpot_ms must be a positive number, not {self.tpot_ms!r}")
        if not 0.0 < self.attainment <= 1.0:
            raise ChatfleetError(f"attainment must be in (0, 1], not {self.attainment!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "itl_stat": self.itl_stat,
            "attainment": self.attainment,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SLO:
        default = cls()
        return cls(
            ttft_ms=float(data.get("ttft_ms", default.ttft_ms)),
            tpot_ms=float(data.get("tpot_ms", default.tpot_ms)),
            itl_stat=cast(ItlStat, data.get("itl_stat", default.itl_stat)),
            attainment=float(data.get("attainment", default.attainment)),
        )


# --------------------------------------------------------------------------------------------
# Per-token ITL from stream chunks


def expand_chunks(
    prev_time: float | None,
    chunk_times: Sequence[float],
    chunk_token_counts: Sequence[int],
) -> list[float]:
    """Per-token arrival times from stream chunks (per-token ITL split).

    A chunk carrying k tokens that arrives at t, after the previous output arrived at t0, yields
    the k token times t0 + (t - t0) * j / k for j = 1..k: its gap is split evenly over its k
    tokens, never one sample per chunk. The last token of a chunk is exactly at t.

    `prev_time` is the arrival time of the previous output token, for a caller that expands a
    stream chunk by chunk. With `prev_time=None` the first chunk is the request's first output:
    nothing arrived before it, so all its tokens are at its arrival time (that time is the
    TTFT; the gaps between its tokens are 0). Later chunks split their gap from the chunk before.

    Raises ValueError when the lengths differ, a count is below 1, a time is not finite, or the
    times (`prev_time` included) decrease.
    """
    if len(chunk_times) != len(chunk_token_counts):
        raise ValueError(
            f"{len(chunk_times)} chunk times but {len(chunk_token_counts)} token counts"
        )
    if len(chunk_times) == 0:
        return []
    times = np.asarray(chunk_times, dtype=np.float64)
    counts_raw = np.asarray(chunk_token_counts)
    if times.ndim != 1 or counts_raw.ndim != 1:
        raise ValueError("chunk times and token counts must be flat sequences")
    if counts_raw.dtype.kind not in "iu":
        raise ValueError("chunk token counts must be integers")
    counts = counts_raw.astype(np.int64)
    if np.any(counts < 1):
        raise ValueError("every chunk must carry at least 1 token")
    if not np.all(np.isfinite(times)):
        raise ValueError("chunk times must be finite")
    if prev_time is not None and not math.isfinite(prev_time):
        raise ValueError("prev_time must be finite")
    first_prev = times[0] if prev_time is None else float(prev_time)
    if first_prev > times[0] or np.any(np.diff(times) < 0):
        raise ValueError("chunk times must not decrease (prev_time included)")
    prev = np.empty_like(times)
    prev[0] = first_prev
    prev[1:] = times[:-1]
    chunk_of = np.repeat(np.arange(times.size), counts)
    ends = np.cumsum(counts)
    j = np.arange(1, int(ends[-1]) + 1) - np.repeat(ends - counts, counts)
    t0 = prev[chunk_of]
    t = times[chunk_of]
    k = counts[chunk_of]
    out = np.minimum(t0 + (t - t0) * j / k, t)
    out[ends - 1] = times
    return cast(list[float], out.tolist())


# --------------------------------------------------------------------------------------------
# Per-request figures (seconds)


def _origin(record: RequestRecord, mode: Mode) -> float:
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
    return first - _origin(record, _check_mode(mode))


def e2e(record: RequestRecord, mode: Mode) -> float | None:
    """End-to-end latency in seconds: last token arrival minus the same origin as `ttft`."""
    last = record.last_token_time
    if last is None:
        return None
    return float(last) - _origin(record, _check_mode(mode))


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
# Percentiles


def _lerp_indices(n: IntArray | int, q: float) -> tuple[IntArray, IntArray, FloatArray]:
    """numpy's `linear` method: virtual index (n - 1) * q, its floor and the next index (both
    clipped to n - 1) and the interpolation weight."""
    n_arr = np.asarray(n, dtype=np.int64)
    virtual = (n_arr - 1) * q
    lo = np.floor(virtual)
    gamma = virtual - lo
    lo_i = lo.astype(np.int64)
    above = virtual >= n_arr - 1
    lo_i = np.where(above, n_arr - 1, lo_i)
    hi_i = np.where(above, n_arr - 1, lo_i + 1)
    return lo_i, hi_i, np.asarray(gamma, dtype=np.float64)


def _lerp(a: FloatArray, b: FloatArray, t: FloatArray) -> FloatArray:
    """numpy's _lerp: a + (b - a) * t, computed from b when t >= 0.5."""
    diff = b - a
    return np.where(t >= 0.5, b - diff * (1.0 - t), a + diff * t)


def _key(p: float) -> str:
    return f"p{p:g}"


def _check_ps(ps: Iterable[float]) -> list[float]:
    out = [float(p) for p in ps]
    for p in out:
        if not 0.0 <= p <= 100.0:
            raise ValueError(f"percentile must be within [0, 100], not {p!r}")
    return out


def _percentiles_sorted(ordered: FloatArray, ps: Sequence[float], scale: float) -> dict[str, float]:
    n = int(ordered.size)
    out: dict[str, float] = {}
    for p in ps:
        if n == 0:
            out[_key(p)] = 0.0
            continue
        lo, hi, gamma = _lerp_indices(n, p / 100.0)
        value = _lerp(ordered[lo], ordered[hi], gamma)
        out[_key(p)] = float(value) * scale
    out["n"] = n
    return out


def percentiles(
    values: Sequence[float] | FloatArray,
    ps: Iterable[float] = (50.0, 90.0, 99.0),
    *,
    scale: float = 1.0,
) -> dict[str, float]:
    """Percentiles by linear interpolation between closest ranks (numpy.percentile's default
    `linear` method, as SGLang's and vLLM's bench tools compute them), multiplied by `scale`
    (1000 turns seconds into ms). Keys are "p50", "p90", "p99", ... (`f"p{p:g}"`), plus "n", the
    number of values. Empty input gives zeros and n = 0. NaN is refused (ValueError).
    """
    checked = _check_ps(ps)
    arr = np.asarray(values, dtype=np.float64).ravel()
    if np.isnan(arr).any():
        raise ValueError("percentiles of NaN are undefined")
    return _percentiles_sorted(np.sort(arr), checked, scale)


def _segment_quantile(
    values: FloatArray, starts: IntArray, counts: IntArray, q: float
) -> FloatArray:
    """The q-quantile (linear) of each segment values[starts[i] : starts[i] + counts[i]]
    (counts >= 1). Vectorised whatever the length mix: per power-of-two class of lengths, every
    segment is read as one row of a sliding window of the class's widest length, the values
    outside the segment are replaced by +inf, and the rows are sorted."""
    out = np.empty(counts.size, dtype=np.float64)
    if counts.size == 0:
        return out
    size = values.size
    width_class = np.frexp((counts - 1).astype(np.float64))[1]
    for cls in np.unique(width_class):
        rows = np.flatnonzero(width_class == cls)
        c = counts[rows]
        width = int(c.max())
        base = np.minimum(starts[rows], size - width)  # windows kept inside the array
        shift = (starts[rows] - base)[:, None]
        mat = np.lib.stride_tricks.sliding_window_view(values, width)[base]
        col = np.arange(width)[None, :]
        mat[(col < shift) | (col >= shift + c[:, None])] = np.inf
        mat.sort(axis=1)
        lo, hi, gamma = _lerp_indices(c, q)
        idx = np.arange(rows.size)
        out[rows] = _lerp(mat[idx, lo], mat[idx, hi], gamma)
    return out


# --------------------------------------------------------------------------------------------
# A sweep point


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


@dataclass(frozen=True, slots=True)
class _Figures:
    """Per-request arrays over the window's requests (NaN where a figure is undefined)."""

    ok: NDArray[np.bool_]
    ttft_s: FloatArray
    e2e_s: FloatArray
    tpot_s: FloatArray
    nout: IntArray
    gaps_sorted_s: FloatArray  # every per-token gap of the ok requests, sorted
    met: NDArray[np.bool_]
    in_flight_max: int


def _figures(members: Sequence[RequestRecord], slo: SLO, mode: Mode) -> _Figures:
    """Vectorised per-request figures and verdicts: the same arithmetic as `ttft`, `e2e`,
    `tpot`, `request_itl_stat`, `meets_slo` and `in_flight_max`, without per-token Python."""
    n = len(members)
    outcome = np.array([r.outcome for r in members], dtype=object)
    ok = outcome == "ok"
    shed = outcome == "shed"
    send = np.fromiter((r.send_time for r in members), np.float64, n)
    if mode == "open":
        origin = np.fromiter((r.scheduled_time for r in members), np.float64, n)
    else:
        origin = send
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
        joined = np.asarray(
            np.concatenate([token_lists[i] for i in order.tolist()]), dtype=np.float64
        )
        seg_lens = lens[order]
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
    ttft_s = first - origin
    e2e_s = last - origin
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
                per_req = _segment_quantile(gaps, seg_starts[multi], lens[ok_segs][multi] - 1, 0.99)
            stat_s[ok_segs[multi]] = per_req
    with np.errstate(invalid="ignore"):
        ttft_ok = ttft_s * 1000.0 <= slo.ttft_ms + TOLERANCE_MS
        stat_ok = stat_s * 1000.0 <= slo.tpot_ms + TOLERANCE_MS
    met = ok & ttft_ok & (~multi_tok | stat_ok)

    gaps.sort()  # in place; the NaN boundaries go last
    running = ~shed & ~np.isnan(last)
    flight = _in_flight_max_arrays(send[running], last[running], _replica_groups(members)[running])
    return _Figures(
        ok=ok,
        ttft_s=ttft_s,
        e2e_s=e2e_s,
        tpot_s=tpot_s,
        nout=nout,
        gaps_sorted_s=gaps[:n_gaps],
        met=met,
        in_flight_max=flight,
    )


def _tokens_between(record: RequestRecord, start: float, end: float) -> int:
    """Output tokens of `record` that arrived in [start, end) (a record without token times
    counts all its tokens at its first token's arrival)."""
    times = record.token_times
    n = len(times)
    if n == 0:
        first = record.first_token_time
        if first is None or not start <= first < end:
            return 0
        return output_token_count(record)
    if float(times[0]) >= start and float(times[n - 1]) < end:
        return n
    if float(times[n - 1]) < start or float(times[0]) >= end:
        return 0
    lo, hi = np.searchsorted(np.asarray(times, dtype=np.float64), (start, end), side="left")
    return int(hi - lo)


def arrivals_in_window(records: Iterable[RequestRecord],
                       window: tuple[float, float]) -> tuple[int, int]:
    """(output tokens that arrived in [start, end), ok requests whose last token arrived in
    it), over every record: the counts behind output_tok_s and request_rps."""
    start, end = float(window[0]), float(window[1])
    tokens = 0
    finished = 0
    for r in records:
        tokens += _tokens_between(r, start, end)
        if r.outcome == "ok":
            last = r.last_token_time
            if last is not None and start <= last < end:
                finished += 1
    return tokens, finished


def in_window(record: RequestRecord, window: tuple[float, float], mode: Mode) -> bool:
    """Window membership: scheduled time (open loop) or send time (closed loop) in
    [start, end)."""
    t = _origin(record, _check_mode(mode))
    return window[0] <= t < window[1]


def summarize_point(
    records: Sequence[RequestRecord],
    *,
    load: Mapping[str, Any],
    window: tuple[float, float],
    slo: SLO,
    mode: Mode,
    seed: int,
    flushed: bool,
    valid: bool = True,
    invalid_reason: str | None = None,
    engine: Mapping[str, Any] | None = None,
    gpu: Mapping[str, Any] | None = None,
    client: Mapping[str, Any] | None = None,
    time_scale: float = 1.0,
) -> dict[str, Any]:
    """One entry of the "points" list of a chatfleet.sweep/1 document.

    Records must already be in model time; `time_scale` (a simserver's `--time-scale`) is only
    recorded, and only when it is not 1.

    - The window's requests: scheduled (open) or sent (closed) in [start, end);
      duration_s = end - start.
    - requests: offered (all the window's requests), completed (ok), met_slo, shed, failed
      (error, timeout, cancelled), admitted (offered - shed); finished_in_window: ok requests
      of any send time whose last token arrived in the window.
    - goodput_rps = requests meeting the target / duration_s; attainment = met / offered (shed
      and failed count as misses); admitted_attainment = met / admitted. With no request, the
      shares are 0.
    - Throughput by arrival, over every record: output_tok_s = output tokens that arrived in
      [start, end) / duration_s (whatever the request's send time or outcome); request_rps =
      finished_in_window / duration_s (`arrivals_in_window`).
    - ttft_ms, tpot_ms, e2e_ms: percentiles over the completed requests that have the figure;
      itl_ms: over every per-token gap of the completed requests, pooled (p50, p90, p99, max).
      Each block carries "n".
    - cached_token_share = cached tokens / prompt tokens, over the completed requests.
    - in_flight_max: the most requests in flight at once, per replica, among the window's
      requests (see `in_flight_max`); the recommended cap reads it.
    - thin: fewer than 200 requests in the window. itl_stat names the per-request statistic;
      itl_estimated is true when any completed request's token times were estimated.
    - engine, gpu, client: the given blocks over the zero-valued defaults of the contract.
    """
    mode = _check_mode(mode)
    start, end = float(window[0]), float(window[1])
    if not (math.isfinite(start) and math.isfinite(end) and end > start):
        raise ValueError(f"window must be finite with end > start, not {window!r}")
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise ValueError(f"time_scale must be a positive number, not {time_scale!r}")
    if valid and invalid_reason is not None:
        raise ValueError("a valid point has no invalid_reason")
    load_out = _load_block(load, mode)

    duration = end - start
    if mode == "open":
        members = [r for r in records if start <= r.scheduled_time < end]
    else:
        members = [r for r in records if start <= r.send_time < end]
    f = _figures(members, slo, mode)
    ok_records = [r for r in members if r.outcome == "ok"]
    completed = len(ok_records)
    shed = sum(1 for r in members if r.outcome == "shed")
    failed = sum(1 for r in members if r.outcome in _FAILED_OUTCOMES)
    offered = len(members)
    admitted = offered - shed
    met = int(f.met.sum())
    out_tokens, finished = arrivals_in_window(records, (start, end))
    prompt = sum(r.prompt_tokens for r in ok_records)
    cached = sum(r.cached_tokens for r in ok_records)

    def ok_sorted(values: FloatArray) -> FloatArray:
        picked = values[f.ok]
        return np.sort(picked[~np.isnan(picked)])

    gaps_sorted = f.gaps_sorted_s
    itl = _percentiles_sorted(gaps_sorted, (50.0, 90.0, 99.0), 1000.0)
    itl_block = {
        "p50": itl["p50"],
        "p90": itl["p90"],
        "p99": itl["p99"],
        "max": float(gaps_sorted[-1]) * 1000.0 if gaps_sorted.size else 0.0,
        "n": itl["n"],
    }

    point: dict[str, Any] = {
        "load": load_out,
        "seed": seed,
        "flushed": flushed,
        "valid": valid,
        "invalid_reason": invalid_reason,
        "duration_s": duration,
        "requests": {
            "offered": offered,
            "completed": completed,
            "met_slo": met,
            "shed": shed,
            "failed": failed,
            "admitted": admitted,
            "finished_in_window": finished,
        },
        "output_tok_s": out_tokens / duration,
        "request_rps": finished / duration,
        "goodput_rps": met / duration,
        "attainment": met / offered if offered else 0.0,
        "admitted_attainment": met / admitted if admitted else 0.0,
        "ttft_ms": _percentiles_sorted(ok_sorted(f.ttft_s), (50.0, 90.0, 99.0), 1000.0),
        "itl_ms": itl_block,
        "tpot_ms": _percentiles_sorted(ok_sorted(f.tpot_s), (50.0, 99.0), 1000.0),
        "e2e_ms": _percentiles_sorted(ok_sorted(f.e2e_s), (50.0, 99.0), 1000.0),
        "cached_token_share": cached / prompt if prompt else 0.0,
        "engine": {**_zero_engine(), **(engine or {})},
        "gpu": {**_zero_gpu(), **(gpu or {})},
        "client": {**_zero_client(), **(client or {})},
        "itl_stat": slo.itl_stat,
        "itl_estimated": any(r.itl_estimated for r in ok_records),
        "thin": offered < THIN_REQUESTS,
        "in_flight_max": f.in_flight_max,
        "window_s": [start, end],
    }
    if time_scale != 1.0:
        point["time_scale"] = time_scale
    return point


def _load_block(load: Mapping[str, Any], mode: Mode) -> dict[str, Any]:
    given = load.get("mode", mode)
    if given != mode:
        raise ValueError(f"load mode {given!r} differs from mode {mode!r}")
    key = "concurrency" if mode == "closed" else "rate_rps"
    if key not in load:
        raise ValueError(f"a {mode}-loop load needs {key!r}")
    return {"mode": mode, **{k: v for k, v in load.items() if k != "mode"}}


# --------------------------------------------------------------------------------------------
# Knee, peak, cap, sweep document


def load_value(point: Mapping[str, Any]) -> float:
    """A point's load: its concurrency (closed loop) or its rate in requests/s (open loop)."""
    load = point["load"]
    key = "concurrency" if load["mode"] == "closed" else "rate_rps"
    return cast(float, load[key])


def _valid_by_load(
    points: Iterable[Mapping[str, Any]], mode: Mode | None
) -> dict[float, list[Mapping[str, Any]]]:
    grouped: dict[float, list[Mapping[str, Any]]] = {}
    for p in points:
        if not p.get("valid", False):
            continue
        if mode is not None and p["load"]["mode"] != mode:
            continue
        grouped.setdefault(load_value(p), []).append(p)
    return dict(sorted(grouped.items()))


def find_knee(points: Iterable[Mapping[str, Any]], mode: Mode, attainment: float) -> dict[str, Any]:
    """The knee bracket of one load mode: {"meets": load or None, "fails": load or None}.

    Over the valid points of that mode, sorted by load (concurrency in closed loop, rate_rps in
    open loop): `meets` is the highest tested load that meets the target attainment together
    with every lower tested load, and `fails` the next tested load above it (None when there is
    none). When the lowest tested load already fails, `meets` is None and `fails` is that load.
    A load tested several times (repeats with new seeds) meets only when every valid run of it
    does.
    """
    mode = _check_mode(mode)
    meets: float | None = None
    fails: float | None = None
    for value, group in _valid_by_load(points, mode).items():
        if all(float(p["attainment"]) >= attainment - _ATTAINMENT_TOL for p in group):
            meets = value
        else:
            fails = value
            break
    return {"meets": meets, "fails": fails}


def throughput_peak(points: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The valid point of highest output_tok_s among the closed-loop points (all valid points when
    there is no valid closed-loop point): {"load", "output_tok_s", "mode"}. Ties go to the lower
    load. Reported beside the knee, never used for the limit. Load None when no point is valid.
    """
    pts = list(points)
    grouped = _valid_by_load(pts, "closed") or _valid_by_load(pts, None)
    best: Mapping[str, Any] | None = None
    for group in grouped.values():  # by increasing load: a tie keeps the lower load
        for p in group:
            if best is None or float(p["output_tok_s"]) > float(best["output_tok_s"]):
                best = p
    if best is None:
        return {"load": None, "output_tok_s": 0.0, "mode": None}
    return {
        "load": load_value(best),
        "output_tok_s": float(best["output_tok_s"]),
        "mode": best["load"]["mode"],
    }


def recommended_cap(
    points: Iterable[Mapping[str, Any]],
    knee: Mapping[str, Any],
    cap_margin_steps: int = 0,
) -> int | None:
    """The gateway's per-replica cap: requests in flight at the closed-loop knee.

    The grid is the tested concurrencies of the valid closed-loop points. The cap is the
    `in_flight_max` of the knee's `meets` point, or, with `cap_margin_steps` = m > 0, of the
    tested concurrency m positions below `meets` in the grid (the lowest tested one when the
    grid is shorter). Never below 1. With repeats, the lowest in_flight_max of that load's valid
    runs; a point without in_flight_max reads its concurrency. None when the closed knee has no
    `meets`.
    """
    if cap_margin_steps < 0:
        raise ChatfleetError("cap_margin_steps must be >= 0")
    meets = knee.get("meets")
    if meets is None:
        return None
    grouped = _valid_by_load(points, "closed")
    grid = list(grouped)
    if meets not in grouped:
        raise ValueError(f"knee meets={meets!r} is not a tested valid closed-loop concurrency")
    at = grid[max(0, grid.index(meets) - cap_margin_steps)]
    caps = [
        p["in_flight_max"] if p.get("in_flight_max") is not None else load_value(p)
        for p in grouped[at]
    ]
    return max(1, int(min(caps)))


def sweep_document(
    target: Mapping[str, Any],
    workload: Mapping[str, Any],
    slo: SLO,
    points: Sequence[Mapping[str, Any]],
    cap_margin: int = 0,
) -> dict[str, Any]:
    """The whole chatfleet.sweep/1 document: target, workload, slo, every point (invalid ones
    included, with their reason), the closed-loop knee ("knee"), the open-loop knee in
    requests/s ("knee_rate"), the throughput peak and the recommended cap (lowered by
    `cap_margin` grid steps, recorded as "cap_margin"). Invalid points are left out of the knee,
    the peak and the cap."""
    pts = [dict(p) for p in points]
    knee = find_knee(pts, "closed", slo.attainment)
    return {
        "schema": SCHEMA,
        "target": dict(target),
        "workload": dict(workload),
        "slo": slo.to_json(),
        "points": pts,
        "knee": knee,
        "knee_rate": find_knee(pts, "open", slo.attainment),
        "throughput_peak": throughput_peak(pts),
        "recommended_cap": recommended_cap(pts, knee, cap_margin),
        "cap_margin": cap_margin,
    }


def bisect_next(knee: Mapping[str, Any], tested_loads: Iterable[float], mode: Mode) -> float | None:
    """The next load to test to refine a knee bracket, or None when it is narrow enough.

    Closed loop: the untested whole concurrency nearest the middle of (meets, fails) (the lower
    one on a tie); None when the bracket is at most 1 user wide. A missing `meets` counts as 0
    users (nothing to serve meets any target), so a failing lowest load is bisected down to 1.
    Open loop: the middle rate, or the middle of one half when the middle was already tested;
    None when fails - meets <= 10% of the meets rate, or when `meets` is missing (an open
    bracket calls for a lower grid, not bisection). None whenever `fails` is missing.
    """
    mode = _check_mode(mode)
    fails = knee.get("fails")
    meets = knee.get("meets")
    if fails is None:
        return None
    tested = [float(x) for x in tested_loads]

    def untested(x: float) -> bool:
        return all(not math.isclose(x, t, rel_tol=1e-9, abs_tol=1e-12) for t in tested)

    if mode == "closed":
        lo = 0 if meets is None else int(meets)
        hi = int(fails)
        if hi - lo <= 1:
            return None
        mid2 = lo + hi  # twice the middle
        candidates = sorted(range(lo + 1, hi), key=lambda c: (abs(2 * c - mid2), c))
        for c in candidates:
            if untested(c):
                return c
        return None
    if meets is None:
        return None
    low, high = float(meets), float(fails)
    if high - low <= RATE_BRACKET_SHARE * low * (1.0 + 1e-9):  # 1e-9: float rounding
        return None
    mid = (low + high) / 2.0
    for rate in (mid, (low + mid) / 2.0, (mid + high) / 2.0):
        if untested(rate):
            return rate
    return None
