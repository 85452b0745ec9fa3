"""The chatfleet.plan/1 document, typed: `chatfleet plan`'s answer (docs/plan.md).

```
Plan              the pool's figures (first, flat), schema, chatfleet_version, engine_model,
                  target_users, slo, session_profile, recommendation (or why_none),
                  host_tier, doubling, launch, gateway_config, by_precision, sweeps
  Recommendation  the precision, users per card, caps, fleet size, why, its source point
  PrecisionEntry  one precision's figures (PrecisionFigures), pool, accuracy verdict, fleet,
                  host tier, launch commands, the figures' range under the twin's error
                  band (Uncertainty)
  HostTier        HiCache on or off for the working set, and why
  Doubling        an hour at the target users and at twice as many (DoublingRun, Cooling)
  Launch          an engine's launch command
  SweepRef        where a precision's sweep came from (and the twin's document, embedded)
```

Blocks another part of chatfleet owns and checks are kept as their producer wrote them, with
typed reads of what the plan's consumers need: the pool's figures (`core.memory`), the session
profile (`WorkloadConfig`), the accuracy verdict, the gateway's config file (the gateway's own
parser checks it). `core/documents/fields.py` says how a file reads and writes back the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from chatfleet.core.documents.doubling import Cooling, CoolingProfile, Doubling, DoublingRun
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
    opt_int,
    opt_num,
    opt_obj,
    opt_text,
    put,
    rest,
    seq,
    text,
    with_extra,
)
from chatfleet.core.documents.held_clock import CoolingAssumption, HeldClockFleet
from chatfleet.core.documents.sweep import Knee, Load, SweepDoc, load_from_json
from chatfleet.core.documents.trace_plan import TraceAnswer
from chatfleet.core.slo import SLO

__all__ = [  # the plan's types, wherever they live
    "PLAN_SCHEMA",
    "AccuracyVerdict",
    "Cooling",
    "CoolingAssumption",
    "CoolingProfile",
    "CountEdges",
    "Doubling",
    "DoublingRun",
    "FigureSource",
    "HeldClockFleet",
    "HostTier",
    "KneeEdges",
    "Launch",
    "Plan",
    "PoolFigures",
    "PrecisionEntry",
    "PrecisionFigures",
    "Recommendation",
    "SweepRef",
    "TraceAnswer",
    "Uncertainty",
]

PLAN_SCHEMA = "chatfleet.plan/1"


class PoolFigures(View):
    """The KV pool of the plan's card and precision (`core.memory`'s PoolPlan or VLLMPoolPlan,
    with what fits in it)."""

    __slots__ = ()

    @property
    def gpu(self) -> str:
        return str(self.fields.get("gpu", ""))

    @property
    def model(self) -> str:
        return str(self.fields.get("model", ""))

    @property
    def calibrated(self) -> bool:
        return bool(self.fields.get("calibrated", False))

    @property
    def kv_pool_tokens(self) -> int:
        return int(self.fields.get("kv_pool_tokens", 0))


class AccuracyVerdict(View):
    """Whether an accuracy result allows a precision, and why (`core.plan.accuracy_verdicts`:
    allowed, checked, and where there was a result the accuracy, the paired difference, its
    interval and the margin)."""

    __slots__ = ()

    @property
    def allowed(self) -> bool:
        return bool(self.fields.get("allowed", True))

    @property
    def checked(self) -> bool:
        return bool(self.fields.get("checked", False))

    @property
    def why(self) -> str:
        return str(self.fields.get("why", ""))


@dataclass(frozen=True, slots=True, kw_only=True)
class FigureSource:
    """Where a precision's figures came from: the sweep (a file, or "twin"), the index of the
    knee point in its points and that point's load, and the open-loop knee's point."""

    sweep: str
    point: int | None = None
    load: Load | None = None
    rate_point: int | None = None
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"sweep": self.sweep, "point": self.point,
                           "load": None if self.load is None else self.load.to_json(),
                           "rate_point": self.rate_point}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> FigureSource:
        d = obj(data, where)
        load = d.get("load")
        return cls(sweep=text(d, "sweep", where), point=opt_int(d, "point", where),
                   load=None if load is None else load_from_json(load, f"{where}: load"),
                   rate_point=opt_int(d, "rate_point", where),
                   extra=rest(d, ("sweep", "point", "load", "rate_point")))


@dataclass(frozen=True, slots=True)
class PrecisionFigures:
    """One precision's figures at its knee, each traceable to a sweep point (`source`)."""

    name: str  # the precision's key in by_precision: bf16, fp8, W/KV
    weights: str
    kv_cache: str
    users_per_card: int | None
    gateway_cap: int | None
    goodput_rps: float | None
    output_tok_s: float | None
    ttft_p99_ms: float | None  # at the knee: what the gateway keeps of the budget for prefill
    rate_rps: float | None
    knee: Knee
    knee_rate: Knee
    source: FigureSource

    KEYS: ClassVar[tuple[str, ...]] = (
        "weights", "kv_cache", "users_per_card", "gateway_cap", "engine_guard", "goodput_rps",
        "output_tok_s", "ttft_p99_ms", "rate_rps_per_replica", "knee", "knee_rate", "source")

    def to_json(self) -> JsonObject:
        return {
            "weights": self.weights, "kv_cache": self.kv_cache,
            "users_per_card": self.users_per_card, "gateway_cap": self.gateway_cap,
            "engine_guard": self.gateway_cap, "goodput_rps": self.goodput_rps,
            "output_tok_s": self.output_tok_s, "ttft_p99_ms": self.ttft_p99_ms,
            "rate_rps_per_replica": self.rate_rps,
            "knee": self.knee.to_json(), "knee_rate": self.knee_rate.to_json(),
            "source": self.source.to_json(),
        }

    @classmethod
    def from_json(cls, name: str, d: Mapping[str, Any], where: str) -> PrecisionFigures:
        return cls(name=name, weights=text(d, "weights", where),
                   kv_cache=text(d, "kv_cache", where),
                   users_per_card=opt_int(d, "users_per_card", where),
                   gateway_cap=opt_int(d, "gateway_cap", where),
                   goodput_rps=opt_num(d, "goodput_rps", where),
                   output_tok_s=opt_num(d, "output_tok_s", where),
                   ttft_p99_ms=opt_num(d, "ttft_p99_ms", where),
                   rate_rps=opt_num(d, "rate_rps_per_replica", where),
                   knee=Knee.from_json(d.get("knee") or {}, f"{where}: knee"),
                   knee_rate=Knee.from_json(d.get("knee_rate") or {}, f"{where}: knee_rate"),
                   source=FigureSource.from_json(d.get("source") or {"sweep": ""},
                                                 f"{where}: source"))


