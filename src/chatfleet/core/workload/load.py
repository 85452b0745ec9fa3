"""Load: who sends the requests. A closed loop of N users (`ClosedLoop`), or sessions that
arrive on a schedule whatever the server does (`OpenLoop`); `driver_for` turns a load point
into its driver."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from chatfleet.core.documents.sweep import ClosedLoad, Load
from chatfleet.core.workload.config import WorkloadError
from chatfleet.core.workload.sessions import RequestSpec, Session, Workload


class ClosedLoop:
    """N users; each sends a turn, waits for its last token, thinks, sends the next turn; after
    its last turn it starts a new session. All start at once unless a ramp-up is asked for."""

    mode = "closed"

    def __init__(self, workload: Workload, users: int) -> None:
        if users <= 0:
            raise WorkloadError("concurrency must be at least 1")
        self.workload = workload
        self.users = users
        self.sessions: dict[int, Session] = {}

    def start(self) -> list[RequestSpec]:
        out = []
        ramp = self.workload.cfg.ramp_up_s
        for u in range(self.users):
            t = ramp * u / self.users if ramp else 0.0
            s = self.workload.new_session(u)
            self.sessions[u] = s
            out.append(self.workload.next_turn(s, t))
        return out

    def on_done(self, spec: RequestSpec, now: float) -> RequestSpec:
        """The user's next request, scheduled after its think time."""
        s = self.sessions[spec.user]
        think = self.workload.think_time(s)
        if s.turn >= self.workload.cfg.turns:
            s = self.workload.new_session(spec.user)
            self.sessions[spec.user] = s
        return self.workload.next_turn(s, now + think)


class OpenLoop:
    """Sessions arrive on a schedule whatever the server does: Poisson at `rate` per second,
    or gamma with burstiness B (shape B, mean 1 / rate; B < 1 is burstier, as in vLLM's
    bench). A session's later turns follow its previous answer after the think time."""

    mode = "open"

    def __init__(self, workload: Workload, rate: float, burstiness: float = 1.0,
                 arrival_times: Sequence[float] | None = None) -> None:
        """`arrival_times`, when given, is the trace of session arrivals (sorted, in
        seconds): sessions arrive exactly then, and `rate` only labels the load."""
        if rate <= 0:
            raise WorkloadError("arrival rate must be positive")
        if burstiness <= 0:
            raise WorkloadError("burstiness must be positive")
        if arrival_times is not None and any(
                b < a for a, b in itertools.pairwise(arrival_times)):
            raise WorkloadError("arrival times must be sorted")
        self.workload = workload
        self.rate = rate
        self.burstiness = burstiness
        self.arrival_times = list(arrival_times) if arrival_times is not None else None
        self._sessions: dict[str, Session] = {}
        self._users = 0

    def interarrival(self) -> float:
        rng = self.workload.rng
        if self.burstiness == 1.0:
            return rng.expovariate(self.rate)
        return rng.gammavariate(self.burstiness, 1.0 / (self.rate * self.burstiness))

    def next_arrival(self, now: float) -> RequestSpec:
        """A new session's first turn, arriving one inter-arrival time after `now` (or at
        the trace's next arrival time; after the trace's last, at infinity)."""
        if self.arrival_times is not None:
            i = self._users
            t = self.arrival_times[i] if i < len(self.arrival_times) else math.inf
        else:
            t = now + self.interarrival()
        s = self.workload.new_session(self._users)
        self._users += 1
        self._sessions[s.session_id] = s
        return self.workload.next_turn(s, t)

    def on_done(self, spec: RequestSpec, now: float) -> RequestSpec | None:
        s = self._sessions.get(spec.session_id)
        if s is None:
            return None
        if s.turn >= self.workload.cfg.turns:
            del self._sessions[spec.session_id]
            return None
        return self.workload.next_turn(s, now + self.workload.think_time(s))


def driver_for(load: Load, workload: Workload,
               arrival_times: Sequence[float] | None = None) -> ClosedLoop | OpenLoop:
    """The driver a load point names: a closed loop of `concurrency` users, or an open loop at
    `rate_rps` (gamma with shape `burstiness` where it is set, else Poisson); `arrival_times`
    makes an open loop follow a trace."""
    if isinstance(load, ClosedLoad):
        return ClosedLoop(workload, load.concurrency)
    burstiness = 1.0 if load.burstiness is None else float(load.burstiness)
    return OpenLoop(workload, float(load.rate_rps), burstiness, arrival_times)
