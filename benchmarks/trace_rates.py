"""A window's rates from a traced server: the ground truth the sweep's figures are checked
against (harness_accuracy.py, sweep_client_lag.py).

From the simserver's trace (each token's write, the server's CLOCK_MONOTONIC), put on the
client's clock by `t0` (the client clock's zero on the same monotonic clock), for the client's
records matched by the engine's response id:
- output tok/s: the tokens the server wrote in the window;
- request_rps: each ok request's share of its tokens written in the window;
- goodput_rps: the same over the ok requests that meet the target on the trace's times, TTFT
  from the client's send time (closed loop) to the first token's write, TPOT from the writes;
- beside them, for contrast, the counts chatfleet used before issue 21: the ok requests whose
  last token was written in the window, and the window's requests (sent in it) that meet it.

This is a separate reading of docs/metrics.md's definitions (plain loops over the trace), not
the sweep's `summarize_point`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from chatfleet.core.records import RequestRecord
from chatfleet.core.slo import SLO, TOLERANCE_MS


@dataclass(frozen=True)
class TraceRates:
    output_tok_s: float
    request_rps: float
    goodput_rps: float
    finished_rps: float  # whole requests by their last token (the count before issue 21)
    sent_met_rps: float  # the window's requests that met the target (goodput before)
    matched: int


def trace_rates(records: Iterable[RequestRecord], writes: Mapping[str, np.ndarray], t0: float,
                window: tuple[float, float], slo: SLO | None = None, scale: float = 1.0
                ) -> TraceRates:
    """The truth over `records` matched to `writes` (rid -> each token's write, monotonic s)
    by `response_id`; `scale` converts wall seconds to the client's model seconds."""
    slo = slo or SLO()
    start, end = window
    duration = end - start
    tokens = requests = goodput = finished = sent_met = 0.0
    matched = 0
    for r in records:
        w = writes.get(r.response_id or "")
        if w is None or w.size == 0:
            continue
        matched += 1
        t = (w - t0) * scale
        got = int(np.count_nonzero((t >= start) & (t < end)))
        tokens += got
        if r.outcome != "ok":
            continue
        ttft_ms = (t[0] - r.send_time) * 1000.0
        tpot_ms = (t[-1] - t[0]) / (t.size - 1) * 1000.0 if t.size > 1 else 0.0
        met = (ttft_ms <= slo.ttft_ms + TOLERANCE_MS
               and (t.size < 2 or tpot_ms <= slo.tpot_ms + TOLERANCE_MS))
        share = got / t.size
        requests += share
        goodput += share if met else 0.0
        finished += 1.0 if start <= t[-1] < end else 0.0
        sent_met += 1.0 if met and start <= r.send_time < end else 0.0
    return TraceRates(tokens / duration, requests / duration, goodput / duration,
                      finished / duration, sent_met / duration, matched)
