"""The plan's answer, from sweeps: users per card, goodput at the target, the caps, the fleet
size, and the precision to serve.

Every figure is read from a chatfleet.sweep/1 document and names the point it came from
(`source`), so a reader can find it in the sweep's JSON:

- users per card: the closed-loop knee's `meets` (the highest tested user count that meets the
  target attainment together with every lower count);
- goodput at the target: that point's `goodput_rps` (requests per second that meet the target);
- the gateway cap: the sweep's `recommended_cap` (requests in flight at that point), and the
  engine guard (SGLang's --max-running-requests) at the same count (docs/facts.md#the-method);
- the rate a replica sustains: the open-loop knee's `meets`, when the sweep has open-loop points;
- replicas: ceil(users x (1 + headroom) / users per card); cards: replicas x cards per replica.

The precision: the one with the most users per card (then the most goodput; then the wider
number format) among those an accuracy result allows. A precision whose paired difference to
the reference has a 95% interval reaching below -margin is not recommended, whatever its goodput.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from chatfleet.core.documents.plan import (
    AccuracyVerdict,
    FigureSource,
    HostTier,
    PrecisionFigures,
)
from chatfleet.core.documents.sweep import SweepDoc, SweepPoint, valid_points
from chatfleet.core.errors import ChatfleetError
from chatfleet.core.measure.knee import recommended_cap

__all__ = ["PrecisionFigures"]  # its home is core.documents.plan

# The order of preference when two precisions tie: the wider format first.
PRECISION_ORDER = ("bf16", "fp8")


class PlanError(ChatfleetError):
    """Inputs the plan cannot use (a sweep without a closed-loop knee, bad headroom, ...)."""


def precision_name(weights: str, kv_cache: str) -> str:
    """'bf16' or 'fp8' when weights and KV cache agree, else 'W/KV' (e.g. 'fp8/bf16')."""
    return weights if weights == kv_cache else f"{weights}/{kv_cache}"


def _point_at(doc: SweepDoc, mode: str, load: float) -> tuple[int, SweepPoint]:
    """The first valid point of that mode and load (with repeats, the one with the lowest
    goodput: the cautious reading)."""
    found = [(i, p) for i, p in enumerate(doc.points)
             if p.valid and p.load.mode == mode and p.load.value == load]
    if not found:
        raise PlanError(f"the sweep's knee {load} has no valid {mode}-loop point")
    return min(found, key=lambda ip: float(ip[1].goodput_rps or 0.0))


def figures_from_sweep(doc: SweepDoc, sweep_name: str,
                       cap_margin: int | None = None) -> PrecisionFigures:
    """Read one precision's figures from its sweep document. `sweep_name` says where the
    document is (a file path, or 'twin' for one the plan ran) and goes into `source`. With
    `cap_margin` m > 0, the figures are those of the tested user count m grid steps below the
    knee's `meets` (the users the lowered cap admits; else the sweep's own `recommended_cap`
    at `meets`)."""
    weights, kv = doc.target.weights, doc.target.kv_cache
    if weights is None or kv is None:
        raise PlanError(f"{sweep_name}: target.weights and target.kv_cache are needed to know "
                        "which precision the sweep measured")
    knee, knee_rate = doc.knee, doc.knee_rate
    source = FigureSource(sweep=sweep_name)
    users = cap = None
    goodput = tok_s = ttft99 = None
    if knee.meets is not None:
        at = float(knee.meets)
        if cap_margin:
            grid = sorted({p.load.value for p in valid_points(doc.points, "closed")})
            at = grid[max(0, grid.index(at) - cap_margin)]
        index, point = _point_at(doc, "closed", at)
        users = int(at)
        cap = (doc.recommended_cap if cap_margin is None
               else recommended_cap(doc.points, knee, cap_margin))
        cap = int(cap) if cap is not None else users
        goodput = float(point.goodput_rps)
        tok_s = float(point.output_tok_s)
        ttft99 = float(point.ttft_ms.p99)
        source = FigureSource(sweep=sweep_name, point=index, load=point.load)
    rate = None
    if knee_rate.meets is not None:
        index, _ = _point_at(doc, "open", float(knee_rate.meets))
        rate = float(knee_rate.meets)
        source = FigureSource(sweep=sweep_name, point=source.point, load=source.load,
                              rate_point=index)
    return PrecisionFigures(precision_name(weights, kv), weights, kv, users, cap, goodput,
                            tok_s, ttft99, rate, knee, knee_rate, source)


def prefill_reserve_s(fig: PrecisionFigures, ttft_budget_s: float) -> float:
    """The part of the TTFT budget the gateway keeps for the engine: a queued request is shed
    at arrival + budget - reserve. The knee point's P99 TTFT (rounded up to 50 ms), so a request
    admitted from the queue still has the time the P99 user needed at the knee; never more
    than the budget."""
    if fig.ttft_p99_ms is None:
        return 0.0
    return min(ttft_budget_s, math.ceil(fig.ttft_p99_ms / 50.0) * 0.05)


def fleet_size(users: int, users_per_card: int, headroom: float,
               cards_per_replica: int = 1) -> dict[str, int]:
    """Replicas for `users` concurrent users with `headroom` spare (0.2: 20% more capacity than
    the target needs), and the cards they take."""
    if users < 1:
        raise PlanError("the target users must be at least 1")
    if users_per_card < 1:
        raise PlanError("users per card must be at least 1")
    if not 0.0 <= headroom < 10.0:
        raise PlanError("headroom must be in [0, 10)")
    replicas = math.ceil(users * (1.0 + headroom) / users_per_card - 1e-9)
    return {"replicas": replicas, "cards": replicas * cards_per_replica}


def accuracy_verdicts(accuracy: Mapping[str, Any] | None,
                      names: Sequence[str]) -> dict[str, AccuracyVerdict]:
    """For each precision name: whether the accuracy result allows it, and why.

    A chatfleet.accuracy/1 result names its targets; a target is matched to a precision by its
    name ('bf16', 'fp8', or 'W/KV'). The reference target is always allowed; another is allowed
    when its comparison with the reference is within the margin (the lower end of the paired
    difference's 95% interval >= -margin). A precision the result does not name is allowed,
    marked 'not checked'."""
    out: dict[str, AccuracyVerdict] = {}
    if accuracy is None:
        return {n: AccuracyVerdict({"allowed": True, "checked": False,
                                    "why": "no accuracy result given"}) for n in names}
    targets = accuracy.get("targets") or {}
    reference = accuracy.get("reference")
    margin = accuracy.get("margin")
    comparisons = list(accuracy.get("comparisons") or [])
    if not comparisons and accuracy.get("paired"):
        comparisons = [accuracy["paired"]]
    by_b = {str(c.get("b", "")).lower(): c for c in comparisons}
    by_name = {str(k).lower(): v for k, v in targets.items()}
    for name in names:
        key = name.lower()
        t = by_name.get(key)
        if t is None:
            out[name] = AccuracyVerdict({"allowed": True, "checked": False,
                                         "why": "not among the accuracy result's targets"})
        elif reference is not None and key == str(reference).lower():
            out[name] = AccuracyVerdict({"allowed": True, "checked": True,
                                         "accuracy": t.get("accuracy"),
                                         "why": "the accuracy reference"})
        elif key in by_b:
            c = by_b[key]
            lo, hi = c["diff_ci95"]
            ok = bool(c.get("within_margin", lo >= -float(margin or 0.0)))
            out[name] = AccuracyVerdict({
                "allowed": ok, "checked": True, "accuracy": t.get("accuracy"),
                "diff": c.get("diff"), "diff_ci95": [lo, hi], "margin": margin,
                "why": (f"accuracy difference to {reference} in [{lo:+.3f}, {hi:+.3f}]: "
                        + ("within" if ok else "outside") + f" the margin of {margin}"),
            })
        else:
            out[name] = AccuracyVerdict({
                "allowed": True, "checked": False, "accuracy": t.get("accuracy"),
                "why": f"no paired comparison with the reference {reference}"})
    return out


def _rank(f: PrecisionFigures) -> tuple[int, float, int]:
    order = PRECISION_ORDER.index(f.weights) if f.weights in PRECISION_ORDER else 99
    return (f.users_per_card or 0, f.goodput_rps or 0.0, -order)


def choose_precision(figures: Sequence[PrecisionFigures],
                     verdicts: Mapping[str, AccuracyVerdict]) -> tuple[
                         PrecisionFigures | None, str]:
    """The precision to serve and the reason, or None and why not."""

    def allowed_(f: PrecisionFigures) -> bool:
        v = verdicts.get(f.name)
        return v is None or v.allowed

    allowed = [f for f in figures if allowed_(f)]
    usable = [f for f in allowed if f.users_per_card]
    excluded = [f"{f.name} ({verdicts[f.name].why})" for f in figures if not allowed_(f)]
    if not usable:
        why = "no precision meets the target at any tested load"
        if excluded:
            why += "; excluded by accuracy: " + ", ".join(excluded)
        return None, why
    best = max(usable, key=_rank)
    others = [f for f in usable if f is not best]
    why = f"{best.name}: {best.users_per_card} users per card at the knee"
    if others:
        why += " (" + ", ".join(f"{f.name}: {f.users_per_card}" for f in others) + ")"
    if excluded:
        why += "; not recommended for accuracy: " + ", ".join(excluded)
    return best, why


def working_set_tokens(users: int, system_prompt_tokens: int, prompt_groups: int,
                       context_tokens: float) -> int:
    """Tokens a replica's users keep alive in the prefix cache: every shared prompt once, and
    each user's own history (its last context beyond the shared prompt)."""
    return int(system_prompt_tokens * prompt_groups + users * max(0.0, context_tokens))


def in_host_tier_window(working_set: int, pool_tokens: int, host_tokens: int) -> bool:
    """The method's rule (docs/facts.md#the-method): a host tier helps only when the working
    set is larger than the GPU pool and no larger than GPU plus host. `plan` and the cache
    analysis's recommendation both ask it."""
    return pool_tokens < working_set <= pool_tokens + host_tokens


def host_tier(working_set: int, pool_tokens: int, host_tokens: int) -> HostTier:
    """The host-tier flags for a working set: on inside its window (`in_host_tier_window`)."""
    if working_set <= pool_tokens:
        return HostTier(enable=False, why=f"the working set ({working_set:,} tokens) fits the "
                        f"pool ({pool_tokens:,})")
    if in_host_tier_window(working_set, pool_tokens, host_tokens):
        ratio = math.ceil(10.0 * working_set / pool_tokens) / 10.0
        return HostTier(enable=True, hicache_ratio=max(ratio, 1.1),
                        why=f"the working set ({working_set:,}) outgrows the pool "
                            f"({pool_tokens:,}) but fits pool + host "
                            f"({pool_tokens + host_tokens:,})")
    return HostTier(enable=False, why=f"the working set ({working_set:,}) is larger than pool "
                    f"+ host ({pool_tokens + host_tokens:,}): a host tier would thrash too; "
                    "serve fewer users per card")
