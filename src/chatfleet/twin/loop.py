"""The twin's event loop, in virtual time (Vidur's rule): handlers return new events, and only
the loop moves time."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

Handler = Callable[[Any, float], Iterable["Event"]]


@dataclass(order=True, slots=True)
class Event:
    time: float
    seq: int = field(compare=True)
    handler: Handler = field(compare=False)
    payload: Any = field(compare=False, default=None)


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Handler, Any]] = []
        self._seq = 0
        self.num_events = 0

    def at(self, time: float, handler: Handler, payload: Any = None) -> Event:
        """An event for `handler(payload, time)`; give it to `push` or return it from a handler."""
        self._seq += 1
        return Event(time, self._seq, handler, payload)

    def push(self, events: Iterable[Event]) -> None:
        for e in events:
            if e.time < self.now:
                raise ValueError(f"event at {e.time} is in the past (now {self.now})")
            heapq.heappush(self._heap, (e.time, e.seq, e.handler, e.payload))

    def run(self, until: float = float("inf")) -> None:
        heap = self._heap
        while heap and heap[0][0] <= until:
            t, _, handler, payload = heapq.heappop(heap)
            self.now = t
            self.num_events += 1
            out = handler(payload, t)
            if out:
                for e in out:
                    if e.time < t:
                        raise ValueError(f"handler scheduled an event in the past ({e.time} < {t})")
                    heapq.heappush(heap, (e.time, e.seq, e.handler, e.payload))
        if not heap:
            return
        self.now = max(self.now, until) if until != float("inf") else self.now

    def pending(self) -> int:
        return len(self._heap)
