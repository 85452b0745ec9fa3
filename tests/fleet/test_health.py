"""Replica health: consecutive failures eject, consecutive probe successes readmit."""

from __future__ import annotations

import pytest

from chatfleet.core.fleet.health import ReplicaHealth


def test_consecutive_failures_eject_and_a_success_resets_the_count() -> None:
    h = ReplicaHealth(eject_after_failures=3, readmit_after_successes=2)
    assert h.failure() is None and h.failure() is None
    assert h.success() is None  # resets
    assert h.failure() is None and h.failure() is None
    assert h.failure() == "ejected"
    assert h.ejected and h.num_ejections == 1
    assert h.failure() is None  # already out


def test_an_ejected_replica_returns_after_consecutive_successes() -> None:
    h = ReplicaHealth(eject_after_failures=1, readmit_after_successes=3)
    assert h.failure() == "ejected"
    assert h.success() is None and h.success() is None
    assert h.failure() is None  # a failure restarts the count
    assert h.success() is None and h.success() is None
    assert h.success() == "readmitted"
    assert not h.ejected
    assert h.failure() == "ejected" and h.num_ejections == 2


def test_thresholds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ReplicaHealth(eject_after_failures=0)
    with pytest.raises(ValueError):
        ReplicaHealth(readmit_after_successes=0)


def test_a_pending_replica_is_serving_only_after_its_first_probe_success() -> None:
    h = ReplicaHealth(eject_after_failures=1, readmit_after_successes=3, pending=True)
    assert not h.serving and not h.ejected
    # not up yet: failures count nothing (it was never in, so it cannot be ejected)
    assert h.failure() is None and h.failure() is None
    assert h.pending and h.num_ejections == 0
    # one success is enough: readmit_after_successes is for bringing an ejected one back
    assert h.success() == "ready"
    assert h.serving and not h.pending
    assert h.success() is None
    assert h.failure() == "ejected" and not h.serving
