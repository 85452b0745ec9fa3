"""The `trace` block of a `plan --trace` answer
(docs/plan.md#your-own-traffic-chatfleet-plan---trace-file), kept as the plan's trace job
wrote it (jobs/plan_trace.py) and read through typed views:

```
trace        the trace (source, format, lines, turns, retries, sessions, span, window, time
             scale, doubling, API keys, priorities, what an importer left out), how it was
             cut (segment_s, lead_in_s, segments), the session profile read from it for the
             twin sweeps, the rule a fleet must meet, precisions, thermal
  precisions.NAME   cap, prefill reserve, and per traffic level (`target`, `doubled`) a
                    TraceLevel; the recommended one also its `band` (replicas at the error
                    band's edges) and `doubled_on_target_fleet`
  thermal           the card's clocks in the busiest hour at the answer (`cooling`), and
                    the fleet at the clock it holds (`held_clock`) when it throttles
```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chatfleet.core.documents.fields import View


class TraceLevel(View):
    """One traffic level's fleet and what the trace does on it: replicas (None: none found,
    `why_none`), whether every segment was replayed at it (`verified`), the search's
    judgements ([replicas, met]), the peak of open sessions and users per card there, the
    counts, the attainment (and the worst segment's), TTFT and TPOT p50/p99 in ms."""

    __slots__ = ()

    @property
    def replicas(self) -> int | None:
        v = self.fields.get("replicas")
        return None if v is None else int(v)

    @property
    def why_none(self) -> str | None:
        v = self.fields.get("why_none")
        return None if v is None else str(v)

    @property
    def verified(self) -> bool:
        return bool(self.fields.get("verified", False))

    @property
    def peak_users(self) -> int | None:
        v = self.fields.get("peak_users")
        return None if v is None else int(v)

    @property
    def users_per_card(self) -> int | None:
        v = self.fields.get("users_per_card")
        return None if v is None else int(v)

    @property
    def attainment(self) -> float | None:
        v = self.fields.get("attainment")
        return None if v is None else float(v)

    @property
    def search(self) -> list[tuple[int, bool]]:
        return [(int(r), bool(m)) for r, m in self.fields.get("search") or []]

    def figure(self, key: str, sub: str | None = None) -> float | None:
        v: Any = self.fields.get(key)
        if sub is not None:
            v = v.get(sub) if isinstance(v, Mapping) else None
        return None if v is None else float(v)


class TracePrecision(View):
    __slots__ = ()

    @property
    def cap(self) -> int | None:
        v = self.fields.get("cap")
        return None if v is None else int(v)

    def level(self, name: str) -> TraceLevel | None:
        v = self.fields.get(name)
        return None if not isinstance(v, Mapping) else TraceLevel(v)

    @property
    def band(self) -> Mapping[str, Any] | None:
        v = self.fields.get("band")
        return v if isinstance(v, Mapping) else None


class TraceAnswer(View):
    __slots__ = ()

    @property
    def source(self) -> str:
        return str(self.fields.get("source", ""))

    @property
    def precisions(self) -> dict[str, TracePrecision]:
        return {k: TracePrecision(v) for k, v in (self.fields.get("precisions") or {}).items()}

    @property
    def thermal(self) -> Mapping[str, Any] | None:
        v = self.fields.get("thermal")
        return v if isinstance(v, Mapping) else None
