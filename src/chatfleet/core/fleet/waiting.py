"""The admission queue: the requests waiting for a slot, in the order they will be considered,
by id, with the earliest deadline kept up to date.

Order: by class (lower first), then requeued requests before the rest of their class, then
arrival order (`seq`, unique per placement in the queue). The admission controller (admission.py)
states who goes in and who leaves; this module only keeps the order and the figures that the
controller reads on every call: the earliest deadline (read at every dispatch and by the shell
to know when to call `expire`) and how many requests are ahead of a class or a key, which it
answers by bisection instead of a scan.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field

from chatfleet.core.fleet.request import FleetRequest

QueueKey = tuple[int, int, float]


@dataclass(slots=True, eq=False, init=False)
class Waiting:
    """One queued request. Compared by identity: two placements are never the same entry."""

    request: FleetRequest
    klass: int
    seq: int
    deadline: float
    target: str | None
    avoid: str | None  # requeued: the replica it failed on, which it never goes back to
    # its place in the queue: class, then requeued first, then seq (fixed: set once, read by
    # every bisection and every count of the requests ahead); derived, not an argument
    key: QueueKey = field(init=False)

    # __init__ written out (init=False): chatfleet/_native.py says why
    def __init__(self, request: FleetRequest, klass: int, seq: int, deadline: float,
                 target: str | None, avoid: str | None = None) -> None:
        self.request = request
        self.klass = klass
        self.seq = seq
        self.deadline = deadline
        self.target = target
        self.avoid = avoid
        self.key = (klass, 0 if avoid is not None else 1, seq)


_KEY = operator.attrgetter("key")
_KLASS = operator.attrgetter("klass")
_DEADLINE = operator.attrgetter("deadline")


class WaitQueue:
    """Waiting requests sorted by `Waiting.key`, by request id, and their earliest deadline.

    The earliest deadline is a cached minimum: an insert lowers it, a removal of the entry that
    held it marks it stale, and the next read recomputes it (with FCFS that entry is usually
    the head, and the queue is short). Tests compare it with the brute-force minimum after
    every change (tests/fleet/test_waiting.py).
    """

    def __init__(self) -> None:
        self._items: list[Waiting] = []
        self._by_id: dict[str, Waiting] = {}
        self._earliest = math.inf  # min deadline over _items, unless _stale
        self._stale = False

    # --- reads ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __iter__(self) -> Iterator[Waiting]:
        """In queue order. Do not change the queue while iterating (stop first)."""
        return iter(self._items)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def get(self, request_id: str) -> Waiting | None:
        return self._by_id.get(request_id)

    def last(self) -> Waiting | None:
        """The entry considered last (the one a full queue displaces)."""
        return self._items[-1] if self._items else None

    def earliest_deadline(self) -> float | None:
        """The earliest deadline of any waiting request; None when the queue is empty."""
        if not self._items:
            return None
        if self._stale:
            self._earliest = min(map(_DEADLINE, self._items))
            self._stale = False
        return self._earliest

    def num_up_to_class(self, klass: int) -> int:
        """Entries whose class is `klass` or lower (a new request of that class waits behind
        them all)."""
        return bisect.bisect_right(self._items, klass, key=_KLASS)

    def num_before(self, key: QueueKey) -> int:
        """Entries whose key sorts before `key`."""
        return bisect.bisect_left(self._items, key, key=_KEY)

    # --- changes ------------------------------------------------------------------------------
    def insert(self, waiting: Waiting) -> None:
        """Place `waiting` by its key (keys are unique: `seq` is)."""
        bisect.insort(self._items, waiting, key=_KEY)
        self._by_id[waiting.request.request_id] = waiting
        if waiting.deadline < self._earliest:
            self._earliest = waiting.deadline  # a stale figure stays stale: it is recomputed

    def remove(self, waiting: Waiting) -> None:
        """Take `waiting` (which must be queued) out of the queue."""
        i = bisect.bisect_left(self._items, waiting.key, key=_KEY)
        if i == len(self._items) or self._items[i] is not waiting:
            raise ValueError(f"request {waiting.request.request_id!r} is not queued")
        del self._items[i]
        del self._by_id[waiting.request.request_id]
        self._forgot(waiting)

    def pop(self, request_id: str) -> Waiting | None:
        """Take the request out by id; None when it is not queued."""
        waiting = self._by_id.get(request_id)
        if waiting is not None:
            self.remove(waiting)
        return waiting

    def pop_last(self) -> Waiting:
        """Take out the entry considered last."""
        waiting = self._items.pop()
        del self._by_id[waiting.request.request_id]
        self._forgot(waiting)
        return waiting

    def set_deadline(self, waiting: Waiting, deadline: float) -> None:
        """Move a queued entry's deadline (a learned reserve changed, or its target did)."""
        old = waiting.deadline
        if deadline == old:
            return
        waiting.deadline = deadline
        if deadline < self._earliest:
            self._earliest = deadline
        elif old <= self._earliest:
            self._stale = True  # it held the minimum and moved later

    def keep_only(self, kept: list[Waiting]) -> None:
        """Replace the queue by `kept`, entries of it in queue order (the others leave)."""
        self._items = kept
        self._by_id = {w.request.request_id: w for w in kept}
        self._earliest = min(map(_DEADLINE, kept), default=math.inf)
        self._stale = False

    def _forgot(self, waiting: Waiting) -> None:
        if not self._items:
            self._earliest, self._stale = math.inf, False
        elif waiting.deadline <= self._earliest:
            self._stale = True
