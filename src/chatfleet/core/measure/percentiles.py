"""Percentiles: one convention for every figure chatfleet reports.

- Request figures (TTFT, TPOT, e2e, ITL, a request's own gaps, the client's lags, the
  simserver's emission lag): linear interpolation between closest ranks, numpy's default
  `linear` method, as SGLang's bench_serving and `vllm bench serve` compute them
  (`percentiles`; `_lerp_indices` and `_lerp` are that method written out for the vectorised
  per-request quantiles, which numpy cannot compute over segments of different lengths).
- The GPU's figures over a window (SM clock, power): time-weighted. A value counts for the
  time the card held it, and the median is the value below which half the time lies
  (`time_weighted_percentile`: the averaged inverted CDF of the time-weighted values). The
  twin weights each step by its seconds inside the window; live telemetry samples at a fixed
  interval, so each sample stands for the same time and weighs 1 (its median is then the
  ordinary median). The same `gpu.sm_clock_mhz.p50` is so computed the same way in both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


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


def ranks_read(n: int, ps: Sequence[float]) -> list[int]:
    """The ranks (0-based, in increasing order) that `percentiles_sorted` reads of `n` sorted
    values for `ps`, and the last (the maximum). An array partitioned at these ranks
    (`ndarray.partition`) holds the values a full sort would put there, so the percentiles of
    the partitioned array are those of the sorted one, for a fraction of a sort's time."""
    if n <= 0:
        return []
    ranks = {n - 1}
    for p in ps:
        lo, hi, _ = _lerp_indices(n, p / 100.0)
        ranks.update((int(lo), int(hi)))
    return sorted(ranks)


def percentiles_sorted(ordered: FloatArray, ps: Sequence[float], scale: float) -> dict[str, float]:
    """`percentiles` of values already in order (or partitioned at `ranks_read(n, ps)`)."""
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
    return percentiles_sorted(np.sort(arr), checked, scale)


def segment_quantile(
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


def time_weighted_percentile(values: Sequence[float], weights: Sequence[float] | None,
                             p: float) -> float | None:
    """The p-th percentile of values each held for its weight (seconds; None: every value for
    the same time, as samples at a fixed interval): the smallest value held, with every value
    below it, for at least p% of the time; where exactly p% lies at or below a value, the
    mean of it and the next (numpy's `averaged_inverted_cdf`, with weights). With equal
    weights and p = 50 it is the ordinary median (`statistics.median`). None for no values or
    no time."""
    if not 0.0 <= p <= 100.0:
        raise ValueError(f"percentile must be within [0, 100], not {p!r}")
    if weights is None:
        weights = [1.0] * len(values)
    elif len(weights) != len(values):
        raise ValueError(f"{len(values)} values but {len(weights)} weights")
    pairs = sorted(zip(values, weights, strict=True))
    total = sum(w for _, w in pairs)
    if not pairs or total <= 0:
        return None
    threshold = total * (p / 100.0)
    acc = 0.0
    for i, (value, w) in enumerate(pairs):
        acc += w
        if acc >= threshold:
            if acc == threshold and 0.0 < p < 100.0 and i + 1 < len(pairs):
                return (value + pairs[i + 1][0]) / 2
            return value
    return pairs[-1][0]
