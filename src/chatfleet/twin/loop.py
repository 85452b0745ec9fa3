"""The twin's event loop, in virtual time (Vidur's rule): handlers return new events, and only
the loop moves time.

While it runs, Python's cyclic garbage collector is paused (and restored after): a run
allocates some 10^5-10^6 small objects that live as long as the run (step rows, token times,
records), and the collector's passes over them cost about a tenth of a run while finding
almost nothing to free (the engine models hold no reference cycles; a run leaves a few
thousand cyclic objects, collected after it).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import Any

Handler = Callable[[Any, float], Iterable["Event"]]


# (time, seq, handler, payload): heap entries compare by (time, seq); seq is unique, so
# handlers are never compared. A plain tuple, not a NamedTuple, made once per event:
# chatfleet/_native.py says why.
Event = tuple[float, int, Handler, Any]


class EventLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[Event] = []
        self._seq = 0
        self.num_events = 0

    def at(self, time: float, handler: Handler, payload: Any = None) -> Event:
        """An event for `handler(payload, time)`; give it to `push` or return it from a handler."""
        self._seq += 1
        return (time, self._seq, handler, payload)

    def push(self, events: Iterable[Event]) -> None:
        for e in events:
            if e[0] < self.now:
                raise ValueError(f"event at {e[0]} is in the past (now {self.now})")
            heapq.heappush(self._heap, e)

    def run(self, until: float = float("inf")) -> None:
        with collector_paused():
            self._run(until)

    def _run(self, until: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= until:
            t, _, handler, payload = heapq.heappop(heap)
            self.now = t
            self.num_events += 1
            out = handler(payload, t)
            if out:
                for e in out:
                    if e[0] < t:
                        raise ValueError(f"handler scheduled an event in the past ({e[0]} < {t})")
                    heapq.heappush(heap, e)
        if not heap:
            return
        self.now = max(self.now, until) if until != float("inf") else self.now

    def pending(self) -> int:
        return len(self._heap)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector inside the block, as it was before after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
