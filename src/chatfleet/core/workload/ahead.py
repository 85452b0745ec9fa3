"""The turns a run will send, listed before they are sent (`TurnsAhead`), and how many of a
closed-loop user's turns to list before its clock starts (`turns_to_build`).

A session draws its lengths and think times from its own generator, seeded from the
workload's seed, the user and the user's session count, and is named the same way ("s3.2"); an
open loop's arrivals draw only from the workload's own generator. So what a closed-loop user
sends next (the session, the turn, the user message's length) does not depend on when the
other users finish, and an open loop's sessions are known from the seed alone. `TurnsAhead`
drives a shadow of the run's driver (the same config, the same seed) to list them:

- closed loop: one stream per user, that user's turns in the order it sends them, without end;
- open loop: one stream, the sessions that arrive before the window ends in arrival order,
  each with all its turns (a later turn the run does not send, because it would start after
  the window, is listed anyway).

What the shadow cannot know is what depends on the order of completions: the segment ids and
request ids the workload allocates as turns are made, and a session's round-robin prompt
group. A turn is therefore named by (session id, turn), never by its segment ids.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from chatfleet.core.documents.sweep import ClosedLoad, Load, SweepPoint
from chatfleet.core.workload.config import WorkloadConfig
from chatfleet.core.workload.load import ClosedLoop, OpenLoop, driver_for
from chatfleet.core.workload.sessions import RequestSpec, Workload

# A turn asked for that the shadow has not listed yet is looked for this many turns further on
# at most: a live run follows the shadow, and each send lists its stream's next turns, so a
# run's turn is listed before it is sent (or found at once); one the shadow never makes is
# not looked for without end.
SEARCH_LIMIT = 64
# A user's pace so far may be slower than its pace to come (its first turns prefilled a cold
# cache): the turns it may still send are counted half again over.
PACE_MARGIN = 1.5


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a run, as known ahead: its session, its turn in the session and the
    tokens of its user message (the request's last segment)."""

    session_id: str
    turn: int
    user_tokens: int

    @classmethod
    def of(cls, spec: RequestSpec) -> Turn:
        return cls(spec.session_id, spec.turn, spec.segments[-1][1])


