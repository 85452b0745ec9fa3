"""Engine steps observed from the client: every token gap of every request, with the batch.

An engine that streams (vLLM, SGLang) sends each running request one token at the end of every
step, so a request's gap between two tokens is one step's time, and every request running at
that moment saw the same step. With the arrival times of all requests of a run, each gap of
request i, from its token at `a` to the next at `b`, comes with what the step carried:

- `num_decode`: the requests decoding across the gap (first token at or before `a`, last at or
  after `b`), request i included;
- `decode_context_tokens`: their contexts (prompt plus the tokens they have so far, this step's
  included): the KV the step's attention reads;
- the prefills the step finished: requests whose *first* token arrived with `b` (their prompt's
  uncached tokens, the causal query-key pairs of those tokens after their cached prefix, the
  cached prefix itself, and their count).

The step boundaries come from the arrivals themselves: the API server writes a step's tokens to
the streams one after another (some 0.07 ms apart), and the next step's come a step later, so
the sorted arrivals of all requests fall into clusters separated by gaps much longer than any
spacing inside one (`cluster_gap_s`: at most MAX_CLUSTER_GAP_S, and at most CLUSTER_SHARE of the
run's median request gap). A cluster holding at least half the requests running at its time is
a step; a smaller one (a stray chunk: a first token handed over late, a final usage chunk) is
not. A request's gap spans one step when both its tokens came with a step and no step lies
strictly between them; any other gap (the request was preempted and waited, a chunk carried
several tokens, a token came as a stray) is left out (`num_dropped`).

Each kept gap is weighted 1/num_decode: a step seen by n running requests counts once. All of
it is computed with sorted arrays and prefix sums (a 128-user point has some 75,000 gaps).
Prefills that take several steps (a prompt longer than the step's token budget) are attributed
to the step that finished them: on the sweeps chatfleet runs (prompts under vLLM's 8,192-token
budget) that is the step that ran them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from chatfleet.core.records import RequestRecord

FloatArray = npt.NDArray[np.float64]

# arrivals closer than this are one cluster: at most MAX_CLUSTER_GAP_S, at most this share of
# the run's median request gap
CLUSTER_SHARE = 0.2
MAX_CLUSTER_GAP_S = 0.002
STEP_CLUSTER_SHARE = 0.5  # a cluster is a step if it holds this share of the running requests


@dataclass(frozen=True)
class StepSamples:
    """One row per kept gap (arrays of equal length)."""

    gap_s: FloatArray
    weight: FloatArray  # 1 / num_decode
    num_decode: FloatArray
    decode_context_tokens: FloatArray
    prefill_tokens: FloatArray
    prefill_pairs: FloatArray
    prefill_cached_tokens: FloatArray
    num_prefill: FloatArray
    end_time: FloatArray
    num_dropped: int  # gaps that spanned more than one step
    cluster_gap_s: float

    def __len__(self) -> int:
        return len(self.gap_s)

    @property
    def num_steps(self) -> float:
        """The steps the kept gaps stand for (the sum of the weights)."""
        return float(self.weight.sum())

    def select(self, mask: npt.NDArray[np.bool_]) -> StepSamples:
        return StepSamples(
            self.gap_s[mask], self.weight[mask], self.num_decode[mask],
            self.decode_context_tokens[mask], self.prefill_tokens[mask],
            self.prefill_pairs[mask], self.prefill_cached_tokens[mask],
            self.num_prefill[mask], self.end_time[mask], 0, self.cluster_gap_s)


def _empty(cluster_gap_s: float, dropped: int = 0) -> StepSamples:
    z = np.zeros(0)
    return StepSamples(z, z, z, z, z, z, z, z, z, dropped, cluster_gap_s)


def concat(parts: Sequence[StepSamples]) -> StepSamples:
    """Several runs' samples as one set (the first's cluster gap; dropped counts add)."""
    if not parts:
        return _empty(0.0)
    def joined(name: str) -> FloatArray:
        return np.concatenate([getattr(p, name) for p in parts])

    return StepSamples(
        joined("gap_s"), joined("weight"), joined("num_decode"),
        joined("decode_context_tokens"), joined("prefill_tokens"), joined("prefill_pairs"),
        joined("prefill_cached_tokens"), joined("num_prefill"), joined("end_time"),
        sum(p.num_dropped for p in parts), parts[0].cluster_gap_s)


def step_samples(records: Sequence[RequestRecord], cluster_gap_s: float | None = None
                 ) -> StepSamples:
    """The gaps of one run's records (requests that finished with at least two tokens)."""
    done = [r for r in records if r.outcome == "ok" and len(r.token_times) >= 2]
    if not done:
        return _empty(cluster_gap_s or 0.0)
    times = [np.asarray(r.token_times, dtype=np.float64) for r in done]
    prompt = np.array([r.prompt_tokens for r in done], dtype=np.float64)
    cached = np.array([min(r.cached_tokens, max(r.prompt_tokens - 1, 0)) for r in done],
                      dtype=np.float64)
    new = prompt - cached
    pairs = new * cached + new * (new + 1) / 2
    n_out = np.array([len(t) for t in times], dtype=np.float64)

    # every arrival's cluster
    flat = np.concatenate(times)
    order = np.argsort(flat, kind="stable")
    arrivals = flat[order]
    gaps_all = np.concatenate([np.diff(t) for t in times])
    if cluster_gap_s is None:
        cluster_gap_s = min(CLUSTER_SHARE * float(np.median(gaps_all)), MAX_CLUSTER_GAP_S)
    cluster_sorted = np.concatenate(([0], np.cumsum(np.diff(arrivals) > cluster_gap_s)))
    cluster = np.empty_like(cluster_sorted)
    cluster[order] = cluster_sorted
    bounds = np.cumsum([0] + [len(t) for t in times])
    first_c = cluster[bounds[:-1]].astype(np.float64)
    last_c = cluster[bounds[1:] - 1].astype(np.float64)

    # which clusters are steps: at least half the requests running at their time
    n_clusters = int(cluster_sorted[-1]) + 1
    size = np.bincount(cluster_sorted, minlength=n_clusters)
    c_time = arrivals[np.concatenate(([0], np.flatnonzero(np.diff(cluster_sorted)) + 1))]
    firsts = np.sort(np.array([t[0] for t in times]))
    lasts = np.sort(np.array([t[-1] for t in times]))
    running = (np.searchsorted(firsts, c_time, side="right")
               - np.searchsorted(lasts, c_time, side="left"))
    is_step = size >= np.maximum(1.0, STEP_CLUSTER_SHARE * running)
    steps_before = np.concatenate(([0], np.cumsum(is_step)))  # steps among clusters < c

    # the gaps, by cluster: a from cluster ca, b from cluster cb
    ca = np.concatenate([cluster[bounds[k]:bounds[k + 1] - 1] for k in range(len(times))])
    cb = np.concatenate([cluster[bounds[k] + 1:bounds[k + 1]] for k in range(len(times))])
    a = np.concatenate([t[:-1] for t in times])
    b = np.concatenate([t[1:] for t in times])
    gaps = b - a
    # a step strictly between the two tokens: the gap spans several steps; a token in a
    # cluster that is no step (a stray chunk) does not mark a step's end
    single = ((steps_before[cb] - steps_before[ca + 1]) <= 0) & is_step[ca] & is_step[cb]

    by_first = np.argsort(first_c, kind="stable")
    first_s = first_c[by_first]
    by_last = np.argsort(last_c, kind="stable")
    last_s = last_c[by_last]

    def prefix(values: FloatArray, order: npt.NDArray[np.intp]) -> FloatArray:
        return np.concatenate(([0.0], np.cumsum(values[order])))

    started = np.searchsorted(first_s, ca, side="right")  # first token in cluster <= ca
    finished = np.searchsorted(last_s, cb, side="left")  # last token in a cluster < cb
    num_decode = (started - finished).astype(np.float64)
    prompt_started = prefix(prompt, by_first)[started]
    prompt_finished = prefix(prompt, by_last)[finished]
    out_finished = prefix(n_out, by_last)[finished]
    tokens_before = np.searchsorted(cluster_sorted, ca, side="right").astype(np.float64)
    # tokens the decoding requests hold: all that arrived up to cluster ca, less the finished
    # requests', plus this step's one each
    generated = tokens_before - out_finished + num_decode
    context = prompt_started - prompt_finished + generated

    # prefills this step finished: first token in a cluster after ca, up to cb
    pf_lo = np.searchsorted(first_s, ca, side="right")
    pf_hi = np.searchsorted(first_s, cb, side="right")
    pf_new = prefix(new, by_first)
    pf_pairs = prefix(pairs, by_first)
    pf_cached = prefix(cached, by_first)

    keep = single & (num_decode >= 1) & (gaps > 0)
    nd = np.maximum(num_decode, 1.0)
    return StepSamples(
        gap_s=gaps[keep], weight=(1.0 / nd)[keep], num_decode=num_decode[keep],
        decode_context_tokens=context[keep],
        prefill_tokens=(pf_new[pf_hi] - pf_new[pf_lo])[keep],
        prefill_pairs=(pf_pairs[pf_hi] - pf_pairs[pf_lo])[keep],
        prefill_cached_tokens=(pf_cached[pf_hi] - pf_cached[pf_lo])[keep],
        num_prefill=(pf_hi - pf_lo).astype(np.float64)[keep],
        end_time=b[keep], num_dropped=int((~single).sum()), cluster_gap_s=cluster_gap_s)
