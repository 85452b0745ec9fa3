"""A sweep's load point, typed: a closed loop of N users, or an open loop at a rate with its
arrival process. Written {"mode": "closed", "concurrency": N} or {"mode": "open", "rate_rps":
R, "arrival": "poisson" | "gamma:B", "burstiness": B} (the last two optional)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from chatfleet.core.documents.fields import (
    DocumentError,
    Extra,
    JsonObject,
    integer,
    no_extra,
    num,
    obj,
    opt_num,
    opt_text,
    put,
    rest,
    with_extra,
)

Mode = Literal["open", "closed"]
MODES: tuple[Mode, ...] = ("open", "closed")


def check_mode(mode: str) -> Mode:
    if mode not in MODES:
        raise ValueError(f"mode must be 'open' or 'closed', not {mode!r}")
    return mode


@dataclass(frozen=True, slots=True)
class ClosedLoad:
    """N users in a closed loop: each sends, waits for the last token (and thinks), sends
    again."""

    concurrency: int
    extra: Extra = field(default_factory=no_extra)
    mode: ClassVar[Literal["closed"]] = "closed"

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int):
            raise DocumentError(f"a closed-loop load's concurrency must be an integer, not "
                                f"{self.concurrency!r}")

    @property
    def value(self) -> float:
        """The load as one number: users."""
        return self.concurrency

    def at(self, value: float) -> ClosedLoad:
        """The same load at another user count."""
        return replace(self, concurrency=int(value))

    def to_json(self) -> JsonObject:
        return with_extra({"mode": "closed", "concurrency": self.concurrency}, self.extra)


@dataclass(frozen=True, slots=True)
class OpenLoad:
    """Sessions arriving at `rate_rps` whatever the server does: Poisson (burstiness 1 or
    None), or gamma with shape `burstiness` (< 1 is burstier). `arrival` is the process's
    label as given (poisson, gamma:B)."""

    rate_rps: float
    arrival: str | None = None
    burstiness: float | None = None
    extra: Extra = field(default_factory=no_extra)
    mode: ClassVar[Literal["open"]] = "open"

    def __post_init__(self) -> None:
        if isinstance(self.rate_rps, bool) or not isinstance(self.rate_rps, int | float):
            raise DocumentError(f"an open-loop load's rate_rps must be a number, not "
                                f"{self.rate_rps!r}")

    @property
    def value(self) -> float:
        """The load as one number: requests (sessions) per second."""
        return self.rate_rps

    def at(self, value: float) -> OpenLoad:
        """The same arrival process at another rate."""
        return replace(self, rate_rps=float(value))

    def to_json(self) -> JsonObject:
        out: JsonObject = {"mode": "open", "rate_rps": self.rate_rps}
        put(out, "arrival", self.arrival)
        put(out, "burstiness", self.burstiness)
        return with_extra(out, self.extra)


Load = ClosedLoad | OpenLoad


def load_from_json(data: Any, where: str = "load") -> Load:
    d = obj(data, where)
    mode = d.get("mode")
    if mode == "closed":
        if "concurrency" not in d:
            raise DocumentError(f"{where}: a closed-loop load needs 'concurrency'")
        return ClosedLoad(integer(d, "concurrency", where),
                          rest(d, ("mode", "concurrency")))
    if mode == "open":
        if "rate_rps" not in d:
            raise DocumentError(f"{where}: an open-loop load needs 'rate_rps'")
        return OpenLoad(num(d, "rate_rps", where), opt_text(d, "arrival", where),
                        opt_num(d, "burstiness", where),
                        rest(d, ("mode", "rate_rps", "arrival", "burstiness")))
    raise DocumentError(f"{where}: a load's mode must be 'closed' or 'open', not {mode!r}")

