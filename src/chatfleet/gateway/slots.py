"""A request's slot at a replica, with one owner from admission to release.

    async with Slot(admission, request, on_placed) as slot:
        if slot.shed: ...                      # slot.decision: 429 / 503, nothing held
        ...                                    # slot.replica: where it runs
        d = await slot.retry_elsewhere()       # it failed there before its first byte
    # released here, exactly once, whatever happened (a cancel included)

Acquiring is the core's admission (`LiveAdmission.acquire`: admitted, queued until a slot or the
deadline, or shed), and it is also the fleet-wide lease: with several gateways, this gateway's
core admits only inside the share of the replica's cap that Redis has confirmed to it
(shared.py), so a slot acquired is a slot the whole fleet has counted, with no second step
that could fail after the admission. `retry_elsewhere` hands the slot back to the core's
`requeue` (never the same replica again; its deadline kept); `on_placed` hears of every
replica the request is placed on (the shared session map).
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from chatfleet.core.fleet.admission import Decision, FleetRequest
from chatfleet.gateway.admission import LiveAdmission


class Slot:
    def __init__(self, admission: LiveAdmission, request: FleetRequest,
                 on_placed: Callable[[FleetRequest, str], None] | None = None) -> None:
        self.admission = admission
        self.request = request
        self.on_placed = on_placed
        self.decision: Decision | None = None
        self.replica: str | None = None
        self.held = False
        self.num_placed = 0

    @property
    def shed(self) -> bool:
        return self.decision is not None and self.decision.shed

    async def __aenter__(self) -> Slot:
        self._take(await self.admission.acquire(self.request))
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.release()

    async def retry_elsewhere(self) -> Decision:
        """The request failed at its replica before the first byte: back to admission (the
        core frees the slot there); admitted elsewhere, or shed, now or after waiting."""
        if not self.held or self.replica is None:
            raise RuntimeError("retry_elsewhere needs a held slot")
        self.held = False  # the core's requeue frees it
        self._take(await self.admission.requeue(self.request, self.replica))
        assert self.decision is not None
        return self.decision

    def release(self) -> None:
        """Give the slot back (once; a slot never held, or already given back, is a no-op)."""
        if self.held and self.replica is not None:
            self.held = False
            self.admission.release(self.replica, self.request.key)

    def _take(self, d: Decision) -> None:
        self.decision = d
        if d.admitted and d.replica is not None:
            self.replica, self.held = d.replica, True
            self.num_placed += 1
            if self.on_placed is not None:
                self.on_placed(self.request, d.replica)
