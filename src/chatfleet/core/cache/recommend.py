"""Summaries of cache replays and the method's recommendation (`chatfleet cache`).

`summarize` turns one replay into one entry of the results (hit rates overall and per turn
beside the unbounded pool's, evictions that returned, TTFT, holds / thrashes); `recommend`
applies the method's rule (docs/facts.md#the-method) over the entries; `cache_document` is the
`chatfleet.cache/1` document.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chatfleet.core.cache.replay import DEFAULT_POLICY, ReplayResult
from chatfleet.core.documents.cache import (
    CACHE_SCHEMA,
    CacheDoc,
    CacheRecommendation,
    CacheResult,
    TraceInfo,
    Unbounded,
    WorkingSet,
)
from chatfleet.core.documents.fields import View
from chatfleet.core.documents.sweep import Quantiles
from chatfleet.core.measure.percentiles import percentiles
from chatfleet.core.plan import in_host_tier_window

SCHEMA = CACHE_SCHEMA
HOLD_TOLERANCE = 0.05  # a turn holds when its hit rate is within this of the unbounded pool's
THRASH_GAP = 0.10  # thrashing: the later turns' hit rate is this far below the unbounded pool's


def _rate(num: int, den: int) -> float:
    return num / den if den else 0.0


def _mean(total: float, n: int) -> float:
    return total / n if n else 0.0


def summarize(res: ReplayResult, tolerance: float = HOLD_TOLERANCE) -> CacheResult:
    """One entry of the results: hit rates overall and per turn, next to the unbounded pool's
    (ceiling); evictions that returned; TTFT from the scheduler; whether the configuration
    holds."""
    outs = [o for o in res.outcomes if o.admitted]
    max_turn = max((o.turn for o in res.outcomes), default=0)
    prompt = [0] * max_turn
    hit = [0] * max_turn
    ceil = [0] * max_turn
    returned = [0] * max_turn
    ttft_sum = [0.0] * max_turn
    count = [0] * max_turn
    for o in outs:
        k = o.turn - 1
        prompt[k] += o.prompt_tokens
        hit[k] += o.hit_tokens
        ceil[k] += o.ceiling_tokens
        returned[k] += 1 if o.returned_tokens > 0 else 0
        ttft_sum[k] += o.ttft_s
        count[k] += 1
    by_turn = [round(_rate(h, p), 4) for h, p in zip(hit, prompt, strict=True)]
    ceil_by_turn = [round(_rate(c, p), 4) for c, p in zip(ceil, prompt, strict=True)]
    short = [k + 1 for k in range(max_turn)
             if prompt[k] and hit[k] / prompt[k] < ceil[k] / prompt[k] - tolerance]
    total_prompt = sum(prompt)
    late = range(max_turn // 2, max_turn)  # the second half of the turns
    late_prompt = sum(prompt[k] for k in late)
    late_gap = _rate(sum(ceil[k] - hit[k] for k in late), late_prompt)
    ttft = percentiles([o.ttft_s for o in outs], (50.0, 90.0, 99.0), scale=1000.0)
    holds = not short and res.not_admitted == 0
    return CacheResult(
        pool_tokens=res.config.pool_tokens,
        policy=res.config.policy,
        host_pool_tokens=res.config.host_pool_tokens,
        hit_rate=round(_rate(sum(hit), total_prompt), 4),
        hit_rate_by_turn=tuple(by_turn),
        ceiling_hit_rate=round(_rate(sum(ceil), total_prompt), 4),
        ceiling_hit_rate_by_turn=tuple(ceil_by_turn),
        host_hit_rate=round(_rate(sum(o.host_hit_tokens for o in outs), total_prompt), 4),
        evicted_then_returned=sum(returned),
        evicted_then_returned_by_turn=tuple(returned),
        evicted_then_returned_tokens=sum(o.returned_tokens for o in outs),
        evicted_tokens=res.evicted_tokens,
        loaded_back_tokens=res.loaded_back_tokens,
        requests=len(res.outcomes),
        prompt_tokens=total_prompt,
        waited_for_room=res.waited,
        retractions=res.retractions,
        not_admitted=res.not_admitted,
        ttft_ms=Quantiles(p50=round(ttft["p50"], 1), p90=round(ttft["p90"], 1),
                          p99=round(ttft["p99"], 1), n=int(ttft["n"])),
        late_turn_gap=round(late_gap, 4),
        holds=holds,
        thrashes=late_gap > THRASH_GAP and sum(returned) > 0,
        short_turns=tuple(short),
        hicache_write_policy=res.config.write_policy if res.config.host_pool_tokens else None,
        # the mean, as SGLang's bench_multiturn.py reports a round's TTFT
        ttft_ms_mean_by_turn=tuple(round(1000.0 * _mean(t, n), 1)
                                   for t, n in zip(ttft_sum, count, strict=True)),
    )


def working_set_block(res: ReplayResult) -> WorkingSet:
    return WorkingSet(
        peak=res.working_set_peak,
        mean=round(res.working_set_mean, 1),
        peak_requests_in_flight=res.in_flight_peak,
        definition="distinct tokens, at each admission, of every live session's cached "
                   "prefix that its next prompt reuses (shared prompt once), with the "
                   "requests in flight counted whole (prompt + answer); a session is live "
                   "from its first turn until its last turn ends, pauses included",
    )


def recommend(results: Sequence[CacheResult], working_set_peak: int,
              card_pool_tokens: int | None = None) -> CacheRecommendation:
    """The method's rule (docs/facts.md#the-method): grow the pool before changing the eviction
    policy; add a host tier only when the working set is larger than the GPU pool and smaller
    than GPU plus host.

    1. The smallest pool where the default policy (lru, else the first swept) holds without a
       host tier.
    2. Else, at the largest pool: the smallest host tier inside its window (working set >
       pool and <= pool + host) that holds.
    3. Else, at the largest pool without a host tier: another policy that holds (best hit
       rate first).
    4. Else nothing holds: the largest pool with its best entry, and say by how much the
       working set exceeds it."""
    if not results:
        raise ValueError("nothing to recommend from: no results")
    policies = list(dict.fromkeys(r.policy for r in results))
    default = DEFAULT_POLICY if DEFAULT_POLICY in policies else policies[0]
    pools = sorted({r.pool_tokens for r in results})
    largest = pools[-1]

    def pick(r: CacheResult, reason: str) -> CacheRecommendation:
        note = ""
        if card_pool_tokens is not None and r.pool_tokens > card_pool_tokens:
            note = (f"; this card's planned pool is {card_pool_tokens} tokens: reaching "
                    f"{r.pool_tokens} needs FP8 KV cache, FP8 weights or a larger card")
        return CacheRecommendation(pool_tokens=r.pool_tokens, policy=r.policy,
                                   host_pool_tokens=r.host_pool_tokens, hit_rate=r.hit_rate,
                                   reason=reason + note,
                                   hicache_write_policy=r.hicache_write_policy)

    for p in pools:
        for r in results:
            if (r.pool_tokens == p and r.policy == default and r.host_pool_tokens == 0
                    and r.holds):
                return pick(r, f"smallest pool where {default} holds every turn within "
                               f"{HOLD_TOLERANCE:.2f} of an unbounded pool, no host tier "
                               f"needed (working set peak {working_set_peak} tokens)")
    in_window = sorted(
        (r for r in results if r.pool_tokens == largest and r.policy == default
         and in_host_tier_window(working_set_peak, largest, r.host_pool_tokens)),
        key=lambda r: r.host_pool_tokens)
    for r in in_window:
        if r.holds:
            return pick(r, f"no swept pool holds with {default}; the working set peak "
                           f"({working_set_peak}) is larger than the largest pool ({largest}) "
                           f"and fits pool + host ({largest + r.host_pool_tokens}): "
                           f"smallest host tier that holds")
    others = sorted(
        (r for r in results if r.pool_tokens == largest and r.host_pool_tokens == 0
         and r.policy != default and r.holds),
        key=lambda r: -float(r.hit_rate))
    if others:
        return pick(others[0], f"no swept pool holds with {default} and no host tier in its "
                               f"window holds; grow the pool beyond {largest} if the card "
                               f"allows, else {others[0].policy} holds at {largest}")
    at_largest = [r for r in results if r.pool_tokens == largest
                  and (r.host_pool_tokens == 0
                       or in_host_tier_window(working_set_peak, largest, r.host_pool_tokens))]
    best = max(at_largest or list(results), key=lambda r: float(r.hit_rate))
    return pick(best, f"nothing swept holds: grow the pool past {largest} tokens (the working "
                      f"set peaks at {working_set_peak}, plus what requests in flight hold); "
                      f"best swept: hit rate {best.hit_rate:.3f}")


def cache_document(trace_info: Mapping[str, Any], target: Mapping[str, Any],
                   reference: ReplayResult, results: Sequence[CacheResult],
                   card_pool_tokens: int | None = None) -> CacheDoc:
    ws = working_set_block(reference)
    ref = summarize(reference)
    return CacheDoc(
        trace=TraceInfo(dict(trace_info)),
        target=View(dict(target)),
        working_set_tokens=ws,
        unbounded=Unbounded(hit_rate=ref.hit_rate, hit_rate_by_turn=ref.hit_rate_by_turn,
                            ttft_ms=ref.ttft_ms),
        hold_tolerance=HOLD_TOLERANCE,
        thrash_gap=THRASH_GAP,
        results=tuple(results),
        recommendation=recommend(results, ws.peak, card_pool_tokens),
    )
