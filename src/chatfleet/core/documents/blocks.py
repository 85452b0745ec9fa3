"""The blocks of a sweep point: its percentiles, request counts, and what the engine, the GPU
and the client showed over the window (`core.documents.sweep` assembles them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from chatfleet.core.documents.fields import (
    Extra,
    JsonObject,
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
    with_extra,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Quantiles:
    """Percentiles of one figure, in ms (linear interpolation, `core.measure.percentiles`),
    and `n`, the number of values behind them. ttft_ms has p50, p90, p99; itl_ms p50, p90,
    p99 and max; tpot_ms and e2e_ms p50 and p99. With no value, every figure is 0."""

    p50: float = 0.0
    p90: float | None = None
    p99: float = 0.0
    max: float | None = None
    n: int | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("p50", "p90", "p99", "max", "n")

    def get(self, key: str) -> float | None:
        """A figure by its key ("p50", "p99", "max", ...), None where the block has none."""
        if key in self._KEYS:
            value: float | None = getattr(self, key)
            return value
        got = self.extra.get(key)
        return got if isinstance(got, int | float) and not isinstance(got, bool) else None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"p50": self.p50}
        put(out, "p90", self.p90)
        out["p99"] = self.p99
        put(out, "max", self.max)
        put(out, "n", self.n)
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> Quantiles:
        d = obj(data, where)
        return cls(p50=num(d, "p50", where), p90=opt_num(d, "p90", where),
                   p99=num(d, "p99", where), max=opt_num(d, "max", where),
                   n=opt_int(d, "n", where), extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestCounts:
    """The window's requests: offered (all of them), completed (ok), met_slo, shed, failed
    (error, timeout, cancelled), admitted (offered - shed); finished_in_window: ok requests of
    any send time whose last token arrived in the window."""

    offered: int = 0
    completed: int = 0
    met_slo: int = 0
    shed: int = 0
    failed: int = 0
    admitted: int | None = None
    finished_in_window: int | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("offered", "completed", "met_slo", "shed", "failed",
                                        "admitted", "finished_in_window")

    def to_json(self) -> JsonObject:
        out: JsonObject = {"offered": self.offered, "completed": self.completed,
                               "met_slo": self.met_slo, "shed": self.shed, "failed": self.failed}
        put(out, "admitted", self.admitted)
        put(out, "finished_in_window", self.finished_in_window)
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> RequestCounts:
        d = obj(data, where)
        return cls(offered=integer(d, "offered", where), completed=integer(d, "completed", where),
                   met_slo=integer(d, "met_slo", where), shed=integer(d, "shed", where),
                   failed=integer(d, "failed", where), admitted=opt_int(d, "admitted", where),
                   finished_in_window=opt_int(d, "finished_in_window", where),
                   extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineBlock:
    """The engine's figures, read at decode steps after the warm-up as SGLang's decode log
    reports them: the largest decode batch, the longest waiting queue, the highest token
    usage (None where a live engine exposed no metric). The twin adds its pool, replicas,
    retractions, cache hit rate and evicted tokens; a live sweep the number of scrapes and
    their source (and a scraper's summary its failed scrapes and the last error)."""

    max_running: int | None = 0
    max_queue: int | None = 0
    peak_token_usage: float | None = 0.0
    # the twin's
    max_total_num_tokens: int | None = None
    replicas: int | None = None
    num_retractions: int | None = None
    cache_hit_rate: float | None = None
    evicted_tokens: int | None = None
    # a live sweep's scraper
    scrapes: int | None = None
    source: str | None = None
    failures: int | None = None
    last_error: str | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "max_running", "max_queue", "peak_token_usage", "max_total_num_tokens", "replicas",
        "num_retractions", "cache_hit_rate", "evicted_tokens", "scrapes", "source", "failures",
        "last_error")

    def to_json(self) -> JsonObject:
        out: JsonObject = {"max_running": self.max_running, "max_queue": self.max_queue,
                               "peak_token_usage": self.peak_token_usage}
        for key in self._KEYS[3:]:
            put(out, key, getattr(self, key))
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> EngineBlock:
        d = obj(data, where)
        return cls(
            max_running=opt_int(d, "max_running", where) if "max_running" in d else 0,
            max_queue=opt_int(d, "max_queue", where) if "max_queue" in d else 0,
            peak_token_usage=(opt_num(d, "peak_token_usage", where)
                              if "peak_token_usage" in d else 0.0),
            max_total_num_tokens=opt_int(d, "max_total_num_tokens", where),
            replicas=opt_int(d, "replicas", where),
            num_retractions=opt_int(d, "num_retractions", where),
            cache_hit_rate=opt_num(d, "cache_hit_rate", where),
            evicted_tokens=opt_int(d, "evicted_tokens", where),
            scrapes=opt_int(d, "scrapes", where), source=opt_text(d, "source", where),
            failures=opt_int(d, "failures", where), last_error=opt_text(d, "last_error", where),
            extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClockStats:
    """The SM clock over the window, MHz: the time-weighted median and the lowest."""

    p50: float | None = 0
    min: float | None = 0
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"p50": self.p50, "min": self.min}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> ClockStats:
        d = obj(data, where)
        return cls(p50=opt_num(d, "p50", where) if "p50" in d else 0,
                   min=opt_num(d, "min", where) if "min" in d else 0,
                   extra=rest(d, ("p50", "min")))


