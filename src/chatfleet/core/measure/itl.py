"""Per-token inter-token latency from stream chunks: when one chunk carries k tokens, its gap
is split evenly over the k tokens, never one sample per chunk."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import numpy as np


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
