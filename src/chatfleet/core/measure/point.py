"""One sweep point from its records: `summarize_point`, the one place a point is built.

The measurement window: requests scheduled (open loop) or sent (closed loop) in [start, end)
belong to it; the latency percentiles and attainment are over them. Rates are counted by
arrival instead, over every record: output tok/s = output tokens that arrived in [start, end),
from any request (sent before the window or in it, whatever its outcome), per second of the
window; request rate = the ok requests' shares of their output tokens that arrived in
[start, end), summed, per second (a request whose 128 tokens arrive 32 before the window's end
and 96 after it counts 0.25); goodput = the same sum over the ok requests that meet the target.
Counting whole requests by their send or their last token would count a wave's requests that
finish after the window, or miss those of a wave sent before it: closed loops that start
together move in waves. The shares count requests the way tokens are counted, so request_rps x
the mean answer length is output_tok_s when every answer is whole, and both are exact over a
long window whatever its phase.

`window_cycles` says how many closed-loop cycles (a user's send to its next send) the window
held: request_rps x duration / users (Little's law). A window that holds k cycles of a load
that moves in waves can be off by up to 1/k of a rate with its phase (one wave more or fewer in
it); under `MIN_WINDOW_CYCLES` the point is marked `few_cycles`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from chatfleet.core.documents.sweep import (
    ClientBlock,
    ClosedLoad,
    EngineBlock,
    FleetBlock,
    GpuBlock,
    LiveRun,
    Load,
    Mode,
    Quantiles,
    RequestCounts,
    SweepPoint,
    check_mode,
)
from chatfleet.core.measure.percentiles import FloatArray, percentiles_sorted
from chatfleet.core.measure.request import ITL_PERCENTILES, figures, origin, output_token_count
from chatfleet.core.records import RequestRecord
from chatfleet.core.slo import SLO

# A point with fewer requests in its window than this is marked thin.
THIN_REQUESTS = 200
# A closed-loop point whose window held fewer cycles than this is marked few_cycles: its
# rates may move by up to 1 / cycles (10% here) with the window's phase.
MIN_WINDOW_CYCLES = 10.0
FAILED_OUTCOMES = frozenset({"error", "timeout", "cancelled"})


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


def _token_total(record: RequestRecord) -> int:
    """The output tokens a share is of: the token times held (a record without them: its
    output token count)."""
    return len(record.token_times) or output_token_count(record)


def share_in_window(record: RequestRecord, window: tuple[float, float]) -> float:
    """The share of `record`'s output tokens that arrived in [start, end): what an ok request
    counts for in request_rps (0 without output tokens)."""
    n = _token_total(record)
    if n == 0:
        return 0.0
    return _tokens_between(record, float(window[0]), float(window[1])) / n


@dataclass(frozen=True, slots=True)
class Arrivals:
    """What arrived in a window, over every record: output tokens, the ok requests whose last
    token arrived in it (`finished`), and each ok request with a share of its tokens in it
    (`shares`: (record, share > 0))."""

    tokens: int
    finished: int
    shares: list[tuple[RequestRecord, float]]


def arrivals_in_window(records: Iterable[RequestRecord],
                       window: tuple[float, float]) -> Arrivals:
    """The counts behind output_tok_s, request_rps and goodput_rps (`summarize_point`)."""
    start, end = float(window[0]), float(window[1])
    tokens = 0
    finished = 0
    shares: list[tuple[RequestRecord, float]] = []
    for r in records:
        got = _tokens_between(r, start, end)
        tokens += got
        if r.outcome != "ok":
            continue
        last = r.last_token_time
        if last is not None and start <= last < end:
            finished += 1
        if got:
            shares.append((r, got / _token_total(r)))
    return Arrivals(tokens, finished, shares)


def window_cycles(load: Load, request_rps: float, duration: float) -> float | None:
    """How many closed-loop cycles the window held: the requests each user sent in it, by the
    share count (request_rps x duration / users); None for an open loop."""
    if not isinstance(load, ClosedLoad) or load.concurrency <= 0:
        return None
    return request_rps * duration / load.concurrency


def in_window(record: RequestRecord, window: tuple[float, float], mode: Mode) -> bool:
    """Window membership: scheduled time (open loop) or send time (closed loop) in
    [start, end)."""
    t = origin(record, check_mode(mode))
    return window[0] <= t < window[1]


def _quantiles(ordered: FloatArray, ps: Sequence[float], *, with_max: bool = False) -> Quantiles:
    """The block of one figure (seconds in, ms out) over its sorted values (or values
    partitioned at `ranks_read(n, ps)`, which holds the same at the ranks read)."""
    q = percentiles_sorted(ordered, ps, 1000.0)
    return Quantiles(p50=q["p50"], p90=q.get("p90"), p99=q["p99"],
                     max=(float(ordered[-1]) * 1000.0 if ordered.size else 0.0) if with_max
                     else None,
                     n=int(q["n"]))


def _met_share(arrived: Arrivals, members: Sequence[RequestRecord], met: NDArray[np.bool_],
               slo: SLO, mode: Mode) -> float:
    """The shares in the window of the ok requests that meet the target: the window's own
    requests' verdicts (`met`, in `members` order), and for the others (sent before the
    window, their tokens arriving in it) their verdicts over the same arithmetic."""
    verdict = {id(r): bool(m) for r, m in zip(members, met.tolist(), strict=True)}
    others = [r for r, _ in arrived.shares if id(r) not in verdict]
    if others:
        verdict.update(zip(map(id, others), figures(others, slo, mode).met.tolist(),
                           strict=True))
    return math.fsum(share for r, share in arrived.shares if verdict[id(r)])


def summarize_point(
    records: Sequence[RequestRecord],
    *,
    load: Load,
    window: tuple[float, float],
    slo: SLO,
    seed: int,
    flushed: bool,
    mode: Mode | None = None,
    invalid_reasons: Sequence[str] = (),
    engine: EngineBlock | None = None,
    gpu: GpuBlock | None = None,
    client: ClientBlock | None = None,
    time_scale: float = 1.0,
    live: LiveRun | None = None,
    fleet: FleetBlock | None = None,
) -> SweepPoint:
    """One entry of the "points" list of a chatfleet.sweep/1 document.

    Records must already be in model time; `time_scale` (a simserver's `--time-scale`) is only
    recorded, and only when it is not 1. `mode`, when given, must be the load's.

    - The window's requests: scheduled (open) or sent (closed) in [start, end);
      duration_s = end - start.
    - requests: offered (all the window's requests), completed (ok), met_slo, shed, failed
      (error, timeout, cancelled), admitted (offered - shed); finished_in_window: ok requests
      of any send time whose last token arrived in the window.
    - attainment = met / offered (shed and failed count as misses); admitted_attainment = met
      / admitted. With no request, the shares are 0.
    - Rates by arrival, over every record (`arrivals_in_window`): output_tok_s = output tokens
      that arrived in [start, end) / duration_s (whatever the request's send time or outcome);
      request_rps = the sum over ok requests of the share of their output tokens that arrived
      in [start, end) (`share_in_window`) / duration_s; goodput_rps = the same sum over the ok
      requests that meet the target (the verdict of a request sent before the window is
      computed as a window request's) / duration_s.
    - window_cycles (closed loop): request_rps x duration_s / users; few_cycles: under
      `MIN_WINDOW_CYCLES` (the rates may move by up to 1 / window_cycles with the phase).
    - ttft_ms, tpot_ms, e2e_ms: percentiles over the completed requests that have the figure;
      itl_ms: over every per-token gap of the completed requests, pooled (p50, p90, p99, max).
      Each block carries "n".
    - cached_token_share = cached tokens / prompt tokens, over the completed requests.
    - in_flight_max: the most requests in flight at once, per replica, among the window's
      requests (see `in_flight_max`); the recommended cap reads it.
    - thin: fewer than 200 requests in the window. itl_stat names the per-request statistic;
      itl_estimated is true when any completed request's token times were estimated.
    - valid: no invalid reason (`core.measure.validity` builds them); invalid_reason: the
      reasons joined by "; ".
    - engine, gpu, client: the given blocks, else the contract's zero-valued ones; `live` (a
      live run's extras) and `fleet` (a fleet's settings and decisions) when given.
    """
    mode = load.mode if mode is None else check_mode(mode)
    if mode != load.mode:
        raise ValueError(f"load mode {load.mode!r} differs from mode {mode!r}")
    start, end = float(window[0]), float(window[1])
    if not (math.isfinite(start) and math.isfinite(end) and end > start):
        raise ValueError(f"window must be finite with end > start, not {window!r}")
    if not (time_scale > 0 and math.isfinite(time_scale)):
        raise ValueError(f"time_scale must be a positive number, not {time_scale!r}")

    duration = end - start
    if mode == "open":
        members = [r for r in records if start <= r.scheduled_time < end]
    else:
        members = [r for r in records if start <= r.send_time < end]
    f = figures(members, slo, mode)
    ok_records = [r for r in members if r.outcome == "ok"]
    completed = len(ok_records)
    shed = sum(1 for r in members if r.outcome == "shed")
    failed = sum(1 for r in members if r.outcome in FAILED_OUTCOMES)
    offered = len(members)
    admitted = offered - shed
    met = int(f.met.sum())
    arrived = arrivals_in_window(records, (start, end))
    goodput_count = _met_share(arrived, members, f.met, slo, mode)
    request_count = math.fsum(share for _, share in arrived.shares)
    cycles = window_cycles(load, request_count / duration, duration)
    prompt = sum(r.prompt_tokens for r in ok_records)
    cached = sum(r.cached_tokens for r in ok_records)

    def ok_sorted(values: FloatArray) -> FloatArray:
        picked = values[f.ok]
        return np.sort(picked[~np.isnan(picked)])

    reasons = [r for r in invalid_reasons if r]
    return SweepPoint(
        load=load,
        seed=seed,
        flushed=flushed,
        valid=not reasons,
        invalid_reason="; ".join(reasons) or None,
        duration_s=duration,
        requests=RequestCounts(offered=offered, completed=completed, met_slo=met, shed=shed,
                               failed=failed, admitted=admitted,
                               finished_in_window=arrived.finished),
        output_tok_s=arrived.tokens / duration,
        request_rps=request_count / duration,
        goodput_rps=goodput_count / duration,
        attainment=met / offered if offered else 0.0,
        admitted_attainment=met / admitted if admitted else 0.0,
        ttft_ms=_quantiles(ok_sorted(f.ttft_s), (50.0, 90.0, 99.0)),
        itl_ms=_quantiles(f.gaps_ranked_s, ITL_PERCENTILES, with_max=True),
        tpot_ms=_quantiles(ok_sorted(f.tpot_s), (50.0, 99.0)),
        e2e_ms=_quantiles(ok_sorted(f.e2e_s), (50.0, 99.0)),
        cached_token_share=cached / prompt if prompt else 0.0,
        engine=engine or EngineBlock(),
        gpu=gpu or GpuBlock(),
        client=client or ClientBlock(),
        itl_stat=slo.itl_stat,
        itl_estimated=any(r.itl_estimated for r in ok_records),
        thin=offered < THIN_REQUESTS,
        window_cycles=cycles,
        few_cycles=None if cycles is None else cycles < MIN_WINDOW_CYCLES,
        in_flight_max=f.in_flight_max,
        window_s=(start, end),
        time_scale=time_scale if time_scale != 1.0 else None,
        live=live,
        fleet=fleet,
    )