@dataclass(frozen=True, slots=True, kw_only=True)
class TempStats:
    """The highest GPU temperature over the window, C (None where the source has none)."""

    max: float | None = 0
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"max": self.max}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> TempStats:
        d = obj(data, where)
        return cls(max=opt_num(d, "max", where) if "max" in d else 0,
                   extra=rest(d, ("max",)))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelledPower:
    """The twin's power: the window's mean, and what the work draws at the loaded clock, W."""

    mean: float
    at_loaded_clock: float
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"mean": self.mean, "at_loaded_clock": self.at_loaded_clock},
                          self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> ModelledPower:
        d = obj(data, where)
        return cls(mean=num(d, "mean", where), at_loaded_clock=num(d, "at_loaded_clock", where),
                   extra=rest(d, ("mean", "at_loaded_clock")))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelledGpu:
    """What the twin's steps say of the card: the busy share of the window, the prefill share
    of the busy time, the power, when the first throttled step ended (from the run's start),
    whether the thermal model ran. Written with "modelled": true."""

    busy_share: float
    prefill_share: float | None
    power_w: ModelledPower
    slowdown_after_s: float | None
    thermal_model: bool

    KEYS: ClassVar[tuple[str, ...]] = ("busy_share", "prefill_share", "modelled", "power_w",
                                       "slowdown_after_s", "thermal_model")

    def write(self, out: JsonObject) -> None:
        out.update(busy_share=self.busy_share, prefill_share=self.prefill_share, modelled=True,
                   power_w=self.power_w.to_json(), slowdown_after_s=self.slowdown_after_s,
                   thermal_model=self.thermal_model)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str) -> ModelledGpu:
        return cls(busy_share=num(d, "busy_share", where),
                   prefill_share=opt_num(d, "prefill_share", where),
                   power_w=ModelledPower.from_json(d.get("power_w"), f"{where}: power_w"),
                   slowdown_after_s=opt_num(d, "slowdown_after_s", where),
                   thermal_model=boolean(d, "thermal_model", where))


