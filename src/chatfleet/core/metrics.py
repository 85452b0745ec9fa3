"""The metrics math's old home, kept for one release: import from `chatfleet.core.measure`
(`itl`, `request`, `percentiles`, `point`, `validity`, `knee`), the target from
`chatfleet.core.slo` and the typed sweep document from `chatfleet.core.documents.sweep`.
docs/metrics.md states the definitions."""

from __future__ import annotations

from chatfleet.core.documents.sweep import MODES, SCHEMA, Mode
from chatfleet.core.measure.itl import expand_chunks
from chatfleet.core.measure.knee import (
    RATE_BRACKET_SHARE,
    bisect_next,
    find_knee,
    load_value,
    recommended_cap,
    sweep_document,
    throughput_peak,
)
from chatfleet.core.measure.percentiles import percentiles, time_weighted_percentile
from chatfleet.core.measure.point import (
    THIN_REQUESTS,
    arrivals_in_window,
    in_window,
    summarize_point,
)
from chatfleet.core.measure.request import (
    e2e,
    first_token_time,
    in_flight_max,
    itl_gaps,
    meets_slo,
    output_token_count,
    request_itl_stat,
    tpot,
    ttft,
)
from chatfleet.core.slo import ITL_STATS, SLO, TOLERANCE_MS, ItlStat

__all__ = [
    "ITL_STATS", "MODES", "RATE_BRACKET_SHARE", "SCHEMA", "SLO", "THIN_REQUESTS", "TOLERANCE_MS",
    "ItlStat", "Mode", "arrivals_in_window", "bisect_next", "e2e", "expand_chunks", "find_knee",
    "first_token_time", "in_flight_max", "in_window", "itl_gaps", "load_value", "meets_slo",
    "output_token_count", "percentiles", "recommended_cap", "request_itl_stat",
    "summarize_point", "sweep_document", "throughput_peak", "time_weighted_percentile", "tpot",
    "ttft",
]
