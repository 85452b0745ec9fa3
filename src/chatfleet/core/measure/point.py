"""One sweep point from its records: `summarize_point`, the one place a point is built.

The measurement window: requests scheduled (open loop) or sent (closed loop) in [start, end)
belong to it; the latency percentiles, attainment and goodput are over them. Throughput is
counted by arrival instead: output tok/s = output tokens that arrived in [start, end), from any
request (sent before the window or in it, whatever its outcome), per second of the window;
request rate = requests that finished (last token, outcome ok) in [start, end), per second.
Counting the tokens of the requests sent in the window would count a wave's tokens that arrive
after the window and miss those of a wave sent before it: closed loops that start together move
in waves.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from chatfleet.core.documents.sweep import (
    ClientBlock,
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
    out_tokens, finished = arrivals_in_window(records, (start, end))
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
                               failed=failed, admitted=admitted, finished_in_window=finished),
        output_tok_s=out_tokens / duration,
        request_rps=finished / duration,
        goodput_rps=met / duration,
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
        in_flight_max=f.in_flight_max,
        window_s=(start, end),
        time_scale=time_scale if time_scale != 1.0 else None,
        live=live,
        fleet=fleet,
    )