@dataclass(frozen=True, slots=True, kw_only=True)
class SampledPower:
    """Live power over the window, W: the time-weighted median and the highest sample."""

    p50: float | None = None
    max: float | None = None
    extra: Extra = field(default_factory=no_extra)

    def to_json(self) -> JsonObject:
        return with_extra({"p50": self.p50, "max": self.max}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> SampledPower:
        d = obj(data, where)
        return cls(p50=opt_num(d, "p50", where), max=opt_num(d, "max", where),
                   extra=rest(d, ("p50", "max")))


@dataclass(frozen=True, slots=True, kw_only=True)
class SampledGpu:
    """What live telemetry saw: the power, the number of samples, the median interval between
    them (model ms, and wall ms), the share of samples each clock-event reason was seen in;
    and from the sampler: the source, its failed reads, samples dropped beyond its memory
    bound, the last error and a note."""

    power_w: SampledPower = field(default_factory=SampledPower)
    samples: int = 0
    interval_ms_p50: float | None = None
    interval_wall_ms_p50: float | None = None
    reasons_share: Mapping[str, float] = field(default_factory=dict)
    source: str | None = None
    failures: int | None = None
    dropped: int | None = None
    last_error: str | None = None
    note: str | None = None

    KEYS: ClassVar[tuple[str, ...]] = (
        "power_w", "samples", "interval_ms_p50", "interval_wall_ms_p50", "reasons_share",
        "source", "failures", "dropped", "last_error", "note")

    def write(self, out: JsonObject) -> None:
        out.update(power_w=self.power_w.to_json(), samples=self.samples,
                   interval_ms_p50=self.interval_ms_p50,
                   interval_wall_ms_p50=self.interval_wall_ms_p50,
                   reasons_share=dict(self.reasons_share))
        for key in self.KEYS[5:]:
            put(out, key, getattr(self, key))

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str) -> SampledGpu:
        reasons = opt_obj(d, "reasons_share", where) or {}
        return cls(power_w=SampledPower.from_json(d.get("power_w") or {}, f"{where}: power_w"),
                   samples=integer(d, "samples", where),
                   interval_ms_p50=opt_num(d, "interval_ms_p50", where),
                   interval_wall_ms_p50=opt_num(d, "interval_wall_ms_p50", where),
                   reasons_share=dict(reasons), source=opt_text(d, "source", where),
                   failures=opt_int(d, "failures", where), dropped=opt_int(d, "dropped", where),
                   last_error=opt_text(d, "last_error", where), note=opt_text(d, "note", where))


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuBlock:
    """The card over the window: SM clock (time-weighted median and lowest), the highest
    temperature, the share of time (samples) in thermal slowdown. The twin adds what its steps
    say (`modelled`), live telemetry what it sampled (`sampled`); None where neither ran."""

    sm_clock_mhz: ClockStats = field(default_factory=ClockStats)
    temp_c: TempStats = field(default_factory=TempStats)
    thermal_slowdown_share: float | None = 0.0
    modelled: ModelledGpu | None = None
    sampled: SampledGpu | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("sm_clock_mhz", "temp_c", "thermal_slowdown_share")

    def to_json(self) -> JsonObject:
        out: JsonObject = {"sm_clock_mhz": self.sm_clock_mhz.to_json(),
                               "temp_c": self.temp_c.to_json(),
                               "thermal_slowdown_share": self.thermal_slowdown_share}
        if self.modelled is not None:
            self.modelled.write(out)
        if self.sampled is not None:
            self.sampled.write(out)
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> GpuBlock:
        d = obj(data, where)
        modelled = ModelledGpu.from_json(d, where) if d.get("modelled") is True else None
        sampled = SampledGpu.from_json(d, where) if modelled is None and "samples" in d \
            else None
        known = set(cls._KEYS)
        if modelled is not None:
            known.update(ModelledGpu.KEYS)
        if sampled is not None:
            known.update(SampledGpu.KEYS)
        return cls(sm_clock_mhz=ClockStats.from_json(d.get("sm_clock_mhz", {}),
                                                     f"{where}: sm_clock_mhz"),
                   temp_c=TempStats.from_json(d.get("temp_c", {}), f"{where}: temp_c"),
                   thermal_slowdown_share=(opt_num(d, "thermal_slowdown_share", where)
                                           if "thermal_slowdown_share" in d else 0.0),
                   modelled=modelled, sampled=sampled, extra=rest(d, known))


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientBlock:
    """The client's own lag over the window, ms: p99 of the send lag (sent later than
    scheduled) and of the event loop's lag. A live sweep adds their maxima, the run's send-lag
    p99 (warm-up and drain included) and the validity bounds [send, loop]."""

    send_lag_ms_p99: float = 0.0
    loop_lag_ms_p99: float = 0.0
    send_lag_ms_max: float | None = None
    loop_lag_ms_max: float | None = None
    run_send_lag_ms_p99: float | None = None
    bounds_ms: tuple[float, float] | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("send_lag_ms_p99", "loop_lag_ms_p99", "send_lag_ms_max",
                                        "loop_lag_ms_max", "run_send_lag_ms_p99", "bounds_ms")

    def to_json(self) -> JsonObject:
        out: JsonObject = {"send_lag_ms_p99": self.send_lag_ms_p99,
                               "loop_lag_ms_p99": self.loop_lag_ms_p99}
        put(out, "send_lag_ms_max", self.send_lag_ms_max)
        put(out, "loop_lag_ms_max", self.loop_lag_ms_max)
        put(out, "run_send_lag_ms_p99", self.run_send_lag_ms_p99)
        if self.bounds_ms is not None:
            out["bounds_ms"] = list(self.bounds_ms)
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> ClientBlock:
        d = obj(data, where)
        bounds = seq(d, "bounds_ms", where)
        return cls(send_lag_ms_p99=num(d, "send_lag_ms_p99", where),
                   loop_lag_ms_p99=num(d, "loop_lag_ms_p99", where),
                   send_lag_ms_max=opt_num(d, "send_lag_ms_max", where),
                   loop_lag_ms_max=opt_num(d, "loop_lag_ms_max", where),
                   run_send_lag_ms_p99=opt_num(d, "run_send_lag_ms_p99", where),
                   bounds_ms=(bounds[0], bounds[1]) if bounds is not None and len(bounds) == 2
                   else None,
                   extra=rest(d, cls._KEYS if bounds is None or len(bounds) == 2
                              else cls._KEYS[:-1]))

