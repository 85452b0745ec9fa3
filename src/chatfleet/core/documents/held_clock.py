"""A plan's answer when the card throttles (issue 25 item 5), typed: which cooling the
recommended fleet assumes (`CoolingAssumption`), and the fleet sized at the clock the card
holds under the modelled cooling (`HeldClockFleet`), beside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from chatfleet.core.documents.doubling import DoublingRun
from chatfleet.core.documents.fields import (
    Extra,
    JsonObject,
    boolean,
    no_extra,
    num,
    obj,
    opt_int,
    opt_num,
    rest,
    text,
    with_extra,
)
from chatfleet.core.documents.sweep import Knee, SweepDoc


@dataclass(frozen=True, slots=True, kw_only=True)
class CoolingAssumption:
    """The cooling the recommendation's fleet is sized for: the SM clock its sweeps ran at,
    whether the modelled cooling holds that clock at the recommended load, and if not the
    thermal resistance (at the modelled inlet) that would."""

    clock_mhz: float
    modelled_cooling_holds: bool
    inlet_c: float
    modelled_r_c_per_w: float
    needs_r_c_per_w: float | None  # None: the modelled cooling holds the clock
    note: str
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("clock_mhz", "modelled_cooling_holds", "inlet_c",
                                        "modelled_r_c_per_w", "needs_r_c_per_w", "note")

    def to_json(self) -> JsonObject:
        return with_extra({k: getattr(self, k) for k in self._KEYS}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> CoolingAssumption:
        d = obj(data, where)
        return cls(clock_mhz=num(d, "clock_mhz", where),
                   modelled_cooling_holds=boolean(d, "modelled_cooling_holds", where),
                   inlet_c=num(d, "inlet_c", where),
                   modelled_r_c_per_w=num(d, "modelled_r_c_per_w", where),
                   needs_r_c_per_w=opt_num(d, "needs_r_c_per_w", where),
                   note=text(d, "note", where), extra=rest(d, cls._KEYS))


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldClockFleet:
    """The fleet at the clock the card holds under the modelled cooling: the recommended
    precision swept with every step as long as at `clock_mhz` (core/held_clock.py), its knee,
    users per card, cap and fleet for the same users and headroom, and an hour of the target
    traffic on a slice of that fleet with the thermal model on (`check`): what its card's
    clock and its admitted users do."""

    clock_mhz: float
    source: str  # where the clock comes from
    knee: Knee
    users_per_card: int | None
    gateway_cap: int | None
    replicas: int | None
    cards: int | None
    why: str
    check: DoublingRun | None = None
    sweep: SweepDoc | None = None
    extra: Extra = field(default_factory=no_extra)

    _KEYS: ClassVar[tuple[str, ...]] = ("clock_mhz", "source", "knee", "users_per_card",
                                        "gateway_cap", "replicas", "cards", "why", "check",
                                        "sweep")

    def to_json(self) -> JsonObject:
        return with_extra({
            "clock_mhz": self.clock_mhz, "source": self.source, "knee": self.knee.to_json(),
            "users_per_card": self.users_per_card, "gateway_cap": self.gateway_cap,
            "replicas": self.replicas, "cards": self.cards, "why": self.why,
            "check": None if self.check is None else self.check.to_json(),
            "sweep": None if self.sweep is None else self.sweep.to_json()}, self.extra)

    @classmethod
    def from_json(cls, data: Any, where: str) -> HeldClockFleet:
        d = obj(data, where)
        check, sweep = d.get("check"), d.get("sweep")
        return cls(clock_mhz=num(d, "clock_mhz", where), source=text(d, "source", where),
                   knee=Knee.from_json(d.get("knee") or {}, f"{where}: knee"),
                   users_per_card=opt_int(d, "users_per_card", where),
                   gateway_cap=opt_int(d, "gateway_cap", where),
                   replicas=opt_int(d, "replicas", where), cards=opt_int(d, "cards", where),
                   why=text(d, "why", where),
                   check=None if check is None else DoublingRun.from_json(check,
                                                                          f"{where}: check"),
                   sweep=None if sweep is None else SweepDoc.from_json(sweep,
                                                                       f"{where}: sweep"),
                   extra=rest(d, cls._KEYS))
