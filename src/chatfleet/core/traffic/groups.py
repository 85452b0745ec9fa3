"""A fleet of R replicas replayed in groups of k (`ReplicaGroups`): where the fleet core
lets its replicas run apart.

The gateway's router sends a session to its rendezvous home among the fleet's replicas and
keeps it there (core/fleet/routing.py): a session's home is uniform over the replicas and
independent of every other session's. It moves a session only when its home is full and a
spill pays, and one queue holds what no replica can take. So while a fleet meets its target
(nothing shed, almost nothing queued) each replica serves the sessions homed on it, whatever
the others do. The fleet is cut into groups of k replicas, each taking its share of the
sessions (a session goes to replica hash(session) mod R's group: uniform over the replicas,
as the rendezvous home is, at one hash per session where the home takes R) with its share of
the queue (k caps); inside a group the gateway's own router places them. Each group runs as a
fleet of its own, in bounded memory (one after another inside a replay task: the hours of the
trace and the candidate fleets are what the plan's workers run at once), and the fleet meets
the target when every group does. What is lost is the coupling between groups: a spill or a
queued request that another group would have taken. A group of k >= R is the whole fleet
(tests/traffic checks that the groups agree with it on traces it serves).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

GROUP_REPLICAS = 8  # k: each group a fleet of this many replicas (the last one fewer)


def replica_names(replicas: int) -> list[str]:
    """The fleet twin's replica names (rendezvous hashes them: a group keeps them)."""
    return [f"twin-{i}" for i in range(replicas)]


def session_hash(session: str) -> int:
    return int.from_bytes(hashlib.blake2b(session.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True, slots=True)
class ReplicaGroups:
    replicas: int
    size: int = GROUP_REPLICAS

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.size < 1:
            raise ValueError("a fleet needs replicas and groups at least 1")

    @property
    def count(self) -> int:
        return -(-self.replicas // self.size)

    def members(self, group: int) -> list[int]:
        return list(range(group * self.size, min(self.replicas, (group + 1) * self.size)))

    def of_sessions(self, sessions: Sequence[str]) -> list[int]:
        """Each session's group: replica hash(session) mod R's."""
        if self.replicas <= self.size:
            return [0] * len(sessions)
        return [session_hash(s) % self.replicas // self.size for s in sessions]
