"""The latency target, and the tolerance of every comparison against it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from chatfleet.core.errors import ChatfleetError

ItlStat = Literal["mean", "p99", "max"]
ITL_STATS: tuple[ItlStat, ...] = ("mean", "p99", "max")

# Tolerance of every SLO comparison, in milliseconds (1 ns): float rounding of a difference of
# times never flips a request that sits exactly on a limit.
TOLERANCE_MS = 1e-6


def _number(value: Any) -> float:
    """A number as read (an int stays an int, so a document writes back the same), else
    float(value)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return float(value)


@dataclass(frozen=True, slots=True)
class SLO:
    """The latency target.

    A request meets it when TTFT <= `ttft_ms` and its per-request time-per-token statistic
    <= `tpot_ms`. `itl_stat` names that statistic: `mean` is TPOT = (e2e - TTFT) /
    (output tokens - 1); `p99` is the 99th percentile of the request's own inter-token gaps;
    `max` its largest gap. `attainment` is the share of the window's requests that must meet it
    (0.99: the P99 user).
    """

    ttft_ms: float = 1000.0
    tpot_ms: float = 100.0
    itl_stat: ItlStat = "mean"
    attainment: float = 0.99

    def __post_init__(self) -> None:
        if self.itl_stat not in ITL_STATS:
            raise ChatfleetError(f"itl_stat must be one of {ITL_STATS}, not {self.itl_stat!r}")
        if not (self.ttft_ms > 0 and math.isfinite(self.ttft_ms)):
            raise ChatfleetError(f"ttft_ms must be a positive number, not {self.ttft_ms!r}")
        if not (self.tpot_ms > 0 and math.isfinite(self.tpot_ms)):
            raise ChatfleetError(f"tpot_ms must be a positive number, not {self.tpot_ms!r}")
        if not 0.0 < self.attainment <= 1.0:
            raise ChatfleetError(f"attainment must be in (0, 1], not {self.attainment!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "itl_stat": self.itl_stat,
            "attainment": self.attainment,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SLO:
        default = cls()
        return cls(
            ttft_ms=_number(data.get("ttft_ms", default.ttft_ms)),
            tpot_ms=_number(data.get("tpot_ms", default.tpot_ms)),
            itl_stat=cast(ItlStat, data.get("itl_stat", default.itl_stat)),
            attainment=_number(data.get("attainment", default.attainment)),
        )
