"""Parked capacity waits, bookkeeping only (controlplane.scheduling.parking): who is woken by
what, and which outcome counts as the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlplane.scheduling.parking import Parking

NOW = datetime(2026, 6, 24, 10, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def parked(clock: Clock | None = None) -> Parking:
    p = Parking(clock or Clock(), recheck_s=30.0)
    p.park(1, accounts={"runway:a"}, full={"c1"}, breakers=(), catalog_version="v1")
    p.park(2, accounts={"google:b"}, full={"c2"}, breakers={"c3"}, catalog_version="v1")
    return p


def test_a_release_wakes_only_the_tasks_parked_on_that_account() -> None:
    """Slots back in one account wake its waiters and nobody else."""
    p = parked()
    assert p.freed("runway:a") == 1
    assert 1 not in p
    assert 2 in p
    assert p.freed("runway:a") == 0  # nothing parked there any more


def test_a_breaker_recovery_and_a_new_catalog_wake_their_waiters() -> None:
    """A recovered breaker wakes the tasks it refused; a new catalog version wakes everyone
    parked under another one."""
    p = parked()
    assert p.breaker_moved("c3") == 1
    assert 2 not in p
    p.park(2, accounts={"google:b"}, full={"c2"}, breakers=(), catalog_version="v1")
    assert p.catalog_changed("v1") == 0
    assert p.catalog_changed("v2") == 2
    assert len(p) == 0


def test_the_rounds_reads_wake_what_reads_differently() -> None:
    """The safety net: a full candidate with room now, or a breaker that refuses no more."""
    p = parked()
    assert p.wake_changed(lambda cid: False, {"c3": "OPEN"}, "v1") == 0
    assert p.wake_changed(lambda cid: cid == "c1", {"c3": "OPEN"}, "v1") == 1
    assert p.wake_changed(lambda cid: False, {}, "v1") == 1  # c3 closed
    assert len(p) == 0


def test_a_parked_task_is_due_at_its_backoff_end_or_the_recheck() -> None:
    """`waiting` holds a task back until its retry backoff ends or recheck_s passed."""
    clock = Clock()
    p = Parking(clock, recheck_s=30.0)
    later = NOW + timedelta(seconds=5)
    p.park(7, accounts=(), full=(), breakers=(), catalog_version="v1", until=later)
    assert p.waiting(7, NOW)
    assert not p.waiting(7, later)  # due: unparked
    p.park(8, accounts=(), full={"c1"}, breakers=(), catalog_version="v1")
    assert p.waiting(8, NOW)
    clock.now += 30.0
    assert not p.waiting(8, NOW)
    assert not p.waiting(99, NOW)  # never parked


def test_outcomes_are_remembered_until_the_task_is_done() -> None:
    """The last stored outcome stays across wakes (no second row for the same wait) and is
    forgotten when the task leaves the queue."""
    p = parked()
    sig = ("NO_CAPACITY", (("c1", "NO_CAPACITY"),))
    p.stored(1, sig)
    p.freed("runway:a")
    assert p.outcome(1) == sig
    p.done(1)
    assert p.outcome(1) is None


def test_a_task_parked_on_a_window_waits_for_its_reopening_not_for_releases() -> None:
    """A window wait is not woken by a release nor by rounds before the reopening, and is
    routed again once the (monotonic) reopening passes."""
    clock = Clock()
    p = Parking(clock, recheck_s=30.0)
    p.park(7, accounts=(), full=(), breakers=(), catalog_version="v1", reopens=clock.now + 2.5)
    assert p.freed("runway:a") == 0
    assert p.wake_changed(lambda cid: True, {}, "v1") == 0
    assert p.waiting(7, NOW)
    clock.now += 2.5
    assert not p.waiting(7, NOW)
    assert 7 not in p
