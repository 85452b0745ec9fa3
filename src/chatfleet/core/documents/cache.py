"""The chatfleet.cache/1 document, typed: `chatfleet cache`'s answer (docs/cache.md).

```
CacheDoc              schema, trace, target, working_set_tokens, unbounded, hold_tolerance,
                      thrash_gap, results, recommendation
  WorkingSet          peak and mean tokens, peak requests in flight, the definition
  Unbounded           the unbounded pool's hit rate (overall, per turn) and TTFT: the ceiling
  CacheResult         one pool x policy x host tier: hit rates beside the ceiling, evictions
                      that came back, TTFT, whether it holds or thrashes
  CacheRecommendation the method's pick, and why
```

The trace's description and the target are kept as the CLI wrote them (a synthetic trace's
settings, or a trace file's path), with typed reads of what the CLI prints.
`core/documents/fields.py` says how a file reads and writes back the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from chatfleet.core.documents.fields import (
    DocumentError,
    Extra,
    JsonObject,
    View,
    boolean,
    integer,
    no_extra,
    num,
    obj,
    opt_text,
    put,
    rest,
    seq,
    text,
    with_extra,
)
from chatfleet.core.documents.sweep import Quantiles

CACHE_SCHEMA = "chatfleet.cache/1"


class TraceInfo(View):
    """The trace replayed: a synthetic trace's settings and seed, or a file's path; its
    sessions, turns, requests, prompt tokens and span (s)."""

    __slots__ = ()

    @property
    def sessions(self) -> int:
        return int(self.fields.get("sessions", 0))

    @property
    def requests(self) -> int:
        return int(self.fields.get("requests", 0))

    @property
    def span_s(self) -> float:
        return float(self.fields.get("span_s", 0.0))


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkingSet:
    """The working set of the trace's live sessions, tokens (see `definition`)."""

    peak: int
    mean: float
    peak_requests_in_flight: int
    definition: str
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("peak", "mean", "peak_requests_in_flight", "definition")

    def to_json(self) -> JsonObject:
        return with_extra({"peak": self.peak, "mean": self.mean,
                           "peak_requests_in_flight": self.peak_requests_in_flight,
                           "definition": self.definition}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> WorkingSet:
        d = obj(data, where)
        return cls(peak=integer(d, "peak", where), mean=num(d, "mean", where),
                   peak_requests_in_flight=integer(d, "peak_requests_in_flight", where),
                   definition=text(d, "definition", where), extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class Unbounded:
    """The unbounded pool: the hit rate no pool can beat, overall and per turn, and its TTFT."""

    hit_rate: float
    hit_rate_by_turn: tuple[float, ...]
    ttft_ms: Quantiles
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"hit_rate": self.hit_rate,
                           "hit_rate_by_turn": list(self.hit_rate_by_turn),
                           "ttft_ms": self.ttft_ms.to_json()}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> Unbounded:
        d = obj(data, where)
        return cls(hit_rate=num(d, "hit_rate", where),
                   hit_rate_by_turn=tuple(seq(d, "hit_rate_by_turn", where) or ()),
                   ttft_ms=Quantiles.from_json(d.get("ttft_ms") or {}, f"{where}: ttft_ms"),
                   extra=rest(d, ("hit_rate", "hit_rate_by_turn", "ttft_ms")))


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheResult:
    """One configuration replayed (`core.cache.recommend.summarize`): hit rates overall and
    per turn beside the unbounded pool's, the host tier's hits, evictions that returned,
    evicted and loaded-back tokens, the scheduler's waits and retractions, TTFT, the second
    half's gap to the ceiling, and the verdict (holds, thrashes, the turns that fall short)."""

    pool_tokens: int
    policy: str
    host_pool_tokens: int
    hit_rate: float
    hit_rate_by_turn: tuple[float, ...]
    ceiling_hit_rate: float
    ceiling_hit_rate_by_turn: tuple[float, ...]
    host_hit_rate: float
    evicted_then_returned: int
    evicted_then_returned_by_turn: tuple[int, ...]
    evicted_then_returned_tokens: int
    evicted_tokens: int
    loaded_back_tokens: int
    requests: int
    prompt_tokens: int
    waited_for_room: int
    retractions: int
    not_admitted: int
    ttft_ms: Quantiles
    late_turn_gap: float
    holds: bool
    thrashes: bool
    short_turns: tuple[int, ...]
    # added with the host tier's write policies and the per-round TTFT of SGLang's
    # bench_multiturn.py: absent from documents written before (and the policy, without a host
    # tier)
    hicache_write_policy: str | None = None
    ttft_ms_mean_by_turn: tuple[float, ...] | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "pool_tokens", "policy", "host_pool_tokens", "hit_rate", "hit_rate_by_turn",
        "ceiling_hit_rate", "ceiling_hit_rate_by_turn", "host_hit_rate",
        "evicted_then_returned", "evicted_then_returned_by_turn",
        "evicted_then_returned_tokens", "evicted_tokens", "loaded_back_tokens", "requests",
        "prompt_tokens", "waited_for_room", "retractions", "not_admitted", "ttft_ms",
        "late_turn_gap", "holds", "thrashes", "short_turns")
    _OPTIONAL: ClassVar[tuple[str, ...]] = ("hicache_write_policy", "ttft_ms_mean_by_turn")
    _LISTS: ClassVar[frozenset[str]] = frozenset({
        "hit_rate_by_turn", "ceiling_hit_rate_by_turn", "evicted_then_returned_by_turn",
        "short_turns", "ttft_ms_mean_by_turn"})

    def to_json(self) -> JsonObject:
        out: JsonObject = {}
        for key in (*self._KEYS, *self._OPTIONAL):
            value = getattr(self, key)
            if value is None:
                continue  # an optional key left out
            if key in self._LISTS:
                value = list(value)
            elif isinstance(value, Quantiles):
                value = value.to_json()
            out[key] = value
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> CacheResult:
        d = obj(data, where)

        def ints(key: str) -> int:
            return integer(d, key, where)

        def listed(key: str) -> tuple[Any, ...]:
            return tuple(seq(d, key, where) or ())

        return cls(
            pool_tokens=ints("pool_tokens"), policy=text(d, "policy", where),
            host_pool_tokens=ints("host_pool_tokens"), hit_rate=num(d, "hit_rate", where),
            hit_rate_by_turn=listed("hit_rate_by_turn"),
            ceiling_hit_rate=num(d, "ceiling_hit_rate", where),
            ceiling_hit_rate_by_turn=listed("ceiling_hit_rate_by_turn"),
            host_hit_rate=num(d, "host_hit_rate", where),
            evicted_then_returned=ints("evicted_then_returned"),
            evicted_then_returned_by_turn=listed("evicted_then_returned_by_turn"),
            evicted_then_returned_tokens=ints("evicted_then_returned_tokens"),
            evicted_tokens=ints("evicted_tokens"), loaded_back_tokens=ints("loaded_back_tokens"),
            requests=ints("requests"), prompt_tokens=ints("prompt_tokens"),
            waited_for_room=ints("waited_for_room"), retractions=ints("retractions"),
            not_admitted=ints("not_admitted"),
            ttft_ms=Quantiles.from_json(d.get("ttft_ms") or {}, f"{where}: ttft_ms"),
            late_turn_gap=num(d, "late_turn_gap", where), holds=boolean(d, "holds", where),
            thrashes=boolean(d, "thrashes", where), short_turns=listed("short_turns"),
            hicache_write_policy=opt_text(d, "hicache_write_policy", where),
            ttft_ms_mean_by_turn=(None if d.get("ttft_ms_mean_by_turn") is None
                                  else listed("ttft_ms_mean_by_turn")),
            extra=rest(d, (*cls._KEYS, *cls._OPTIONAL)))


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheRecommendation:
    """The method's pick (`core.cache.recommend.recommend`): pool, policy, host tier, its hit
    rate, and the reason."""

    pool_tokens: int
    policy: str
    host_pool_tokens: int
    hit_rate: float
    reason: str
    hicache_write_policy: str | None = None  # with a host tier only
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("pool_tokens", "policy", "host_pool_tokens", "hit_rate",
                                        "reason", "hicache_write_policy")

    def to_json(self) -> JsonObject:
        out: JsonObject = {}
        for k in self._KEYS:
            put(out, k, getattr(self, k))
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> CacheRecommendation:
        d = obj(data, where)
        return cls(pool_tokens=integer(d, "pool_tokens", where), policy=text(d, "policy", where),
                   host_pool_tokens=integer(d, "host_pool_tokens", where),
                   hit_rate=num(d, "hit_rate", where), reason=text(d, "reason", where),
                   hicache_write_policy=opt_text(d, "hicache_write_policy", where),
                   extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheDoc:
    """The whole chatfleet.cache/1 document."""

    trace: TraceInfo
    target: View
    working_set_tokens: WorkingSet
    unbounded: Unbounded
    hold_tolerance: float
    thrash_gap: float
    results: tuple[CacheResult, ...]
    recommendation: CacheRecommendation
    schema: str = CACHE_SCHEMA
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "schema", "trace", "target", "working_set_tokens", "unbounded", "hold_tolerance",
        "thrash_gap", "results", "recommendation")

    def to_json(self) -> JsonObject:
        return with_extra({
            "schema": self.schema,
            "trace": self.trace.to_json(),
            "target": self.target.to_json(),
            "working_set_tokens": self.working_set_tokens.to_json(),
            "unbounded": self.unbounded.to_json(),
            "hold_tolerance": self.hold_tolerance,
            "thrash_gap": self.thrash_gap,
            "results": [r.to_json() for r in self.results],
            "recommendation": self.recommendation.to_json(),
        }, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str = "cache") -> CacheDoc:
        d = obj(data, where)
        if d.get("schema") != CACHE_SCHEMA:
            raise DocumentError(f"{where}: schema is {d.get('schema')!r}, not "
                                f"{CACHE_SCHEMA!r}")
        return cls(
            trace=TraceInfo(dict(obj(d.get("trace") or {}, f"{where}: trace"))),
            target=View(dict(obj(d.get("target") or {}, f"{where}: target"))),
            working_set_tokens=WorkingSet.from_json(d.get("working_set_tokens") or {},
                                                    f"{where}: working_set_tokens"),
            unbounded=Unbounded.from_json(d.get("unbounded") or {}, f"{where}: unbounded"),
            hold_tolerance=num(d, "hold_tolerance", where),
            thrash_gap=num(d, "thrash_gap", where),
            results=tuple(CacheResult.from_json(r, f"{where}: result {i}")
                          for i, r in enumerate(seq(d, "results", where) or ())),
            recommendation=CacheRecommendation.from_json(d.get("recommendation") or {},
                                                         f"{where}: recommendation"),
            extra=rest(d, cls._KEYS))
