"""The metrics math, one concept a module (docs/metrics.md states the definitions for users):

- `itl`: stream chunks to per-token arrival times;
- `request`: per-request figures (TTFT, TPOT, e2e, the per-request ITL statistic, the verdict,
  requests in flight): the scalar reference definitions, and the vectorised form a sweep point
  is computed with (tested to agree);
- `percentiles`: the one percentile convention (numpy's `linear`), and the time-weighted one
  of the GPU's figures;
- `point`: one sweep point from its records (`summarize_point`), and the validity rule;
- `knee`: the knee, the throughput peak, the recommended cap, the bisection of a bracket, and
  the sweep document's summary.

The latency target itself, `SLO` with the tolerance of every verdict, is `core/slo.py`: the
documents carry it too.
"""
