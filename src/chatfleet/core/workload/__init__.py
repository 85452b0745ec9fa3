"""Workloads: shared system prompts, prompt groups, multi-turn sessions, length distributions,
closed-loop users and open-loop arrivals. Everything is seeded through a `random.Random`.

- `config`: `LengthSpec`, `WorkloadConfig` (the parameters and their checks), `SessionProfile`
  (what one user does, as the plan states it);
- `sessions`: `Workload` makes sessions and their turns as segments (`RequestSpec`), and
  `segment_tokens` turns segments into synthetic token ids;
- `load`: `ClosedLoop`, `OpenLoop` and `driver_for` (a load point to its driver);
- `ahead`: `TurnsAhead`, a run's turns listed before they are sent (by a shadow driver), and
  `turns_to_build` (how many of a closed-loop user's turns to list ahead).
"""

from chatfleet.core.workload.config import (
    GROUP_DRAWS,
    GroupDraw,
    LengthKind,
    LengthSpec,
    RangeConvention,
    SessionProfile,
    WorkloadConfig,
    WorkloadError,
)
from chatfleet.core.workload.load import ClosedLoop, OpenLoop, driver_for
from chatfleet.core.workload.sessions import (
    SYNTH_VOCAB,
    RequestSpec,
    Session,
    Workload,
    segment_tokens,
)

__all__ = [
    "GROUP_DRAWS",
    "SYNTH_VOCAB",
    "ClosedLoop",
    "GroupDraw",
    "LengthKind",
    "LengthSpec",
    "OpenLoop",
    "RangeConvention",
    "RequestSpec",
    "Session",
    "SessionProfile",
    "Workload",
    "WorkloadConfig",
    "WorkloadError",
    "driver_for",
    "segment_tokens",
]
