"""The plan's doubling what-if, typed: an hour at the target users and at twice as many, each
with the thermal model off and on (`DoublingRun`), and for the thermal-on runs what their
load asks of the cooling (`Cooling`)."""

from __future__ import annotations

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
    rest,
    seq,
    text,
    with_extra,
)
from chatfleet.core.documents.sweep import GpuBlock, Quantiles, RequestCounts


@dataclass(frozen=True, slots=True, kw_only=True)
class CoolingProfile:
    """The modelled cooling: inlet temperature, thermal resistance, time constant, the
    slowdown temperature, the loaded clock, and where the profile came from."""

    inlet_c: float
    r_c_per_w: float
    tau_s: float
    slowdown_c: float
    loaded_mhz: float
    source: str
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("inlet_c", "r_c_per_w", "tau_s", "slowdown_c",
                                        "loaded_mhz", "source")

    def to_json(self) -> JsonObject:
        return with_extra({k: getattr(self, k) for k in self._KEYS}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> CoolingProfile:
        d = obj(data, where)
        return cls(inlet_c=num(d, "inlet_c", where), r_c_per_w=num(d, "r_c_per_w", where),
                   tau_s=num(d, "tau_s", where), slowdown_c=num(d, "slowdown_c", where),
                   loaded_mhz=num(d, "loaded_mhz", where), source=text(d, "source", where),
                   extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class Cooling:
    """The thermal verdict of one traffic level: its mix at the loaded clock (busy share,
    prefill share), what that asks of the cooling (`core.engine.thermal.CoolingNeed`'s
    figures), and what the card did under the modelled cooling (held its clock or not, when
    it slowed down, where it settled)."""

    profile: CoolingProfile
    busy_share: float
    prefill_share: float | None
    loaded_power_w: float
    decode_power_w: float
    hold_w: float
    steady_temp_c: float
    holds_clock: bool
    max_inlet_c: float
    max_r_c_per_w: float
    cooling_factor: float
    max_busy_share: float
    held_clock: bool
    slowdown_after_s: float | None
    settled_mhz: float | None
    extra: Extra = field(default_factory=no_extra)

    NEED_KEYS: ClassVar[tuple[str, ...]] = (
        "loaded_power_w", "decode_power_w", "hold_w", "steady_temp_c", "holds_clock",
        "max_inlet_c", "max_r_c_per_w", "cooling_factor", "max_busy_share")

    def to_json(self) -> JsonObject:
        out: JsonObject = {"profile": self.profile.to_json(), "busy_share": self.busy_share,
                               "prefill_share": self.prefill_share}
        out.update({k: getattr(self, k) for k in self.NEED_KEYS})
        out.update(held_clock=self.held_clock, slowdown_after_s=self.slowdown_after_s,
                   settled_mhz=self.settled_mhz)
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> Cooling:
        d = obj(data, where)
        return cls(
            profile=CoolingProfile.from_json(d.get("profile") or {}, f"{where}: profile"),
            busy_share=num(d, "busy_share", where),
            prefill_share=opt_num(d, "prefill_share", where),
            loaded_power_w=num(d, "loaded_power_w", where),
            decode_power_w=num(d, "decode_power_w", where), hold_w=num(d, "hold_w", where),
            steady_temp_c=num(d, "steady_temp_c", where),
            holds_clock=boolean(d, "holds_clock", where),
            max_inlet_c=num(d, "max_inlet_c", where),
            max_r_c_per_w=num(d, "max_r_c_per_w", where),
            cooling_factor=num(d, "cooling_factor", where),
            max_busy_share=num(d, "max_busy_share", where),
            held_clock=boolean(d, "held_clock", where),
            slowdown_after_s=opt_num(d, "slowdown_after_s", where),
            settled_mhz=opt_num(d, "settled_mhz", where),
            extra=rest(d, ("profile", "busy_share", "prefill_share", *cls.NEED_KEYS,
                           "held_clock", "slowdown_after_s", "settled_mhz")))


@dataclass(frozen=True, slots=True, kw_only=True)
class DoublingRun:
    """One run of the doubling what-if: target or doubled traffic, thermal model off or on,
    through a slice of the fleet behind the gateway's code."""

    traffic: str
    thermal_model: bool
    users_simulated: int
    requests: RequestCounts
    shed_share: float
    attainment: float
    admitted_attainment: float | None
    goodput_rps_per_replica: float
    ttft_ms: Quantiles
    tpot_ms: Quantiles
    gateway_queue_max: int | None
    max_in_flight: tuple[int, ...]
    gpu: GpuBlock
    cooling: Cooling | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = (
        "traffic", "thermal_model", "users_simulated", "requests", "shed_share", "attainment",
        "admitted_attainment", "goodput_rps_per_replica", "ttft_ms", "tpot_ms",
        "gateway_queue_max", "max_in_flight", "gpu", "cooling")

    def to_json(self) -> JsonObject:
        out: JsonObject = {
            "traffic": self.traffic, "thermal_model": self.thermal_model,
            "users_simulated": self.users_simulated, "requests": self.requests.to_json(),
            "shed_share": self.shed_share, "attainment": self.attainment,
            "admitted_attainment": self.admitted_attainment,
            "goodput_rps_per_replica": self.goodput_rps_per_replica,
            "ttft_ms": self.ttft_ms.to_json(), "tpot_ms": self.tpot_ms.to_json(),
            "gateway_queue_max": self.gateway_queue_max,
            "max_in_flight": list(self.max_in_flight), "gpu": self.gpu.to_json(),
        }
        if self.cooling is not None:
            out["cooling"] = self.cooling.to_json()
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> DoublingRun:
        d = obj(data, where)
        cooling = d.get("cooling")
        return cls(
            traffic=text(d, "traffic", where), thermal_model=boolean(d, "thermal_model", where),
            users_simulated=integer(d, "users_simulated", where),
            requests=RequestCounts.from_json(d.get("requests") or {}, f"{where}: requests"),
            shed_share=num(d, "shed_share", where), attainment=num(d, "attainment", where),
            admitted_attainment=opt_num(d, "admitted_attainment", where),
            goodput_rps_per_replica=num(d, "goodput_rps_per_replica", where),
            ttft_ms=Quantiles.from_json(d.get("ttft_ms") or {}, f"{where}: ttft_ms"),
            tpot_ms=Quantiles.from_json(d.get("tpot_ms") or {}, f"{where}: tpot_ms"),
            gateway_queue_max=opt_int(d, "gateway_queue_max", where),
            max_in_flight=tuple(seq(d, "max_in_flight", where) or ()),
            gpu=GpuBlock.from_json(d.get("gpu") or {}, f"{where}: gpu"),
            cooling=None if cooling is None else Cooling.from_json(cooling, f"{where}: cooling"),
            extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class Doubling:
    """An hour (`hours`) at the target users and at twice as many, each with the thermal
    model off and on, through `replicas_simulated` of the fleet's `replicas`."""

    hours: float
    users: int
    doubled_users: int
    replicas: int
    replicas_simulated: int
    runs: tuple[DoublingRun, ...]
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("hours", "users", "doubled_users", "replicas",
                                        "replicas_simulated", "runs")

    def to_json(self) -> JsonObject:
        return with_extra({"hours": self.hours, "users": self.users,
                           "doubled_users": self.doubled_users, "replicas": self.replicas,
                           "replicas_simulated": self.replicas_simulated,
                           "runs": [r.to_json() for r in self.runs]}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> Doubling:
        d = obj(data, where)
        return cls(hours=num(d, "hours", where), users=integer(d, "users", where),
                   doubled_users=integer(d, "doubled_users", where),
                   replicas=integer(d, "replicas", where),
                   replicas_simulated=integer(d, "replicas_simulated", where),
                   runs=tuple(DoublingRun.from_json(r, f"{where}: run {i}")
                              for i, r in enumerate(seq(d, "runs", where) or ())),
                   extra=rest(d, cls._KEYS))