@dataclass(frozen=True, slots=True, kw_only=True)
class HostTier:
    """The method's host-tier rule on a card's working set: HiCache on (with its
    --hicache-ratio) only when the working set outgrows the pool and fits pool + host."""

    enable: bool
    why: str
    hicache_ratio: float | None = None
    working_set_tokens: int | None = None
    host_tokens: int | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("enable", "hicache_ratio", "why", "working_set_tokens",
                                        "host_tokens")

    def to_json(self) -> JsonObject:
        out: JsonObject = {"enable": self.enable}
        put(out, "hicache_ratio", self.hicache_ratio)
        out["why"] = self.why
        put(out, "working_set_tokens", self.working_set_tokens)
        put(out, "host_tokens", self.host_tokens)
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> HostTier:
        d = obj(data, where)
        return cls(enable=boolean(d, "enable", where), why=text(d, "why", where),
                   hicache_ratio=opt_num(d, "hicache_ratio", where),
                   working_set_tokens=opt_int(d, "working_set_tokens", where),
                   host_tokens=opt_int(d, "host_tokens", where), extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    """An engine's launch command for one replica: argv, environment, the shell line, notes."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    shell: str
    notes: tuple[str, ...] = ()
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"argv": list(self.argv), "env": dict(self.env), "shell": self.shell,
                           "notes": list(self.notes)}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> Launch:
        d = obj(data, where)
        return cls(argv=tuple(seq(d, "argv", where) or ()),
                   env=dict(opt_obj(d, "env", where) or {}), shell=text(d, "shell", where),
                   notes=tuple(seq(d, "notes", where) or ()),
                   extra=rest(d, ("argv", "env", "shell", "notes")))


def _launches(data: Any, where: str) -> dict[str, Launch]:
    return {k: Launch.from_json(v, f"{where}: {k}") for k, v in obj(data, where).items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Recommendation:
    """The precision to serve and its figures: users per card, the gateway cap and the engine
    guard at the same count, goodput at the target, the fleet for the target users with its
    headroom, why this precision, and the knee point it came from."""

    precision: str
    weights: str
    kv_cache: str
    users_per_card: int
    gateway_cap: int
    engine_guard: int
    goodput_rps: float | None
    replicas: int
    cards: int
    headroom: float
    why: str
    source: FigureSource
    cooling: CoolingAssumption | None = None  # the cooling the fleet assumes (a twin plan's)
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "precision", "weights", "kv_cache", "users_per_card", "gateway_cap", "engine_guard",
        "goodput_rps", "replicas", "cards", "headroom", "why", "source", "cooling")

    def to_json(self) -> JsonObject:
        out = {k: getattr(self, k) for k in self._KEYS[:-2]}
        out["source"] = self.source.to_json()
        if self.cooling is not None:
            out["cooling"] = self.cooling.to_json()
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> Recommendation:
        d = obj(data, where)
        return cls(precision=text(d, "precision", where), weights=text(d, "weights", where),
                   kv_cache=text(d, "kv_cache", where),
                   users_per_card=integer(d, "users_per_card", where),
                   gateway_cap=integer(d, "gateway_cap", where),
                   engine_guard=integer(d, "engine_guard", where),
                   goodput_rps=opt_num(d, "goodput_rps", where),
                   replicas=integer(d, "replicas", where), cards=integer(d, "cards", where),
                   headroom=num(d, "headroom", where), why=text(d, "why", where),
                   source=FigureSource.from_json(d.get("source") or {"sweep": ""},
                                                 f"{where}: source"),
                   cooling=(None if d.get("cooling") is None
                            else CoolingAssumption.from_json(d["cooling"], f"{where}: cooling")),
                   extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True)
class KneeEdges:
    """A knee at the two edges of the error band: every step slower, and every step faster."""

    slower: Knee
    faster: Knee
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"slower": self.slower.to_json(), "faster": self.faster.to_json()},
                          self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> KneeEdges:
        d = obj(data, where)
        return cls(Knee.from_json(d.get("slower") or {}, f"{where}.slower"),
                   Knee.from_json(d.get("faster") or {}, f"{where}.faster"),
                   rest(d, ("slower", "faster")))


@dataclass(frozen=True, slots=True)
class CountEdges:
    """A count (users per card, cards) at the two edges of the error band."""

    slower: int | None
    faster: int | None
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"slower": self.slower, "faster": self.faster}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> CountEdges:
        d = obj(data, where)
        return cls(opt_int(d, "slower", where), opt_int(d, "faster", where),
                   rest(d, ("slower", "faster")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Uncertainty:
    """A twin plan's figures under its error band: the same sweep with every step
    (1 + error_band) times as long ("slower") and (1 - error_band) times ("faster"). The knee
    lies between the two with the band's confidence; users per card and cards for the target
    users follow from each (fewer users and more cards from the slower)."""

    error_band: float
    source: str
    knee: KneeEdges
    knee_rate: KneeEdges
    users_per_card: CountEdges
    cards: CountEdges
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("error_band", "source", "knee", "knee_rate",
                                        "users_per_card", "cards")

    def to_json(self) -> JsonObject:
        return with_extra({
            "error_band": self.error_band, "source": self.source, "knee": self.knee.to_json(),
            "knee_rate": self.knee_rate.to_json(),
            "users_per_card": self.users_per_card.to_json(), "cards": self.cards.to_json()},
            self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> Uncertainty:
        d = obj(data, where)
        return cls(error_band=num(d, "error_band", where), source=text(d, "source", where),
                   knee=KneeEdges.from_json(d.get("knee") or {}, f"{where}: knee"),
                   knee_rate=KneeEdges.from_json(d.get("knee_rate") or {},
                                                 f"{where}: knee_rate"),
                   users_per_card=CountEdges.from_json(d.get("users_per_card") or {},
                                                       f"{where}: users_per_card"),
                   cards=CountEdges.from_json(d.get("cards") or {}, f"{where}: cards"),
                   extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class PrecisionEntry:
    """One precision of `by_precision`: its figures, its pool, the accuracy verdict, and for a
    precision with a knee the fleet size, the host tier and the launch commands."""

    figures: PrecisionFigures
    pool: PoolFigures
    accuracy: AccuracyVerdict
    replicas: int | None = None
    cards: int | None = None
    host_tier: HostTier | None = None
    launch: Mapping[str, Launch] | None = None
    uncertainty: Uncertainty | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = (*PrecisionFigures.KEYS, "pool", "accuracy", "replicas",
                                        "cards", "host_tier", "launch", "uncertainty")

    def to_json(self) -> JsonObject:
        out = {**self.figures.to_json(), "pool": self.pool.to_json(),
               "accuracy": self.accuracy.to_json()}
        put(out, "replicas", self.replicas)
        put(out, "cards", self.cards)
        if self.host_tier is not None:
            out["host_tier"] = self.host_tier.to_json()
        if self.launch is not None:
            out["launch"] = {k: v.to_json() for k, v in self.launch.items()}
        if self.uncertainty is not None:
            out["uncertainty"] = self.uncertainty.to_json()
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, name: str, data: Any, where: str) -> PrecisionEntry:
        d = obj(data, where)
        tier, launch, band = d.get("host_tier"), d.get("launch"), d.get("uncertainty")
        return cls(figures=PrecisionFigures.from_json(name, d, where),
                   pool=PoolFigures(dict(obj(d.get("pool") or {}, f"{where}: pool"))),
                   accuracy=AccuracyVerdict(dict(obj(d.get("accuracy") or {},
                                                     f"{where}: accuracy"))),
                   replicas=opt_int(d, "replicas", where), cards=opt_int(d, "cards", where),
                   host_tier=None if tier is None else HostTier.from_json(tier,
                                                                          f"{where}: host_tier"),
                   launch=None if launch is None else _launches(launch, f"{where}: launch"),
                   uncertainty=None if band is None
                   else Uncertainty.from_json(band, f"{where}: uncertainty"),
                   extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True)
class SweepRef:
    """Where a precision's sweep came from: a file's path, or "twin" (then the document the
    plan ran is embedded)."""

    source: str
    document: SweepDoc | None = None
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"source": self.source,
                           "document": None if self.document is None
                           else self.document.to_json()}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> SweepRef:
        d = obj(data, where)
        doc = d.get("document")
        return cls(text(d, "source", where),
                   None if doc is None else SweepDoc.from_json(doc, f"{where}: document"),
                   rest(d, ("source", "document")))


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The whole answer (docs/plan.md): the pool of the recommended precision (or the first
    swept, when none is recommended) first, then the plan's own keys."""

    pool: PoolFigures
    chatfleet_version: str
    engine_model: str
    target_users: int
    slo: SLO
    session_profile: Mapping[str, Any]
    recommendation: Recommendation | None
    by_precision: Mapping[str, PrecisionEntry]
    sweeps: Mapping[str, SweepRef]
    why_none: str | None = None
    host_tier: HostTier | None = None
    doubling: Doubling | None = None
    launch: Mapping[str, Launch] | None = None
    gateway_config: Mapping[str, Any] | None = None  # the gateway's config file, as written
    # where the twin's constants come from (core/provenance.py): fitted, borrowed, assumed
    calibration: Mapping[str, Any] | None = None
    held_clock: HeldClockFleet | None = None  # the fleet at the clock a throttled card holds
    trace: TraceAnswer | None = None  # `plan --trace`: the trace and its replays
    schema: str = PLAN_SCHEMA
    slo_extra: Extra = field(default_factory=no_extra)
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "schema", "chatfleet_version", "engine_model", "target_users", "slo",
        "session_profile", "recommendation", "why_none", "calibration", "host_tier",
        "doubling", "held_clock", "trace", "launch", "gateway_config", "by_precision", "sweeps")

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            **self.pool.to_json(),
            "schema": self.schema,
            "chatfleet_version": self.chatfleet_version,
            "engine_model": self.engine_model,
            "target_users": self.target_users,
            "slo": with_extra(self.slo.to_json(), self.slo_extra),
            "session_profile": dict(self.session_profile),
            "recommendation": (None if self.recommendation is None
                               else self.recommendation.to_json()),
        }
        put(out, "why_none", self.why_none)
        if self.calibration is not None:
            out["calibration"] = dict(self.calibration)
        if self.host_tier is not None:
            out["host_tier"] = self.host_tier.to_json()
        if self.doubling is not None:
            out["doubling"] = self.doubling.to_json()
        if self.held_clock is not None:
            out["held_clock"] = self.held_clock.to_json()
        if self.trace is not None:
            out["trace"] = self.trace.to_json()
        if self.launch is not None:
            out["launch"] = {k: v.to_json() for k, v in self.launch.items()}
        if self.gateway_config is not None:
            out["gateway_config"] = dict(self.gateway_config)
        out["by_precision"] = {k: v.to_json() for k, v in self.by_precision.items()}
        out["sweeps"] = {k: v.to_json() for k, v in self.sweeps.items()}
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str = "plan") -> Plan:
        """A chatfleet.plan/1 document. The pool's figures are the keys before "schema" (the
        plan writes them first)."""
        d = obj(data, where)
        if d.get("schema") != PLAN_SCHEMA:
            raise DocumentError(f"{where}: schema is {d.get('schema')!r}, not {PLAN_SCHEMA!r}")
        keys = list(d)
        pool = {k: d[k] for k in keys[:keys.index("schema")]}
        slo_data = obj(d.get("slo") or {}, f"{where}: slo")
        try:
            slo = SLO.from_json(slo_data)
        except (TypeError, ValueError) as exc:
            raise DocumentError(f"{where}: bad 'slo' block: {exc}") from exc
        rec, tier, doubling = d.get("recommendation"), d.get("host_tier"), d.get("doubling")
        launch, gateway, cal = d.get("launch"), d.get("gateway_config"), d.get("calibration")
        held, trace = d.get("held_clock"), d.get("trace")
        return cls(
            pool=PoolFigures(pool),
            chatfleet_version=text(d, "chatfleet_version", where),
            engine_model=text(d, "engine_model", where, "sglang"),
            target_users=integer(d, "target_users", where),
            slo=slo,
            session_profile=dict(obj(d.get("session_profile") or {},
                                     f"{where}: session_profile")),
            recommendation=None if rec is None
            else Recommendation.from_json(rec, f"{where}: recommendation"),
            by_precision={k: PrecisionEntry.from_json(k, v, f"{where}: by_precision.{k}")
                          for k, v in obj(d.get("by_precision") or {},
                                          f"{where}: by_precision").items()},
            sweeps={k: SweepRef.from_json(v, f"{where}: sweeps.{k}")
                    for k, v in obj(d.get("sweeps") or {}, f"{where}: sweeps").items()},
            why_none=opt_text(d, "why_none", where),
            host_tier=None if tier is None else HostTier.from_json(tier, f"{where}: host_tier"),
            doubling=None if doubling is None else Doubling.from_json(doubling,
                                                                      f"{where}: doubling"),
            launch=None if launch is None else _launches(launch, f"{where}: launch"),
            gateway_config=None if gateway is None
            else dict(obj(gateway, f"{where}: gateway_config")),
            calibration=None if cal is None else dict(obj(cal, f"{where}: calibration")),
            held_clock=None if held is None else HeldClockFleet.from_json(
                held, f"{where}: held_clock"),
            trace=None if trace is None else TraceAnswer(dict(obj(trace, f"{where}: trace"))),
            slo_extra=rest(slo_data, ("ttft_ms", "tpot_ms", "itl_stat", "attainment")),
            extra=rest(d, (*pool, *cls._KEYS)),
        )
