"""Replica health: when to eject a replica and when to bring it back.

States: pending (never passed a probe), serving, ejected. Only a serving replica takes
requests.

Rules:
- A replica the shell does not know to be up yet (at start-up, or added at run time) starts
  pending (`pending=True`): it is only probed, and its first probe success makes it serving
  ("ready"). Failures while pending count nothing (it was never in).
- Every outcome is reported: a probe's or a request's success, or a failure (refused or reset
  connection, a 5xx, a timeout, a stream cut).
- A serving replica is ejected after `eject_after_failures` consecutive failures; a success
  resets the count.
- An ejected replica is only probed (no requests reach it). It returns after
  `readmit_after_successes` consecutive probe successes; a failure resets that count.

Pure: the shell (the gateway, or the twin) reports outcomes and acts on the transitions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from chatfleet.core.errors import ChatfleetError

Transition = Literal["ready", "ejected", "readmitted"]


@dataclass(slots=True)
class ReplicaHealth:
    eject_after_failures: int = 3
    readmit_after_successes: int = 2
    ejected: bool = False
    num_consecutive_failures: int = 0
    num_consecutive_successes: int = 0
    num_ejections: int = 0
    pending: bool = False  # never passed a probe: no requests until the first success

    def __post_init__(self) -> None:
        if self.eject_after_failures < 1 or self.readmit_after_successes < 1:
            raise ChatfleetError("eject_after_failures and readmit_after_successes must be >= 1")

    @property
    def serving(self) -> bool:
        return not self.pending and not self.ejected

    def success(self) -> Transition | None:
        self.num_consecutive_failures = 0
        if self.pending:
            self.pending = False
            return "ready"
        if not self.ejected:
            return None
        self.num_consecutive_successes += 1
        if self.num_consecutive_successes >= self.readmit_after_successes:
            self.ejected = False
            self.num_consecutive_successes = 0
            return "readmitted"
        return None

    def failure(self) -> Transition | None:
        self.num_consecutive_successes = 0
        if self.ejected or self.pending:
            return None
        self.num_consecutive_failures += 1
        if self.num_consecutive_failures >= self.eject_after_failures:
            self.ejected = True
            self.num_consecutive_failures = 0
            self.num_ejections += 1
            return "ejected"
        return None