class TurnsAhead:
    """The turns of one run (`cfg`, `seed`, `load`, sends before `window_end`), listed by a
    shadow driver as they are asked for: `first` before the clock starts, `following` as
    each request is sent."""

    def __init__(self, cfg: WorkloadConfig, seed: int, load: Load, window_end: float) -> None:
        self._driver = driver_for(load, Workload(cfg, random.Random(seed)))
        self.window_end = window_end
        self._listed: list[list[Turn]] = []
        self._where: dict[tuple[str, int], tuple[int, int]] = {}  # (stream, position)
        # per stream, the next request to list (None: the stream has ended)
        self._next: list[RequestSpec | None] = []
        self._last_arrival = 0.0  # open loop: the time of the last session listed
        self._start: list[float] = []  # closed loop: each user's first send (its ramp-up)
        if isinstance(self._driver, ClosedLoop):
            firsts = self._driver.start()
            self._next = list(firsts)
            self._start = [spec.scheduled_time for spec in firsts]
        else:
            first = self._driver.next_arrival(0.0)
            self._last_arrival = first.scheduled_time
            self._next = [first if first.scheduled_time < window_end else None]
        self._listed = [[] for _ in self._next]

    @property
    def streams(self) -> int:
        """Closed loop: one per user; open loop: one."""
        return len(self._next)

    def _advance(self, stream: int) -> bool:
        """List the stream's next turn; False when it has ended."""
        spec = self._next[stream]
        if spec is None:
            return False
        turn = Turn.of(spec)
        self._where[(turn.session_id, turn.turn)] = (stream, len(self._listed[stream]))
        self._listed[stream].append(turn)
        driver = self._driver
        if isinstance(driver, ClosedLoop):
            self._next[stream] = driver.on_done(spec, 0.0)
        else:
            self._next[stream] = self._open_next(driver, spec)
        return True

    def _open_next(self, driver: OpenLoop, spec: RequestSpec) -> RequestSpec | None:
        """The session's next turn, else the next session's first turn if it arrives before
        the window ends (drawn from the last arrival's time, as the live drive draws it)."""
        nxt = driver.on_done(spec, spec.scheduled_time)
        if nxt is not None:
            return nxt
        arrival = driver.next_arrival(self._last_arrival)
        self._last_arrival = arrival.scheduled_time
        return arrival if arrival.scheduled_time < self.window_end else None

    def turns(self, stream: int, count: int) -> list[Turn]:
        """The stream's first `count` turns (fewer where it ends sooner)."""
        listed = self._listed[stream]
        while len(listed) < count and self._advance(stream):
            pass
        return listed[:count]

    def first(self, per_stream: int | None) -> list[Turn]:
        """The first `per_stream` turns of every stream (None: all of them, for an open loop;
        a closed loop's streams have no end), in the order they are needed: every stream's
        first turn, then every stream's second, and so on."""
        if per_stream is None and isinstance(self._driver, ClosedLoop):
            raise ValueError("a closed loop's users send without end: give a number of turns "
                             "per user")
        columns = [self._all(s) if per_stream is None else self.turns(s, per_stream)
                   for s in range(self.streams)]
        depth = max((len(c) for c in columns), default=0)
        return [c[k] for k in range(depth) for c in columns if k < len(c)]

    def _all(self, stream: int) -> list[Turn]:
        while self._advance(stream):
            pass
        return list(self._listed[stream])

    def stream_of(self, spec: RequestSpec) -> int:
        return spec.user if isinstance(self._driver, ClosedLoop) else 0

    def following(self, spec: RequestSpec, count: int) -> list[Turn]:
        """The `count` turns that follow `spec`'s in its stream, fewer where a closed-loop
        user will not send that many before the window ends (`still_to_send`); empty when
        `spec` is not one of the run's (the shadow never listed it)."""
        stream = self.stream_of(spec)
        if not 0 <= stream < self.streams:
            return []
        key = (spec.session_id, spec.turn)
        searched = 0
        while key not in self._where and searched < SEARCH_LIMIT and self._advance(stream):
            searched += 1
        where = self._where.get(key)
        if where is None or where[0] != stream:
            return []
        position = where[1]
        still = self.still_to_send(spec, position)
        if still is not None:
            count = min(count, still)
        return self.turns(stream, position + 1 + count)[position + 1:]

    def still_to_send(self, spec: RequestSpec, position: int) -> int | None:
        """How many turns a closed-loop user may still send after `spec` (the `position`-th
        turn of its stream) before the window ends, at its own pace so far (the time since its
        first turn over the turns since), with `PACE_MARGIN` and one turn on top; None before
        it has a pace (its first turn) and for an open loop."""
        if not isinstance(self._driver, ClosedLoop) or position == 0:
            return None
        elapsed = spec.scheduled_time - self._start[spec.user]
        if elapsed <= 0:
            return None
        left = (self.window_end - spec.scheduled_time) * position / elapsed
        return max(0, math.ceil(left * PACE_MARGIN)) + 1

    def knows(self, spec: RequestSpec) -> bool:
        """Whether the shadow listed `spec`'s turn, with the same user message length."""
        where = self._where.get((spec.session_id, spec.turn))
        return (where is not None
                and self._listed[where[0]][where[1]].user_tokens == spec.segments[-1][1])


def turns_to_build(load: Load, window_end: float, done: Sequence[SweepPoint],
                   margin: float = 1.25, extra: int = 2) -> int | None:
    """How many turns of each closed-loop user to build before the clock starts: the turns a
    user sends before `window_end`, estimated from the sweep's finished closed-loop points
    (None for an open loop, whose sessions are all known, or when no point can tell).

    A user's cycle (one send to its next) is users / request_rps over a point's window
    (Little's law: each user has one request in flight or is thinking). It grows with the
    load, so the finished point of the most users at or under `load` bounds the turns from
    above; without one, the point of the fewest users above it gives an estimate that may fall
    short (the run's lookahead builds the rest). `margin` and `extra` turns on top."""
    if not isinstance(load, ClosedLoad):
        return None
    users = load.concurrency
    known = [p for p in done if isinstance(p.load, ClosedLoad) and p.request_rps > 0]
    under = [p for p in known if p.load.value <= users]
    above = [p for p in known if p.load.value > users]
    if under:
        point = max(under, key=lambda p: (p.load.value, p.request_rps))
    elif above:
        point = min(above, key=lambda p: (p.load.value, -p.request_rps))
    else:
        return None
    per_user_rps = point.request_rps / point.load.value
    return math.ceil(window_end * per_user_rps * margin) + extra
